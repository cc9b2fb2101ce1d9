package docker_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/docker"
	"github.com/berth-sh/berth/internal/testsupport/benchreg"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/shellbench"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/registry"
)

// BenchmarkExecRoundTrip measures the round trip of `true` in a running sandbox,
// interleaved so that machine noise hits each way alike: berth's agent over a kept
// connection and over a new one per exec, the registry as a library (the direct path:
// no driver call), the Docker SDK's exec called directly (create + attach + inspect),
// the `docker exec` CLI, and the whole `berth exec -s S -- true` command. It reports
// p50 and p95 in milliseconds (at least 20 rounds).
//
//	go test ./docker -run '^$' -bench ExecRoundTrip -benchtime 30x
func BenchmarkExecRoundTrip(b *testing.B) {
	host := benchEngine(b)
	ctx := context.Background()
	state := b.TempDir()
	owner := "bench-" + filepath.Base(state)
	bin, err := agent.Install(state, berthBin)
	if err != nil {
		b.Fatal(err)
	}
	files, err := agent.PrepareSandbox(filepath.Join(state, "sandboxes", "bench-inproc"), bin)
	if err != nil {
		b.Fatal(err)
	}
	inproc := docker.New(docker.WithHost(host))
	defer inproc.Close()
	if _, err := inproc.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: "bench-inproc", Image: testimage.Ref, Labels: map[string]string{backend.LabelOwner: owner}}, Agent: files}); err != nil {
		b.Fatal(err)
	}
	defer inproc.Remove(ctx, "bench-inproc")

	api, err := client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		b.Fatal(err)
	}
	defer api.Close()
	sdkExec := func() error {
		ex, err := api.ContainerExecCreate(ctx, "bench-inproc", container.ExecOptions{Cmd: []string{"true"}, AttachStdout: true, AttachStderr: true})
		if err != nil {
			return err
		}
		att, err := api.ContainerExecAttach(ctx, ex.ID, container.ExecAttachOptions{})
		if err != nil {
			return err
		}
		io.Copy(io.Discard, att.Reader)
		att.Close()
		ins, err := api.ContainerExecInspect(ctx, ex.ID)
		if err == nil && ins.ExitCode != 0 {
			b.Fatalf("SDK exec of true: exit %d", ins.ExitCode)
		}
		return err
	}
	dockerCLI := func() error {
		return exec.Command("docker", "-H", host, "exec", "bench-inproc", "true").Run()
	}

	// The whole berth command, with a config that sends every session to docker.
	cliState := filepath.Join(state, "cli")
	xdg := filepath.Join(state, "xdg")
	os.MkdirAll(filepath.Join(xdg, "berth"), 0o755)
	cfg := "driver \"docker\" {\n  host = \"" + host + "\"\n}\nscope \"*\" {\n  driver = \"docker\"\n  image  = \"" + testimage.Ref + "\"\n}\n"
	if err := os.WriteFile(filepath.Join(xdg, "berth", "config.hcl"), []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	berthCLI := func() error {
		cmd := exec.Command(testbin.Front(berthBin), "--state-dir", cliState, "exec", "-s", "bench", "--", "true")
		cmd.Env = benchutil.CLIEnv(xdg)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Logf("berth exec: %s", out)
		}
		return err
	}
	if err := berthCLI(); err != nil { // creates the session's sandbox
		b.Fatalf("berth exec: %v", err)
	}
	defer func() {
		cmd := exec.Command(testbin.Front(berthBin), "--state-dir", cliState, "rm", "bench")
		cmd.Env = benchutil.CLIEnv(xdg)
		cmd.Run()
	}()

	// The registry as a library, on a session whose sandbox runs: the direct path.
	reg := benchreg.OpenRegistry(b, cfg, filepath.Join(state, "lib"), registry.WithBerthBinary(berthBin))
	benchutil.Interleave(b, []benchutil.Way{
		{Name: "agent-kept", Run: benchutil.AgentKept(b, files)},
		{Name: "agent-dial", Run: benchutil.AgentDial(b, files)},
		{Name: "registry", Run: benchreg.RegistryExec(b, reg, "bench")},
		{Name: "sdk-exec", Run: sdkExec},
		{Name: "docker-exec-cli", Run: dockerCLI},
		{Name: "berth-exec-cli", Run: berthCLI},
	})
}

// benchEngine returns the Docker Engine's address with the test image loaded, or
// skips b, naming the address and how to start one, when no engine answers.
func benchEngine(b *testing.B) string {
	host := testimage.DockerHost()
	if err := testimage.Ping(host); err != nil {
		b.Skipf("no Docker Engine at %s: %v; %s", host, err, testimage.StartHint)
	}
	ensureImage(b, host)
	return host
}

// BenchmarkCreateToFirstExec measures a new session's sandbox from Create to its first
// exec finished, through the plugin, against `docker run --rm IMAGE true`, interleaved;
// it reports p50 and p95 in milliseconds (at least 20 rounds). The berth sandbox is
// removed outside the timed part.
//
//	go test ./docker -run '^$' -bench CreateToFirstExec -benchtime 20x
func BenchmarkCreateToFirstExec(b *testing.B) {
	ctx := context.Background()
	host, state, owner, bin, plug := pluginFixture(b)
	var berth, run []time.Duration
	rounds := benchutil.Rounds(b)
	for i := 0; i < rounds; i++ {
		name := benchName(i)
		files, err := agent.PrepareSandbox(filepath.Join(state, "sandboxes", name), bin)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := plug.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: name, Image: testimage.Ref, Labels: map[string]string{backend.LabelOwner: owner}}, Agent: files}); err != nil {
			b.Fatal(err)
		}
		p, err := agent.Exec(ctx, files, backend.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			b.Fatalf("true: %+v %v", res, err)
		}
		berth = append(berth, time.Since(start))
		if err := plug.Remove(ctx, name); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		if out, err := exec.Command("docker", "-H", host, "run", "--rm", "--network", "none", testimage.Ref, "true").CombinedOutput(); err != nil {
			b.Fatalf("docker run: %v %s", err, out)
		}
		run = append(run, time.Since(start))
	}
	benchutil.Report(b, []string{"berth-plugin", "docker-run"}, [][]time.Duration{berth, run})
}

// BenchmarkConcurrentSessions creates 50 sandboxes at once through the plugin, runs
// `true` in each, and reports the total time and the p95 of one create+exec.
//
//	go test ./docker -run '^$' -bench ConcurrentSessions -benchtime 1x
func BenchmarkConcurrentSessions(b *testing.B) {
	const n = 50
	ctx := context.Background()
	_, state, owner, bin, plug := pluginFixture(b)
	var totals []time.Duration
	var each []time.Duration
	for round := 0; round < max(b.N, 1); round++ {
		durs := make([]time.Duration, n)
		errs := make([]error, n)
		done := make(chan int, n)
		start := time.Now()
		for i := 0; i < n; i++ {
			go func() {
				defer func() { done <- i }()
				name := benchName(round*n + i)
				files, err := agent.PrepareSandbox(filepath.Join(state, "sandboxes", name), bin)
				if err != nil {
					errs[i] = err
					return
				}
				t0 := time.Now()
				if _, err := plug.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: name, Image: testimage.Ref, Labels: map[string]string{backend.LabelOwner: owner}}, Agent: files}); err != nil {
					errs[i] = err
					return
				}
				p, err := agent.Exec(ctx, files, backend.ExecRequest{Argv: []string{"true"}})
				if err == nil {
					var res backend.ExecResult
					if res, err = p.Wait(); err == nil && res.ExitCode != 0 {
						err = io.ErrUnexpectedEOF
					}
				}
				errs[i], durs[i] = err, time.Since(t0)
			}()
		}
		for i := 0; i < n; i++ {
			<-done
		}
		totals = append(totals, time.Since(start))
		each = append(each, durs...)
		for i := 0; i < n; i++ {
			if err := plug.Remove(ctx, benchName(round*n+i)); err != nil {
				b.Errorf("Remove: %v", err)
			}
			if errs[i] != nil {
				b.Errorf("session %d: %v", i, errs[i])
			}
		}
	}
	benchutil.Report(b, []string{"total-50", "one-session"}, [][]time.Duration{totals, each})
}

func benchName(i int) string {
	return "bench-" + strings.ToLower(strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")) + "-" + itoa(i)
}

func itoa(i int) string { return strconv.Itoa(i) }

// pluginFixture skips without an engine; otherwise it launches the docker driver's
// plugin configured for a fresh state dir and owner, and installs the agent there.
// The plugin is killed, and the owner's sandboxes removed, when b ends.
func pluginFixture(b *testing.B) (host, state, owner string, bin agent.Binary, plug *backends.Client) {
	host = benchEngine(b)
	ctx := context.Background()
	state = b.TempDir()
	owner = "bench-" + filepath.Base(state)
	bin, err := agent.Install(state, berthBin)
	if err != nil {
		b.Fatal(err)
	}
	path, args := testbin.DriverCommand(b, docker.Name)
	plug, err = backends.Launch(ctx, backends.LaunchOptions{Path: path, Args: args})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(plug.Kill)
	if err := plug.Configure(ctx, backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "docker"), Owner: owner, Config: []byte(`{"host":"` + host + `"}`)}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { removeOwned(plug, owner) })
	return host, state, owner, bin, plug
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

// BenchmarkShellMode compares a shell-mode call of `true` with a plain exec of `true`
// in one session on the docker driver, through the registry and the driver's plugin,
// interleaved; p50 and p95 in milliseconds (at least 20 rounds).
//
//	go test ./docker -run '^$' -bench ShellMode -benchtime 50x
func BenchmarkShellMode(b *testing.B) {
	host := benchEngine(b)
	cfg := "driver \"docker\" {\n  host = \"" + host + "\"\n}\nscope \"*\" {\n  driver = \"docker\"\n  image  = \"" + testimage.Ref + "\"\n}\n"
	shellbench.ShellVsExec(b, cfg, "bench:shell", registry.WithBerthBinary(berthBin))
}
