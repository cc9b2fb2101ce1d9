package local_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/agent"
	"github.com/berth-sh/berth/internal/benchutil"
	"github.com/berth-sh/berth/internal/shellbench"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
)

// BenchmarkExecRoundTrip measures the round trip of `true` three ways, interleaved so
// that machine noise hits each alike: os/exec on the host, berth's agent in a local
// sandbox over one kept connection (what a long-lived host pays per exec), and a new
// connection per exec (agent.Exec: dial, handshake, Hello, exec). The whole command
// and the registry's round trip are in package cmd/berth's BenchmarkWholeCommand. It
// reports p50 and p95 in milliseconds for each (at least 20 rounds).
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
	benchutil.Interleave(b, []benchutil.Way{
		{Name: "os-exec", Run: func() error { return exec.Command("true").Run() }},
		{Name: "agent-kept", Run: func() error { return wait(kept.Exec(ctx, req)) }},
		{Name: "agent-dial", Run: func() error { return wait(agent.Exec(ctx, files, req)) }},
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
