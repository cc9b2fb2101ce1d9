package cli

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/server/apiv1"
)

// rowOf returns the row of driver name in list, or fails.
func rowOf(t *testing.T, list []apiv1.Driver, name string) apiv1.Driver {
	t.Helper()
	i := slices.IndexFunc(list, func(d apiv1.Driver) bool { return d.Name == name })
	if i < 0 {
		t.Fatalf("no %s row in %+v", name, list)
	}
	return list[i]
}

// TestDriverExecutables: local is served by berth itself; docker and containerd by
// their own executables, found beside berth first, then in $BERTH_PLUGIN_PATH; a
// berth without them still runs local, and says what to build for the others.
func TestDriverExecutables(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var list []apiv1.Driver
	decodeOne(t, e.must("drivers", "--json"), &list)
	if r := rowOf(t, list, "local"); r.Path != testbin.CLI(berthBin) || r.Health != "ok" || r.Served != "plugin" {
		t.Errorf("local: %+v, want served by %s", r, testbin.CLI(berthBin))
	}
	for _, name := range []string{"docker", "containerd"} {
		// Info needs no daemon: the rows are healthy wherever the runtimes are.
		want := filepath.Join(filepath.Dir(berthBin), "berth-driver-"+name)
		if r := rowOf(t, list, name); r.Path != want || r.Health != "ok" || r.Served != "plugin" || r.Protocol != 2 || !r.Capabilities.Validate {
			t.Errorf("%s: %+v, want healthy, served by %s at protocol 2, claiming validate", name, r, want)
		}
	}

	// --in-process moves only local into berth's process.
	list = nil
	decodeOne(t, e.must("--in-process", "drivers", "--json"), &list)
	if r := rowOf(t, list, "local"); r.Served != "in-process" {
		t.Errorf("--in-process: local %+v, want in-process", r)
	}
	if r := rowOf(t, list, "docker"); r.Served != "plugin" || r.Health != "ok" {
		t.Errorf("--in-process: docker %+v, want still a healthy plugin", r)
	}
	if r := e.run("driver", "serve", "docker"); r.code != 125 || !strings.Contains(r.stderr, "berth-driver-docker") {
		t.Errorf("driver serve docker: want 125 naming berth-driver-docker\n%v", r)
	}

	// berth-cli (the full CLI) alone in a directory: local works, docker says what to
	// build and where.
	alone := filepath.Join(t.TempDir(), "berth-cli")
	copyFile(t, testbin.CLI(berthBin), alone)
	run := func(extra []string, args ...string) result {
		t.Helper()
		cmd := exec.Command(alone, args...)
		cmd.Env = append(e.environ(), extra...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err != nil && !isExitError(err) {
			t.Fatal(err)
		}
		return result{stdout: out.String(), stderr: errb.String(), code: cmd.ProcessState.ExitCode()}
	}
	if r := run(nil, "exec", "--", "echo", "local needs only berth"); r.code != 0 || r.stdout != "local needs only berth\n" {
		t.Errorf("exec on local with berth alone\n%v", r)
	}
	r := run(nil, "drivers", "--json")
	list = nil
	decodeOne(t, r, &list)
	d := rowOf(t, list, "docker")
	for _, w := range []string{"beside " + alone, "CGO_ENABLED=0 go build -o " + filepath.Join(filepath.Dir(alone), "berth-driver-docker") + " ./cmd/berth-driver-docker", "go install github.com/berth-sh/berth/cmd/..."} {
		if !strings.Contains(d.Health, w) {
			t.Errorf("docker with berth alone: health %q does not say %q", d.Health, w)
		}
	}
	if l := rowOf(t, list, "local"); l.Health != "ok" || l.Path != alone {
		t.Errorf("local with berth alone: %+v", l)
	}
	// Found in the plugin search path, as third-party drivers are.
	list = nil
	decodeOne(t, run([]string{"BERTH_PLUGIN_PATH=" + filepath.Dir(berthBin)}, "drivers", "--json"), &list)
	if d := rowOf(t, list, "containerd"); d.Health != "ok" || d.Path != filepath.Join(filepath.Dir(berthBin), "berth-driver-containerd") {
		t.Errorf("containerd through $BERTH_PLUGIN_PATH: %+v", d)
	}
}

// copyFile copies the executable src to dst.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNoRuntimeSDK: berth-cli (the full CLI) links neither the Docker SDK nor the containerd client nor
// client-go (nor the drivers on them), nor berth serve's server
// and Prometheus' client: they cost every berth call its start-up (their package
// initialisers run whether or not a command needs them). The drivers are their own
// executables, and so is the server (berth-serve); TestFrontDeps checks the front.
func TestNoRuntimeSDK(t *testing.T) {
	pkgs := deps(t, "./cmd/berth-cli")
	if !slices.Contains(pkgs, "github.com/berth-sh/berth/cli") {
		t.Fatalf("go list -deps ./cmd/berth-cli does not name cli:\n%s", strings.Join(pkgs, "\n"))
	}
	for _, pkg := range pkgs {
		if strings.Contains(pkg, "docker") || strings.Contains(pkg, "containerd") || strings.HasPrefix(pkg, "k8s.io/") ||
			strings.Contains(pkg, "prometheus") || pkg == "github.com/berth-sh/berth/server" {
			t.Errorf("berth-cli links %s", pkg)
		}
	}
}

// TestFrontDeps: the berth front (cmd/berth) links only the standard library,
// golang.org/x/sys and x/term, and berth's light packages: none of the registry,
// the config's HCL, gRPC, go-plugin, bbolt, cobra, the CLI, and not
// internal/sigstart/early (whose initialiser would set up signals in every berth
// that hands over).
func TestFrontDeps(t *testing.T) {
	allowed := map[string]bool{
		"github.com/berth-sh/berth/cmd/berth": true, "github.com/berth-sh/berth/cli/front": true,
		"github.com/berth-sh/berth/client": true, "github.com/berth-sh/berth/cli/internal/execrun": true,
		"github.com/berth-sh/berth/internal/output": true, "github.com/berth-sh/berth/internal/phase": true,
		"github.com/berth-sh/berth/internal/sigstart": true, "github.com/berth-sh/berth/backend": true,
		"github.com/berth-sh/berth/server/apiv1": true, "github.com/berth-sh/berth/config/paths": true,
		"github.com/berth-sh/berth/config/units": true,
		"golang.org/x/sys/unix":                  true, "golang.org/x/term": true,
	}
	pkgs := deps(t, "./cmd/berth")
	if !slices.Contains(pkgs, "github.com/berth-sh/berth/cli/front") {
		t.Fatalf("go list -deps ./cmd/berth does not name cli/front:\n%s", strings.Join(pkgs, "\n"))
	}
	for _, pkg := range pkgs {
		first, _, _ := strings.Cut(pkg, "/")
		if !strings.Contains(first, ".") || strings.HasPrefix(pkg, "vendor/") {
			continue // the standard library
		}
		if !allowed[pkg] {
			t.Errorf("the berth front links %s", pkg)
		}
	}
}

// deps is go list -deps of the main package pkg.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", pkg)
	cmd.Dir = testbin.ModuleRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}
