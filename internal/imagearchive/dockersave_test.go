package imagearchive

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

func members(t *testing.T, data []byte) (names []string, hdrs map[string]*tar.Header, files map[string][]byte) {
	t.Helper()
	hdrs, files = map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		names = append(names, h.Name)
		hdrs[h.Name], files[h.Name] = h, b
	}
}

// TestLayer: entries come out in order with their types, modes and owners, dated
// Epoch; names that are absolute or leave the root are refused.
func TestLayer(t *testing.T) {
	l, err := Layer([]Entry{
		{Name: "bin", Mode: 0o755, Dir: true},
		{Name: "bin/tool", Mode: 0o755, Data: []byte("x")},
		{Name: "bin/sh", Mode: 0o777, Link: "tool"},
		{Name: "home/u", Mode: 0o700, UID: 1234, Dir: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	names, h, files := members(t, l)
	if strings.Join(names, " ") != "bin/ bin/tool bin/sh home/u/" {
		t.Fatalf("members %v", names)
	}
	if h["bin/tool"].Typeflag != tar.TypeReg || string(files["bin/tool"]) != "x" || h["bin/sh"].Linkname != "tool" ||
		h["home/u/"].Uid != 1234 || h["home/u/"].Mode != 0o700 || !h["bin/"].ModTime.Equal(Epoch) || h["bin/"].Uname != "root" {
		t.Errorf("headers: %+v %+v %+v", h["bin/tool"], h["bin/sh"], h["home/u/"])
	}
	for _, bad := range []string{"", "/etc/passwd", "../x", "a/../../x"} {
		if _, err := Layer([]Entry{{Name: bad, Mode: 0o644}}); err == nil {
			t.Errorf("Layer with the name %q: no error", bad)
		}
	}
}

// TestArchive: the archive names its one image by ref in manifest.json and
// repositories, its config holds the command, and the same input gives the same
// bytes; a ref without a tag is refused, a registry port is not taken for a tag.
func TestArchive(t *testing.T) {
	l, _ := Layer([]Entry{{Name: "pause", Mode: 0o755, Data: []byte("bin")}})
	cfg := Config{Entrypoint: []string{"/pause"}, CreatedBy: "test"}
	a, err := Archive("localhost:5000/pause:3.10", l, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Archive("localhost:5000/pause:3.10", l, cfg)
	if !bytes.Equal(a, b) {
		t.Error("two archives of the same image differ")
	}
	_, _, files := members(t, a)
	var m []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &m); err != nil || len(m) != 1 || m[0].RepoTags[0] != "localhost:5000/pause:3.10" {
		t.Fatalf("manifest.json %s: %v", files["manifest.json"], err)
	}
	if !bytes.Equal(files[m[0].Layers[0]], l) {
		t.Error("the layer in the archive is not the layer given")
	}
	var c struct {
		Config struct {
			Entrypoint, Cmd, Env []string
			WorkingDir           string
		}
	}
	if err := json.Unmarshal(files[m[0].Config], &c); err != nil {
		t.Fatal(err)
	}
	if c.Config.Entrypoint[0] != "/pause" || c.Config.Cmd != nil || c.Config.Env[0] != DefaultPath || c.Config.WorkingDir != "/" {
		t.Errorf("config %+v", c.Config)
	}
	if !strings.Contains(string(files["repositories"]), `"localhost:5000/pause":{"3.10"`) {
		t.Errorf("repositories %s", files["repositories"])
	}
	for _, bad := range []string{"pause", "localhost:5000/pause", "pause:", ":1"} {
		if _, err := Archive(bad, l, cfg); err == nil || !strings.Contains(err.Error(), "NAME:TAG") {
			t.Errorf("Archive(%q): %v, want a refusal saying NAME:TAG", bad, err)
		}
	}
}
