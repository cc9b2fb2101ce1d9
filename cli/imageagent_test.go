package cli

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
)

// readArchive returns the contents of the members of the tar data by name.
func readArchive(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

// TestImageAgent: berth image agent writes a docker save archive whose one layer holds
// this very berth as /berth-agent (mode 0755), tagged with the binary's hash and with
// "/berth-agent install" as its entrypoint; --ref names it otherwise, a ref without a
// tag and a missing -o are usage errors that write nothing; and `berth agent install
// DIR`, the entrypoint, copies the binary into DIR.
func TestImageAgent(t *testing.T) {
	e := newEnv(t)
	bin, err := os.ReadFile(testbin.CLI(berthBin))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bin)
	wantRef := "localhost/berth-agent:" + hex.EncodeToString(sum[:])[:12]
	out := filepath.Join(e.dir, "agent.tar")
	if r := e.must("image", "agent", "-o", out); strings.TrimSpace(r.stdout) != wantRef {
		t.Fatalf("berth image agent printed %q, want %q", r.stdout, wantRef)
	}
	a, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	files := readArchive(t, a)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 || len(manifest[0].Layers) != 1 {
		t.Fatalf("manifest.json %s: %v", files["manifest.json"], err)
	}
	if got := manifest[0].RepoTags; len(got) != 1 || got[0] != wantRef {
		t.Errorf("RepoTags %v, want [%s]", got, wantRef)
	}
	var cfg struct {
		Config struct{ Entrypoint, Cmd []string }
	}
	if err := json.Unmarshal(files[manifest[0].Config], &cfg); err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.Config.Entrypoint, " ") != "/berth-agent install" {
		t.Errorf("entrypoint %q, want /berth-agent install", cfg.Config.Entrypoint)
	}
	lr := tar.NewReader(bytes.NewReader(files[manifest[0].Layers[0]]))
	found := false
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "berth-agent" {
			b, _ := io.ReadAll(lr)
			found = bytes.Equal(b, bin) && h.Mode == 0o755 && h.Typeflag == tar.TypeReg
		}
	}
	if !found {
		t.Error("the layer has no berth-agent with this berth's bytes and mode 0755")
	}

	if r := e.must("image", "agent", "-o", "-", "--ref", "registry.example.com:5000/agent:v1"); !bytes.Contains([]byte(r.stdout), []byte("registry.example.com:5000/agent:v1")) || !strings.Contains(r.stderr, "registry.example.com:5000/agent:v1") {
		t.Errorf("--ref: the archive on stdout or the ref on stderr lacks the reference (stderr %q)", r.stderr)
	}
	for _, args := range [][]string{
		{"image", "agent", "-o", filepath.Join(e.dir, "bad.tar"), "--ref", "registry.example.com:5000/agent"},
		{"image", "agent"},
	} {
		r := e.run(args...)
		if r.code != execrun.ExitInternal || !strings.Contains(r.stderr, "berth image agent") {
			t.Errorf("berth %v: exit %d, stderr %q; want a usage error (exit %d)", args, r.code, r.stderr, execrun.ExitInternal)
		}
	}
	if _, err := os.Stat(filepath.Join(e.dir, "bad.tar")); !os.IsNotExist(err) {
		t.Errorf("a refused berth image agent left its output: %v", err)
	}

	dir := filepath.Join(e.dir, "emptydir")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e.must("agent", "install", dir)
	got, err := os.ReadFile(filepath.Join(dir, "berth-agent"))
	if fi, serr := os.Stat(filepath.Join(dir, "berth-agent")); err != nil || serr != nil || !bytes.Equal(got, bin) || fi.Mode().Perm() != 0o755 {
		t.Errorf("berth agent install %s: the copy differs from berth or is not mode 0755 (%v)", dir, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("berth agent install left %d entries in %s, want 1 (no temporary file)", len(entries), dir)
	}
	if r := e.run("agent", "install", filepath.Join(e.dir, "missing")); r.code != 1 || !strings.Contains(r.stderr, "not an existing directory") {
		t.Errorf("berth agent install of a missing dir: exit %d, stderr %q", r.code, r.stderr)
	}
}
