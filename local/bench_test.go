package local_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/backends/agent"
	"github.com/berth-sh/berth/internal/benchutil"
	"github.com/berth-sh/berth/internal/shellbench"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
)

// BenchmarkExecRoundTrip measures the round trip of `true` four ways, interleaved so
// that machine noise hits each alike: os/exec on the host, the local driver in-process,
// the local driver through its plugin, and the whole `berth exec -- true` command.
// It reports p50 and p95 in milliseconds for each (at least 20 rounds).
//
//	go test ./local -run '^$' -bench ExecRoundTrip -benchtime 50x
func BenchmarkExecRoundTrip(b *testing.B) {
	ctx := context.Background()
	state := b.TempDir()
	owner := "bench"
	prepare := func(name string) backend.CreateRequest {
		bin, err := agent.Install(state, berthBin)
		if err != nil {
			b.Fatal(err)
		}
		files, err := agent.PrepareSandbox(filepath.Join(state, "sandboxes", name), bin)
		if err != nil {
			b.Fatal(err)
		}
		return backend.CreateRequest{Spec: backend.SandboxSpec{Name: name, Labels: map[string]string{backend.LabelOwner: owner}}, Agent: files}
	}

	inproc := local.New(local.WithStateDir(filepath.Join(state, "drivers", "local")))
	defer inproc.Close()
	if _, err := inproc.Create(ctx, prepare("bench-inproc")); err != nil {
		b.Fatal(err)
	}
	defer inproc.Remove(ctx, "bench-inproc")

	path, args := backends.BuiltinCommand(berthBin, local.Name)
	plug, err := backends.Launch(ctx, backends.LaunchOptions{Path: path, Args: args})
	if err != nil {
		b.Fatal(err)
	}
	defer plug.Kill()
	if err := plug.Configure(ctx, backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "local"), Owner: owner}); err != nil {
		b.Fatal(err)
	}
	if _, err := plug.Create(ctx, prepare("bench-plugin")); err != nil {
		b.Fatal(err)
	}
	defer plug.Remove(ctx, "bench-plugin")

	cliState := filepath.Join(state, "cli")
	cli := func() error {
		cmd := exec.Command(berthBin, "--state-dir", cliState, "exec", "--", "true")
		cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+filepath.Join(state, "xdg")) // no config file: local
		return cmd.Run()
	}
	if err := cli(); err != nil { // creates the main session's sandbox
		b.Fatalf("berth exec: %v", err)
	}
	defer exec.Command(berthBin, "--state-dir", cliState, "rm", "main").Run()

	run := func(d backend.TerminalBackend, name string) error {
		p, err := d.Exec(ctx, name, backend.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			return err
		}
		res, err := p.Wait()
		if err == nil && res.ExitCode != 0 {
			b.Fatalf("true exited %d", res.ExitCode)
		}
		return err
	}
	benchutil.Interleave(b, []benchutil.Way{
		{Name: "os-exec", Run: func() error { return exec.Command("true").Run() }},
		{Name: "in-process", Run: func() error { return run(inproc, "bench-inproc") }},
		{Name: "plugin", Run: func() error { return run(plug, "bench-plugin") }},
		{Name: "berth-exec", Run: cli},
	})
}

// BenchmarkShellMode compares a shell-mode call of `true` with a plain exec of `true`
// in one session on the local driver, through the registry and the driver's plugin,
// interleaved; p50 and p95 in milliseconds (at least 20 rounds).
//
//	go test ./local -run '^$' -bench ShellMode -benchtime 50x
func BenchmarkShellMode(b *testing.B) {
	shellbench.ShellVsExec(b, "scope \"*\" {\n  driver = \"local\"\n}\n", "bench:shell", registry.WithBerthBinary(berthBin))
}
