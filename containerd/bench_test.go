package containerd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/containerd"
	"github.com/berth-sh/berth/internal/testsupport/benchreg"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/registry"
)

// benchNamespace is the containerd namespace of the benchmarks: not the tests', so
// that a benchmark running beside the tests does not show in their leak checks.
const benchNamespace = "berth-bench"

// benchFixture is one daemon with the driver's plugin configured for a fresh state
// dir and owner, the agent installed there, the test image imported, and a raw client
// in the benchmark namespace.
type benchFixture struct {
	addr  string
	state string
	owner string
	bin   agent.Binary
	plug  *backends.Client
	cli   *client.Client
	ctx   context.Context // in benchNamespace
	image client.Image
}

// newBenchFixture skips without the daemon; the plugin is killed, and the owner's
// sandboxes removed, when b ends.
func newBenchFixture(b *testing.B, dm daemon) *benchFixture {
	f := &benchFixture{addr: requireDaemon(b, dm), state: b.TempDir()}
	f.owner = "bench-" + filepath.Base(f.state)
	var err error
	if f.bin, err = agent.Install(f.state, berthBin); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	path, args := testbin.DriverCommand(b, containerd.Name)
	if f.plug, err = backends.Launch(ctx, backends.LaunchOptions{Path: path, Args: args}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(f.plug.Kill)
	cfg := fmt.Sprintf(`{"address":%q,"namespace":%q}`, f.addr, benchNamespace)
	if err := f.plug.Configure(ctx, backend.DriverSetup{StateDir: filepath.Join(f.state, "drivers", "containerd"), Owner: f.owner, Config: []byte(cfg)}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { removeOwned(f.plug, f.owner) })
	if f.cli, err = client.New(f.addr); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.cli.Close() })
	importImage(b, f.plug)
	f.ctx = namespaces.WithNamespace(ctx, benchNamespace)
	if f.image, err = f.cli.GetImage(f.ctx, "docker.io/"+testimage.Ref); err != nil {
		b.Fatal(err)
	}
	return f
}

func (f *benchFixture) request(b *testing.B, name string) backend.CreateRequest {
	files, err := agent.PrepareSandbox(filepath.Join(f.state, "sandboxes", name), f.bin)
	if err != nil {
		b.Fatal(err)
	}
	return backend.CreateRequest{Spec: backend.SandboxSpec{Name: name, Image: testimage.Ref, Labels: map[string]string{backend.LabelOwner: f.owner}}, Agent: files}
}

// clientContainer makes a container with a long-lived task (sleep) the way a client
// program does it directly: new snapshot, spec from the image (plus extra), null IO,
// start.
func (f *benchFixture) clientContainer(id string, extra ...oci.SpecOpts) (client.Container, client.Task, error) {
	c, err := f.cli.NewContainer(f.ctx, id, client.WithNewSnapshot(id, f.image),
		client.WithNewSpec(append([]oci.SpecOpts{oci.WithImageConfig(f.image), oci.WithProcessArgs("sleep", "3600")}, extra...)...))
	if err != nil {
		return nil, nil, err
	}
	t, err := c.NewTask(f.ctx, cio.NullIO)
	if err != nil {
		return c, nil, err
	}
	return c, t, t.Start(f.ctx)
}

// clientExec runs `true` in task t with the client's task exec (exec create, start,
// wait, delete), null IO.
func (f *benchFixture) clientExec(t client.Task, n int) error {
	p, err := t.Exec(f.ctx, fmt.Sprintf("bench-%d", n), &specs.Process{Args: []string{"true"}, Cwd: "/", Env: []string{"PATH=/bin"}}, cio.NullIO)
	if err != nil {
		return err
	}
	st, err := p.Wait(f.ctx)
	if err != nil {
		return err
	}
	if err := p.Start(f.ctx); err != nil {
		return err
	}
	s := <-st
	if _, err := p.Delete(f.ctx); err != nil {
		return err
	}
	if s.ExitCode() != 0 {
		return fmt.Errorf("task exec of true: exit %d", s.ExitCode())
	}
	return nil
}

// clientRemove deletes a clientContainer (untimed).
func (f *benchFixture) clientRemove(c client.Container, t client.Task) {
	if t != nil {
		t.Kill(f.ctx, syscall.SIGKILL)
		t.Delete(f.ctx, client.WithProcessKill)
	}
	if c != nil {
		c.Delete(f.ctx, client.WithSnapshotCleanup)
	}
}

func runTrue(files backend.AgentFiles) error {
	p, err := agent.Exec(context.Background(), files, backend.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		return err
	}
	res, err := p.Wait()
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", res.ExitCode)
	}
	return err
}

// hardened are the spec options of berth's default sandboxes that cost time at task
// start (runc compiles the seccomp profile: Docker's, for the native ABI only, as
// containerd.SeccompNative), for the client-direct-hardened way.
var hardened = []oci.SpecOpts{
	oci.WithCapabilities([]string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}),
	oci.WithNoNewPrivileges, oci.WithPidsLimit(backend.DefaultPidsLimit),
	func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Linux.Seccomp = seccomp.DefaultProfile(s)
		s.Linux.Seccomp.Architectures = nil
		return nil
	},
}

// BenchmarkCreateToFirstExec measures, on each daemon, a new sandbox from Create to
// its first exec of `true` finished, through the plugin, against a client program
// doing the same directly (container with a new snapshot, task start, one task exec),
// plain and with berth's default hardening (capabilities, no-new-privileges, pids
// limit, native-ABI seccomp), interleaved; p50 and p95 in milliseconds over at least 20 rounds. Removal
// is outside the timed part.
//
//	go test ./containerd -run '^$' -bench CreateToFirstExec -benchtime 20x
func BenchmarkCreateToFirstExec(b *testing.B) {
	for _, dm := range daemons {
		b.Run(dm.name, func(b *testing.B) {
			f := newBenchFixture(b, dm)
			ctx := context.Background()
			var berth, direct, directHard []time.Duration
			for i := 0; i < benchutil.Rounds(b); i++ {
				name := benchName("p", i)
				req := f.request(b, name)
				start := time.Now()
				if _, err := f.plug.Create(ctx, req); err != nil {
					b.Fatal(err)
				}
				if err := runTrue(req.Agent); err != nil {
					b.Fatal(err)
				}
				berth = append(berth, time.Since(start))
				if err := f.plug.Remove(ctx, name); err != nil {
					b.Fatal(err)
				}

				for _, w := range []struct {
					kind  string
					extra []oci.SpecOpts
					out   *[]time.Duration
				}{{"c", nil, &direct}, {"h", hardened, &directHard}} {
					id := benchName(w.kind, i)
					start = time.Now()
					c, t, err := f.clientContainer(id, w.extra...)
					if err == nil {
						err = f.clientExec(t, i)
					}
					*w.out = append(*w.out, time.Since(start))
					f.clientRemove(c, t)
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			benchutil.Report(b, []string{"berth-plugin", "client-direct", "client-direct-hardened"}, [][]time.Duration{berth, direct, directHard})
		})
	}
}

// BenchmarkExecRoundTrip measures, on each daemon, the round trip of `true` in a
// running sandbox: through berth's agent over a kept connection and over a new one
// per exec, through the registry as a library (the direct path: no driver call), the
// whole `berth exec -s S -- true` command, against the client's own task exec and
// `ctr task exec` in a container started by the client, interleaved; p50 and p95 in
// milliseconds over at least 20 rounds.
//
//	go test ./containerd -run '^$' -bench ExecRoundTrip -benchtime 30x
func BenchmarkExecRoundTrip(b *testing.B) {
	ctrBin, err := exec.LookPath("ctr")
	if err != nil {
		b.Skip("no ctr binary: ", err)
	}
	for _, dm := range daemons {
		b.Run(dm.name, func(b *testing.B) {
			f := newBenchFixture(b, dm)
			ctx := context.Background()
			inproc := containerd.New(containerd.WithAddress(f.addr), containerd.WithNamespace(benchNamespace))
			defer inproc.Close()
			req := f.request(b, "bench-inproc-"+dm.major)
			if _, err := inproc.Create(ctx, req); err != nil {
				b.Fatal(err)
			}
			defer inproc.Remove(ctx, "bench-inproc-"+dm.major)
			id := benchName("exec", 0)
			c, t, err := f.clientContainer(id)
			defer f.clientRemove(c, t)
			if err != nil {
				b.Fatal(err)
			}
			cfg := fmt.Sprintf("driver \"containerd\" {\n  address   = %q\n  namespace = %q\n}\nscope \"*\" {\n  driver = \"containerd\"\n  image  = %q\n}\n", f.addr, benchNamespace, testimage.Ref)
			reg := benchreg.OpenRegistry(b, cfg, filepath.Join(f.state, "lib"), registry.WithBerthBinary(berthBin))
			berth := f.berthCLI(b, cfg)
			if err := berth("exec", "-s", "bench", "--", "true"); err != nil {
				b.Fatal(err)
			}
			defer berth("rm", "bench")
			n := 0
			benchutil.Interleave(b, []benchutil.Way{
				{Name: "agent-kept", Run: benchutil.AgentKept(b, req.Agent)},
				{Name: "agent-dial", Run: benchutil.AgentDial(b, req.Agent)},
				{Name: "registry", Run: benchreg.RegistryExec(b, reg, "bench")},
				{Name: "berth-exec-cli", Run: func() error { return berth("exec", "-s", "bench", "--", "true") }},
				{Name: "client-task-exec", Run: func() error { n++; return f.clientExec(t, n) }},
				{Name: "ctr-task-exec", Run: func() error {
					n++
					return exec.Command(ctrBin, "-a", f.addr, "-n", benchNamespace, "task", "exec", "--exec-id", fmt.Sprintf("ctr-%d", n), id, "true").Run()
				}},
			})
		})
	}
}

// berthCLI writes cfg as the config of a berth CLI with its own state dir and
// returns a function that runs that berth with args.
func (f *benchFixture) berthCLI(b *testing.B, cfg string) func(args ...string) error {
	cliState := filepath.Join(f.state, "cli")
	xdg := filepath.Join(f.state, "xdg")
	os.MkdirAll(filepath.Join(xdg, "berth"), 0o755)
	if err := os.WriteFile(filepath.Join(xdg, "berth", "config.hcl"), []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	return func(args ...string) error {
		cmd := exec.Command(testbin.Front(berthBin), append([]string{"--state-dir", cliState}, args...)...)
		cmd.Env = benchutil.CLIEnv(xdg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("berth %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
}

// BenchmarkWholeCommand measures, on each daemon, the whole `berth exec -s NEW --
// true` command on a new session (config: every session on containerd) against `ctr
// run --rm IMAGE ID true`, interleaved; p50 and p95 in milliseconds over at least 20
// rounds. The session's removal is outside the timed part.
//
//	go test ./containerd -run '^$' -bench WholeCommand -benchtime 20x
func BenchmarkWholeCommand(b *testing.B) {
	ctrBin, err := exec.LookPath("ctr")
	if err != nil {
		b.Skip("no ctr binary: ", err)
	}
	for _, dm := range daemons {
		b.Run(dm.name, func(b *testing.B) {
			f := newBenchFixture(b, dm)
			cfg := fmt.Sprintf("driver \"containerd\" {\n  address   = %q\n  namespace = %q\n}\nscope \"*\" {\n  driver = \"containerd\"\n  image  = %q\n}\n", f.addr, benchNamespace, testimage.Ref)
			berth := f.berthCLI(b, cfg)
			var berthT, ctrT []time.Duration
			for i := 0; i < benchutil.Rounds(b); i++ {
				session := fmt.Sprintf("bench:%d", i)
				start := time.Now()
				if err := berth("exec", "-s", session, "--", "true"); err != nil {
					b.Fatal(err)
				}
				berthT = append(berthT, time.Since(start))
				if err := berth("rm", session); err != nil {
					b.Fatal(err)
				}
				start = time.Now()
				if out, err := exec.Command(ctrBin, "-a", f.addr, "-n", benchNamespace, "run", "--rm", "docker.io/"+testimage.Ref, benchName("ctr", i), "true").CombinedOutput(); err != nil {
					b.Fatalf("ctr run: %v\n%s", err, out)
				}
				ctrT = append(ctrT, time.Since(start))
			}
			benchutil.Report(b, []string{"berth-exec-new-session", "ctr-run-rm"}, [][]time.Duration{berthT, ctrT})
		})
	}
}

// benchName returns a unique sandbox name for round i of kind.
func benchName(kind string, i int) string {
	return fmt.Sprintf("bench-%s-%s-%d", kind, strings.ReplaceAll(time.Now().Format("150405.000000"), ".", ""), i)
}

// removeOwned removes every sandbox of owner that a failed benchmark left.
func removeOwned(d backend.TerminalBackend, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sbs, _ := d.List(ctx, map[string]string{backend.LabelOwner: owner})
	for _, sb := range sbs {
		d.Remove(ctx, sb.Name)
	}
}
