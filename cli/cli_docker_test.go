package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testregistry"
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

// TestExecPullsImage: a session whose rule names an image the engine lacks pulls it
// before its sandbox is created, showing progress on stderr: plain lines with bytes and
// percentages when stderr is not a terminal, JSON lines under --json; pull = "never"
// refuses instead, leaving no session. `berth image pull` pulls on demand.
func TestExecPullsImage(t *testing.T) {
	host := testimage.RequireEngine(t)
	t.Parallel()
	reg := testregistry.Start(t, testregistry.Options{})
	plain := reg.Push(t, host, "berth-test/cli:plain")
	asJSON := reg.Push(t, host, "berth-test/cli:json")
	never := reg.Push(t, host, "berth-test/cli:never")
	ahead := reg.Push(t, host, "berth-test/cli:ahead")
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", fmt.Sprintf(`
scope "plain:*" {
  driver = "docker"
  image  = %q
}
scope "json:*" {
  driver = "docker"
  image  = %q
  pull   = "always"
}
scope "never:*" {
  driver = "docker"
  image  = %q
  pull   = "never"
}
`, plain, asJSON, never))

	r := e.run("exec", "-s", "never:1", "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, `pull = "never"`) || !strings.Contains(r.stderr, never) {
		t.Errorf("pull never of an absent image: want 125 naming the image and the policy\n%v", r)
	}
	if rows := e.sessions(); len(rows) != 0 {
		t.Errorf("a refused pull left sessions %v", rows)
	}

	r = e.run("exec", "-s", "plain:1", "--", "cat", "/etc/berth-variant")
	if r.code != 0 || !strings.Contains(r.stdout, "TestExecPullsImage") {
		t.Fatalf("exec in a pulled image: want exit 0 and the image's marker file\n%v", r)
	}
	if !strings.Contains(r.stderr, "pulling "+plain+" for session plain:1 (driver docker)") ||
		!strings.Contains(r.stderr, "Pull complete") || !strings.Contains(r.stderr, "(100%)") || strings.Contains(r.stderr, "\x1b") {
		t.Errorf("plain progress: want a header, per-layer lines with percentages and no terminal codes\n%v", r)
	}
	if n := strings.Count(r.stderr, "\n"); n > 20 {
		t.Errorf("plain progress took %d lines, want few\n%v", n, r)
	}
	r = e.run("exec", "-s", "plain:1", "--", "true")
	if r.code != 0 || r.stderr != "" {
		t.Errorf("second exec in the session: want no pull and an empty stderr\n%v", r)
	}

	r = e.run("exec", "-s", "json:1", "--json", "--", "true")
	var res struct {
		ExitCode int `json:"exit_code"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.ExitCode != 0 {
		t.Fatalf("exec --json in a pulled image\n%v", r)
	}
	sawBytes := false
	for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		var ev struct {
			Event, Session, Driver, Image, Layer, Status string
			Current, Total                               int64
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Event != "pull" || ev.Session != "json:1" || ev.Image != asJSON || ev.Driver != "docker" {
			t.Fatalf("stderr line %q is not a pull event of json:1 (%v)\n%v", line, err, r)
		}
		sawBytes = sawBytes || ev.Layer != "" && ev.Total > 0
	}
	if !sawBytes {
		t.Errorf("no JSON pull event with a layer's byte total\n%v", r)
	}

	r = e.run("image", "pull", ahead)
	if r.code != 0 || !strings.Contains(r.stderr, "Pull complete") {
		t.Errorf("berth image pull: want exit 0 and progress\n%v", r)
	}
	if r := e.run("image", "pull", "--driver", "local", ahead); r.code != 125 || !strings.Contains(r.stderr, "cannot pull images") {
		t.Errorf("berth image pull on local: want 125 saying it cannot pull\n%v", r)
	}
}

// TestConfigCheckImage: config check looks each rule's image up in its driver's store
// without pulling: missing under pull = "never" fails at the rule (the first exec
// would), missing otherwise is a note (the first exec pulls it), present says nothing.
func TestConfigCheckImage(t *testing.T) {
	testimage.RequireEngine(t)
	t.Parallel()
	e := newEnv(t)
	archive, err := testimage.Archive()
	if err != nil {
		t.Fatal(err)
	}
	e.must("image", "import", e.writeFile("busybox.tar", string(archive)))
	rule := func(image, pull string) string {
		return e.writeFile("c-"+pull+".hcl", fmt.Sprintf("scope \"d:*\" {\n  driver = \"docker\"\n  image  = %q\n  pull   = %q\n}\n", image, pull))
	}
	never := rule("berth-test/no-such-image:1", "never")
	if r := e.run("config", "check", never); r.code != 125 || !strings.Contains(r.stderr, never+":1:1") ||
		!strings.Contains(r.stderr, `image berth-test/no-such-image:1 is not in driver docker's image store, and pull = "never"`) {
		t.Errorf("missing image, pull never: want 125 at the rule\n%v", r)
	}
	missing := rule("berth-test/no-such-image:1", "missing")
	if r := e.run("config", "check", missing); r.code != 0 || !strings.Contains(r.stderr, "note: "+missing+":1:1") ||
		!strings.Contains(r.stderr, "the first exec pulls it") {
		t.Errorf("missing image, pull missing: want ok and a note\n%v", r)
	}
	if r := e.run("config", "check", rule(testimage.Ref, "always")); r.code != 0 || r.stderr != "" {
		t.Errorf("present image: want ok without notes\n%v", r)
	}
}

// TestConfigCheckRuntimeDown: a driver that starts but whose runtime does not answer
// (an engine that is down) is a note, not a failure: the rules on it are checked
// without it, and their images by the first exec. No engine is needed.
func TestConfigCheckRuntimeDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	path := e.writeFile("down.hcl", "driver \"docker\" {\n  host = \"unix://"+filepath.Join(t.TempDir(), "no-engine.sock")+"\"\n}\n"+
		"scope \"d:*\" {\n  driver = \"docker\"\n  image  = \"berth-test/busybox:1\"\n}\n")
	if r := e.run("config", "check", path); r.code != 0 || !strings.Contains(r.stderr, "note: "+path+":4:1: scope \"d:*\": driver docker:") ||
		!strings.Contains(r.stderr, "does not answer") || !strings.Contains(r.stdout, "ok, 1 scope rule\n") {
		t.Errorf("a rule on an engine that is down: want ok and a note at the rule\n%v", r)
	}
}

// dockerKill sends SIGKILL to container name through the engine's API (POST
// /containers/NAME/kill on its unix socket): the container dies as in an OOM kill.
func dockerKill(t *testing.T, host, name string) {
	t.Helper()
	sock := strings.TrimPrefix(host, "unix://")
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Post("http://docker/containers/"+name+"/kill?signal=KILL", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("killing container %s: %s", name, resp.Status)
	}
}

// TestContainerDiesMidExec: when a docker sandbox dies during an exec (its container
// killed), berth exits 125 saying which session and sandbox lost its agent, what
// the driver says of the sandbox now and that the next call starts it again, and the
// next exec does so.
func TestContainerDiesMidExec(t *testing.T) {
	host := testimage.RequireEngine(t)
	t.Parallel()
	e := newEnv(t)
	importImage(t, e, "docker")
	e.config = e.writeFile("config.hcl", fmt.Sprintf("scope \"*\" {\n  driver = \"docker\"\n  image  = %q\n}\n", testimage.Ref))
	e.lostAgent(t, func(sandbox string) { dockerKill(t, host, sandbox) })
}
