package testimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

func TestArchiveDeterministic(t *testing.T) {
	bb, err := Busybox()
	if err != nil {
		t.Skip(err)
	}
	a, err := Build(bb)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(bb)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two builds from the same busybox differ")
	}
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(a))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		files[h.Name] = data
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v %s", err, files["manifest.json"])
	}
	if manifest[0].RepoTags[0] != Ref || files[manifest[0].Config] == nil || len(manifest[0].Layers) != 1 {
		t.Fatalf("manifest %+v", manifest)
	}
	layer := map[string]*tar.Header{}
	lr := tar.NewReader(bytes.NewReader(files[manifest[0].Layers[0]]))
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		layer[h.Name] = h
	}
	for _, name := range []string{"bin/busybox", "bin/sh", "bin/cat", "bin/sleep", "bin/kill", "bin/stty", "bin/head", "bin/grep", "etc/passwd", "etc/group", "tmp/"} {
		if layer[name] == nil {
			t.Errorf("layer lacks %s", name)
		}
	}
	if h := layer["tmp/"]; h != nil && h.Mode&0o1777 != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", h.Mode)
	}
}

// TestDockerLoadRun loads the archive with `docker load` and runs a container from it.
func TestDockerLoadRun(t *testing.T) {
	host := RequireEngine(t)
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("no docker CLI: ", err)
	}
	a, err := Archive()
	if err != nil {
		t.Fatal(err)
	}
	load := exec.Command("docker", "-H", host, "load")
	load.Stdin = bytes.NewReader(a)
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("docker load: %v\n%s", err, out)
	} else if !strings.Contains(string(out), Ref) {
		t.Errorf("docker load said %q, want it to name %s", out, Ref)
	}
	out, err := exec.Command("docker", "-H", host, "run", "--rm", "--network", "none", Ref, "sh", "-c", "echo ok; id -u; stat -c %a /tmp").CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	if got := string(out); got != "ok\n0\n1777\n" {
		t.Errorf("docker run printed %q, want \"ok\\n0\\n1777\\n\"", got)
	}
	out, err = exec.Command("docker", "-H", host, "run", "--rm", "--network", "none", "--user", "user", Ref, "id").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "uid=1234(user) gid=1234(user)") {
		t.Errorf("docker run --user user id: %v %q", err, out)
	}
}
