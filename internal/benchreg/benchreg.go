// Package benchreg holds the benchmarks' registry helpers: a registry over a config
// text, and the way that runs `true` through it.
package benchreg

import (
	"context"
	"testing"

	"github.com/berth-sh/berth/internal/benchutil"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/registry/config"
)

// OpenRegistry opens a registry over the config text cfg with state dir state,
// closed when b ends.
func OpenRegistry(b *testing.B, cfg, state string, opts ...registry.Option) *registry.Registry {
	b.Helper()
	c, err := config.Parse([]byte(cfg), "bench.hcl")
	if err != nil {
		b.Fatal(err)
	}
	r, err := registry.Open(context.Background(), c, append([]registry.Option{registry.WithStateDir(state)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		r.RemoveSession(context.Background(), "bench")
		r.Close()
	})
	return r
}

// RegistryExec returns a way that runs `true` in session through r (a library user's
// round trip). It runs it once first, so that the session's sandbox exists and later
// rounds take the direct path.
func RegistryExec(b *testing.B, r *registry.Registry, session string) func() error {
	b.Helper()
	run := func() error {
		p, _, err := r.Exec(context.Background(), session, benchutil.TrueReq)
		return benchutil.WaitTrue(b, p, err)
	}
	if err := run(); err != nil {
		b.Fatal(err)
	}
	return run
}
