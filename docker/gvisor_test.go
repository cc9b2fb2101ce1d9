package docker_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/docker"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/registry"
)

// requireRunsc returns a configured driver on host whose engine has runtime runsc,
// reported with gVisor's kernel and without the memory and pids limits it lacks;
// an engine without runsc fails the test under CI=true and skips it elsewhere
// (testimage.RunscStartHint).
func requireRunsc(t *testing.T, host, state, owner string) *docker.Driver {
	t.Helper()
	d := docker.New(docker.WithHost(host))
	t.Cleanup(func() { d.Close() })
	if err := d.Configure(context.Background(), backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "docker"), Owner: owner}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	info, err := d.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(info.Capabilities.RuntimeNames(), "runsc") {
		testimage.Missing(t, "the Docker Engine at "+host+" has no runtime runsc (its runtimes: "+
			fmtNames(info.Capabilities.RuntimeNames())+"); "+testimage.RunscStartHint)
	}
	for _, r := range info.Capabilities.Runtimes {
		if r.Name == "runsc" && (r.Kernel != backend.KernelGVisor || r.Capabilities.MemoryLimit || r.Capabilities.PidsLimit || !r.Capabilities.StopStart) {
			t.Fatalf("runtime runsc reported as %+v, want kernel gvisor without memory and pids limits", r)
		}
	}
	return d
}

func fmtNames(names []string) string {
	if len(names) == 0 {
		return "none besides the default"
	}
	return strings.Join(names, ", ")
}

// TestConformanceGVisor runs the shared suite's runtime groups (testbin.RuntimeGroups;
// the whole suite with $BERTH_CONFORMANCE_FULL=1) against the docker driver with
// every sandbox under runtime runsc (gVisor): every case its capabilities claim
// passes, and those it lacks are skipped naming the runtime.
func TestConformanceGVisor(t *testing.T) {
	host := engine(t)
	state := t.TempDir()
	opts := options(state)
	opts.Runtime = "runsc"
	opts.Groups = testbin.SuiteGroups(testbin.RuntimeGroups...)
	d := requireRunsc(t, host, state, opts.Owner)
	opts.OpenRegistry = conformance.RegistryOpener(nil, registry.WithBerthBinary(berthBin),
		registry.WithDriver(docker.Name, func() backend.TerminalBackend { return docker.New(docker.WithHost(host)) }))
	conformance.Run(t, d, opts)
}

// TestUnknownRuntime: a spec naming a runtime the engine lacks is refused by
// Validate (berth config check) and Create with ErrUnsupported, saying how to
// register it, and Create leaves no container behind.
func TestUnknownRuntime(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.d.Configure(ctx, backend.DriverSetup{StateDir: f.state, Owner: f.owner}); err != nil {
		t.Fatal(err)
	}
	req := f.request(conformance.SandboxName())
	req.Spec.Runtime = "no-such-runtime"
	_, cerr := f.d.Create(ctx, req)
	for what, err := range map[string]error{"Validate": f.d.Validate(ctx, req.Spec), "Create": cerr} {
		if !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), `no runtime "no-such-runtime"`) || !strings.Contains(err.Error(), "--add-runtime") || !strings.Contains(err.Error(), "docs/gvisor.md") {
			t.Errorf("%s: %v, want ErrUnsupported naming the runtime and how to register it", what, err)
		}
	}
	f.absent(req.Spec.Name)
}
