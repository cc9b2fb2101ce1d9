package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-sh/berth/internal/testimage"
)

// TestConformanceDockerImportsImage: `berth conformance --driver docker` needs nothing
// but an engine: without --image it imports berth's busybox test image through the
// driver and runs the cases in it.
func TestConformanceDockerImportsImage(t *testing.T) {
	testimage.RequireEngine(t)
	t.Parallel()
	e := newEnv(t)
	r := e.run("conformance", "--driver", "docker", "--run", "^(exec/exit-code-43|isolation/network-none-only-lo)$", "--json")
	if r.code != 0 {
		t.Fatalf("want exit 0\n%v", r)
	}
	var rep struct {
		Driver                  string
		Passed, Failed, Skipped int
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("report: %v\n%v", err, r)
	}
	if rep.Driver != "docker" || rep.Passed != 2 || rep.Failed != 0 || rep.Skipped != 0 {
		t.Errorf("report %+v, want docker with 2 passed\n%v", rep, r)
	}
}

// TestImageImport: `berth image import FILE` loads a docker save archive into the
// docker driver and prints its references; a driver without an image store and a
// missing file are berth errors (125).
func TestImageImport(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if r := e.run("image", "import", "--driver", "local", "/nonexistent.tar"); r.code != 125 || !strings.Contains(r.stderr, "/nonexistent.tar") {
		t.Errorf("missing file: want 125 naming it\n%v", r)
	}
	archive, err := testimage.Archive()
	if err != nil {
		t.Fatal(err)
	}
	path := e.writeFile("busybox.tar", string(archive))
	if r := e.run("image", "import", "--driver", "local", path); r.code != 125 || !strings.Contains(r.stderr, "cannot import images") {
		t.Errorf("local: want 125 saying it cannot import\n%v", r)
	}
	testimage.RequireEngine(t)
	r := e.run("image", "import", path) // --driver docker is the default
	if r.code != 0 || strings.TrimSpace(r.stdout) != testimage.Ref {
		t.Errorf("want exit 0 and %s on stdout\n%v", testimage.Ref, r)
	}
}
