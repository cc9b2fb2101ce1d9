package local_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/internal/testsupport/benchreg"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/shellbench"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
)

// BenchmarkExecRoundTrip measures the round trip of `true` four ways, interleaved so
// that machine noise hits each alike: os/exec on the host, berth's agent in a local
// sandbox over one kept connection (what a long-lived host pays per exec), a new
// connection per exec (agent.Exec: dial, handshake, Hello, exec), and the registry as
// a library on a session whose sandbox runs (the direct path). The whole command is
// BenchmarkWholeCommand. It reports p50 and p95 in milliseconds for each (at least 20
// rounds).
//
//	go test ./local -run '^$' -bench ExecRoundTrip -benchtime 50x
func BenchmarkExecRoundTrip(b *testing.B) {
	ctx := context.Background()
	state := b.TempDir()
	bin, err := agent.Install(state, berthBin)
	if err != nil {
		b.Fatal(err)
	}
	files, err := agent.PrepareSandbox(filepath.Join(state, "sandboxes", "bench"), bin)
	if err != nil {
		b.Fatal(err)
	}
	d := local.New(local.WithStateDir(filepath.Join(state, "drivers", "local")))
	defer d.Close()
	if _, err := d.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: "bench", Labels: map[string]string{backend.LabelOwner: "bench"}}, Agent: files}); err != nil {
		b.Fatal(err)
	}
	defer d.Remove(ctx, "bench")
	kept, err := agent.Connect(ctx, files)
	if err != nil {
		b.Fatal(err)
	}
	defer kept.Close()
	wait := func(p backend.Process, err error) error {
		if err != nil {
			return err
		}
		res, err := p.Wait()
		if err == nil && res.ExitCode != 0 {
			b.Fatalf("true exited %d", res.ExitCode)
		}
		return err
	}
	req := backend.ExecRequest{Argv: []string{"true"}}
	// The registry as a library, on a session whose sandbox runs: the direct path.
	reg := benchreg.OpenRegistry(b, "scope \"*\" {\n  driver = \"local\"\n}\n", filepath.Join(state, "lib"), registry.WithBerthBinary(berthBin))
	benchutil.Interleave(b, []benchutil.Way{
		{Name: "os-exec", Run: func() error { return exec.Command("true").Run() }},
		{Name: "agent-kept", Run: func() error { return wait(kept.Exec(ctx, req)) }},
		{Name: "agent-dial", Run: func() error { return wait(agent.Exec(ctx, files, req)) }},
		{Name: "registry", Run: benchreg.RegistryExec(b, reg, "bench")},
	})
}

// BenchmarkRegistryPhases attributes the registry's round trip of `true` as a
// library (a long-lived registry, the direct path, on local) to its phases
// (internal/phase, traced in this process): call → store (the config's rule, the
// store checked and the session's record read), store → lock (the sandbox's lock and
// busy marker), lock → dial (the kept agent connection found), dial → started (the
// Exec sent, the agent's fork and exec, its started message back), started → ended
// (the command runs, is reaped, the result comes), ended → returned (Wait returns:
// last use touched, the busy marker let go). p50 and p95 in milliseconds over at
// least 20 calls.
//
//	go test ./local -run '^$' -bench RegistryPhases -benchtime 1000x
func BenchmarkRegistryPhases(b *testing.B) {
	state := b.TempDir()
	reg := benchreg.OpenRegistry(b, "scope \"*\" {\n  driver = \"local\"\n}\n", filepath.Join(state, "lib"), registry.WithBerthBinary(berthBin))
	run := benchreg.RegistryExec(b, reg, "bench")
	phase.Enable()
	var lines strings.Builder
	phase.Drain(&lines)
	phases := benchutil.NewPhases()
	b.ResetTimer()
	for range benchutil.Rounds(b) {
		lines.Reset()
		start := time.Now()
		if err := run(); err != nil {
			b.Fatal(err)
		}
		end := time.Now()
		phase.Drain(&lines)
		if err := phases.AddSpan("call", "returned", start, end, lines.String()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	phases.Report(b)
}

// BenchmarkShellMode compares a shell-mode call of `true` with a plain exec of `true`
// in one session on the local driver, through the registry and the driver's plugin,
// interleaved; p50 and p95 in milliseconds (at least 20 rounds).
//
//	go test ./local -run '^$' -bench ShellMode -benchtime 50x
func BenchmarkShellMode(b *testing.B) {
	shellbench.ShellVsExec(b, "scope \"*\" {\n  driver = \"local\"\n}\n", "bench:shell", registry.WithBerthBinary(berthBin))
}

// BenchmarkWholeCommand measures the whole `berth exec -s S -- true` command on a
// running local sandbox (the direct path) against `sh -c true`, both started from
// this process with os/exec and interleaved, and attributes berth's time to its
// phases (BERTH_TRACE): spawn → main (process start and Go's init), config, open,
// store, lock, dial, started, ended, exit, and exit → reaped. p50 and p95 in
// milliseconds over at least 20 rounds.
//
//	go test ./local -run '^$' -bench WholeCommand -benchtime 50x
func BenchmarkWholeCommand(b *testing.B) {
	state := b.TempDir()
	xdg := filepath.Join(state, "xdg") // no config file: every session on local
	run := func(trace bool) (string, error) {
		cmd := exec.Command(testbin.Front(berthBin), "--state-dir", filepath.Join(state, "cli"), "exec", "-s", "bench", "--", "true")
		cmd.Env = benchutil.CLIEnv(xdg)
		if trace {
			cmd.Env = append(cmd.Env, "BERTH_TRACE=1")
		}
		var errb strings.Builder
		cmd.Stderr = &errb
		err := cmd.Run()
		return errb.String(), err
	}
	if out, err := run(false); err != nil { // creates the session's sandbox
		b.Fatalf("berth exec: %v\n%s", err, out)
	}
	b.Cleanup(func() {
		exec.Command(testbin.Front(berthBin), "--state-dir", filepath.Join(state, "cli"), "rm", "bench").Run()
	})
	phases := benchutil.NewPhases()
	benchutil.Interleave(b, []benchutil.Way{
		{Name: "sh-c-true", Run: func() error { return exec.Command("sh", "-c", "true").Run() }},
		{Name: "berth-exec", Run: func() error { _, err := run(false); return err }},
		{Name: "berth-exec-traced", Run: func() error {
			start := time.Now()
			out, err := run(true)
			if err == nil {
				err = phases.Add(start, time.Now(), out)
			}
			return err
		}},
	})
	phases.Report(b)
}
