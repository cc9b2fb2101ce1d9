package containerd_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/containerd"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/registry"
)

// TestConformanceGVisor runs the shared suite against the containerd driver on
// containerd 2.x with every sandbox under runtime runsc (gVisor, $BERTH_RUNSC run by
// the runc shim): every case its capabilities claim passes, those it lacks are
// skipped naming the runtime, and nothing of it is left. containerd 1.6 is not run:
// the project registers runsc with 2.x only (scripts/runtimes.sh). The tty and
// terminal groups, which test the agent's shells rather than the sandbox, run under
// runsc in docker's TestConformanceGVisor; the registry groups and idempotence,
// berth's bookkeeping rather than the runtime's, in process on runc (all of them here
// too with $BERTH_CONFORMANCE_FULL=1).
func TestConformanceGVisor(t *testing.T) {
	runsc := testimage.RequireRunsc(t)
	addr := requireDaemon(t, daemons[1])
	runtimes := map[string]string{"runsc": runsc}
	newGVisor := func() backend.TerminalBackend {
		return containerd.New(containerd.WithAddress(addr), containerd.WithNamespace(testNamespace), containerd.WithRuntimes(runtimes))
	}
	before := takeInventory(t, addr)
	state := t.TempDir()
	d := newGVisor().(*containerd.Driver)
	opts := options(state, addr, registry.WithBerthBinary(berthBin), registry.WithDriver(containerd.Name, newGVisor))
	opener := conformance.RegistryOpener(nil, registry.WithBerthBinary(berthBin), registry.WithDriver(containerd.Name, newGVisor))
	block := fmt.Sprintf("driver \"containerd\" {\n  address   = %s\n  namespace = %s\n  runtimes  = { runsc = %s }\n}\n\n", strconv.Quote(addr), strconv.Quote(testNamespace), strconv.Quote(runsc))
	opts.OpenRegistry = func(t conformance.T, cfg string) (*registry.Registry, error) { return opener(t, block+cfg) }
	opts.Runtime = "runsc"
	opts.Groups = testbin.SuiteGroups("lifecycle", "exec", "isolation", "resources", "exec-dial")
	if err := d.Configure(context.Background(), backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "containerd"), Owner: opts.Owner}); err != nil {
		t.Fatal(err)
	}
	info, err := d.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rc, ok := info.Capabilities.ForRuntime("runsc"); !ok || rc.MemoryLimit || rc.PidsLimit || strings.Join(rc.NetworkModes, ",") != "none" {
		t.Fatalf("runtime runsc: %v %+v, want it listed without memory and pids limits, network none only", ok, rc)
	}
	t.Run("suite", func(t *testing.T) { conformance.Run(t, d, opts) })
	d.Close()
	checkNoLeaks(t, addr, before)
}

// TestRuntimesSetting: the runtimes setting takes absolute paths of executables
// only (Configure says which entry is wrong); a spec naming a runtime not in it, or
// network host under gVisor, is refused by Validate (berth config check) with
// ErrUnsupported, saying how to fix it. No daemon is needed.
func TestRuntimesSetting(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ cfg, want string }{
		{`{"runtimes": {"runsc": "runsc"}}`, "is not an absolute path"},
		{`{"runtimes": {"runsc": "/nonexistent/runsc"}}`, "no such file"},
		{`{"runtimes": {"runsc": "/"}}`, "not an executable file"},
		{`{"runtimes": {"runc": "/bin/true"}}`, "runc is the default runtime"},
		{`{"runtimes": {"-x": "/bin/true"}}`, "runtimes key"},
	} {
		d := containerd.New()
		err := d.Configure(ctx, backend.DriverSetup{Config: []byte(c.cfg)})
		if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", c.cfg, err, c.want)
		}
	}
	d := containerd.New()
	if err := d.Configure(ctx, backend.DriverSetup{Config: []byte(`{"runtimes": {"runsc-x": "/bin/true"}}`)}); err != nil {
		t.Fatal(err)
	}
	spec := backend.SandboxSpec{Name: "b-runtimes", Image: testimage.Ref}
	for _, c := range []struct {
		runtime, network, want string
	}{
		{"kata", "", `runtime "kata" is not in driver "containerd"`},
		{"runsc-x", "host", `network "host": under runtime runsc-x (gVisor)`},
	} {
		s := spec
		s.Runtime, s.Network = c.runtime, c.network
		if err := d.Validate(ctx, s); !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("runtime %q network %q: %v, want ErrUnsupported saying %q", c.runtime, c.network, err, c.want)
		}
	}
	s := spec
	s.Runtime = "runsc-x"
	if err := d.Validate(ctx, s); err != nil {
		t.Errorf("runtime runsc-x, network none: %v", err)
	}
}

// TestGVisorSandboxDeathRecovers: a fork bomb past the pids limit of a sandbox under
// runsc takes its Sentry down (the host cgroup counts the Sentry's threads; see
// docs/gvisor.md), which leaves a stopped task that runsc refuses to kill again; the
// next Create deletes that task without the kill and starts the sandbox again, files
// kept, and its agent answers.
func TestGVisorSandboxDeathRecovers(t *testing.T) {
	runsc := testimage.RequireRunsc(t)
	addr := requireDaemon(t, daemons[1])
	f := newFixture(t, addr)
	f.d.Close()
	f.d = containerd.New(containerd.WithAddress(addr), containerd.WithNamespace(testNamespace), containerd.WithRuntimes(map[string]string{"runsc": runsc}))
	if err := f.d.Configure(f.ctx, backend.DriverSetup{StateDir: f.state, Owner: f.owner}); err != nil {
		t.Fatal(err)
	}
	name := conformance.SandboxName()
	req := f.request(name)
	req.Spec.Runtime = "runsc"
	req.Spec.Resources.Pids = 64
	if _, err := f.d.Create(f.ctx, req); err != nil {
		t.Fatal(err)
	}
	run := func(script string) (backend.ExecResult, error) {
		p, err := f.exec(name, backend.ExecRequest{Argv: []string{"sh", "-c", script}})
		if err != nil {
			return backend.ExecResult{}, err
		}
		return p.Wait()
	}
	if res, err := run("echo kept > /kept"); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing /kept: %+v %v", res, err)
	}
	res, err := run("i=0; while [ $i -lt 200 ]; do sleep 300 & i=$((i+1)); done; echo started")
	t.Logf("fork bomb under runsc, pids 64: %+v, %v", res, err)
	sb, err := f.d.Create(f.ctx, req)
	if err != nil {
		t.Fatalf("Create after the fork bomb: %v, want the sandbox back", err)
	}
	if sb.State != backend.StateRunning {
		t.Errorf("state after Create: %s, want running", sb.State)
	}
	if res, err := run("cat /kept"); err != nil || res.ExitCode != 0 {
		t.Errorf("cat /kept after the sandbox came back: %+v %v, want its file kept", res, err)
	}
}
