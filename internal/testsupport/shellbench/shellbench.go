// Package shellbench compares shell-mode calls with plain execs through a registry,
// for the drivers' benchmarks. It is apart from benchutil, which package backends'
// own benchmarks import and which therefore must not import the registry.
package shellbench

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/registry"
)

// ShellVsExec compares, through a registry opened on the config text configHCL (which
// may use the built-in drivers) with a state dir of its own and then opts (its
// drivers launched as plugins unless opts says otherwise), a shell-mode call of
// `true` (Registry.Shell) with a plain exec of `true` (Registry.Exec) in the same
// session, interleaved; the session is created first and removed at the end.
func ShellVsExec(b *testing.B, configHCL, session string, opts ...registry.Option) {
	b.Helper()
	dir := b.TempDir()
	cfg, err := config.Parse([]byte(configHCL), filepath.Join(dir, "config.hcl"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	r, err := registry.Open(ctx, cfg, append([]registry.Option{registry.WithStateDir(filepath.Join(dir, "state"))}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	defer r.RemoveSession(ctx, session)
	plain := func() error {
		p, _, err := r.Exec(ctx, session, backend.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			return err
		}
		res, err := p.Wait()
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return err
	}
	shell := func() error {
		res, err := r.Shell(ctx, session, registry.ShellRequest{Command: "true"})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d: %s", res.ExitCode, res.Stderr)
		}
		return err
	}
	if err := plain(); err != nil { // creates the sandbox
		b.Fatal(err)
	}
	benchutil.Interleave(b, []benchutil.Way{{Name: "plain-exec", Run: plain}, {Name: "shell-mode", Run: shell}})
}
