package backends

import (
	"context"
	"os/exec"
	"testing"

	"github.com/berth-sh/berth/backend"
)

// BenchmarkExecTrueOSExec is the baseline: `true` with os/exec in this process.
func BenchmarkExecTrueOSExec(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecTruePlugin runs `true` through the plugin (the test driver uses
// os/exec in the plugin process), so the difference to BenchmarkExecTrueOSExec
// is the bridge's round trip.
func BenchmarkExecTruePlugin(b *testing.B) {
	ctx := context.Background()
	c, err := Launch(ctx, LaunchOptions{Path: pluginBin})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Kill()
	if _, err := c.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: "sb"}}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		p, err := c.Exec(ctx, "sb", backend.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkInfoPlugin is one unary call through the plugin.
func BenchmarkInfoPlugin(b *testing.B) {
	ctx := context.Background()
	c, err := Launch(ctx, LaunchOptions{Path: pluginBin})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Kill()
	for b.Loop() {
		if _, err := c.Info(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
