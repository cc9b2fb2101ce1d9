package backends

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
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

// BenchmarkPluginStartToFirstCall measures what a berth command pays for a
// third-party driver before it can use it: from nothing to the first successful
// call (Info), interleaved over at least benchutil.MinRounds rounds, p50 and p95.
// "launch" is Launch + Info; "discover-pin-launch" adds the plugin search and the
// sha256 check of the executable; "discover-pin-cached-launch" the same with the
// sum cache (LaunchOptions.HashCacheDir) that berth uses; "describe" is the
// handshake-free describe run.
// Killing the plugin is not timed. $BERTH_BENCH_PLUGIN, when set, is the plugin
// measured (e.g. the bwrap example) instead of the test plugin.
func BenchmarkPluginStartToFirstCall(b *testing.B) {
	ctx := context.Background()
	path := pluginBin
	if p := os.Getenv("BERTH_BENCH_PLUGIN"); p != "" {
		path = p
	}
	sum, err := catalog.FileSHA256(path)
	if err != nil {
		b.Fatal(err)
	}
	dirs := []string{b.TempDir(), filepath.Dir(path)}
	cacheDir := b.TempDir()
	name := strings.TrimPrefix(filepath.Base(path), catalog.PluginPrefix)
	plugin := ""
	if name == filepath.Base(path) {
		plugin = path // not named berth-driver-NAME: found by its path
	}
	ways := []struct {
		name  string
		start func() (*Client, error)
	}{
		{"launch", func() (*Client, error) { return Launch(ctx, LaunchOptions{Path: path}) }},
		{"discover-pin-launch", func() (*Client, error) {
			p, err := catalog.FindPlugin(name, plugin, dirs)
			if err != nil {
				return nil, err
			}
			return Launch(ctx, LaunchOptions{Path: p, SHA256: sum})
		}},
		{"discover-pin-cached-launch", func() (*Client, error) {
			p, err := catalog.FindPlugin(name, plugin, dirs)
			if err != nil {
				return nil, err
			}
			return Launch(ctx, LaunchOptions{Path: p, SHA256: sum, HashCacheDir: cacheDir})
		}},
		{"describe", func() (*Client, error) { _, err := Describe(ctx, path); return nil, err }},
	}
	rounds := benchutil.Rounds(b)
	names := make([]string, len(ways))
	samples := make([][]time.Duration, len(ways))
	b.ResetTimer()
	for i := 0; i < rounds; i++ {
		for j, w := range ways {
			names[j] = w.name
			start := time.Now()
			c, err := w.start()
			if err == nil && c != nil {
				_, err = c.Info(ctx)
			}
			d := time.Since(start)
			if c != nil {
				c.Kill()
			}
			if err != nil {
				b.Fatalf("%s: %v", w.name, err)
			}
			samples[j] = append(samples[j], d)
		}
	}
	b.StopTimer()
	benchutil.Report(b, names, samples)
}
