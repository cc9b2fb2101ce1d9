package main

import (
	"encoding/json"
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
