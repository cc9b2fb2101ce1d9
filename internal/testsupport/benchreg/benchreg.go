// Package benchreg holds the benchmarks' registry helpers: a registry over a config
// text, and the way that runs `true` through it.
package benchreg

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/registry"
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

// PoolRounds measures new sessions of r from Exec to their first `true` finished:
// one of a rule whose glob is "pooled:*" with a warm pool (claims a member), one of
// a rule without a pool (session "plain:N": a create), and baseline (the runtime's
// own way to run `true` in a new container, as baselineName), interleaved over at
// least benchutil.MinRounds rounds. Between rounds, untimed, the sessions are
// removed and the pool refilled (FillPools). It reports p50 and p95 in
// milliseconds, and drains the pool when b ends.
func PoolRounds(b *testing.B, r *registry.Registry, baselineName string, baseline func(round int) error) {
	b.Helper()
	ctx := context.Background()
	b.Cleanup(func() { r.DrainPools(context.Background()) })
	if err := r.FillPools(ctx); err != nil {
		b.Fatal(err)
	}
	var claim, create, base []time.Duration
	for i := range benchutil.Rounds(b) {
		for _, way := range []struct {
			session string
			out     *[]time.Duration
		}{{fmt.Sprintf("pooled:%d", i), &claim}, {fmt.Sprintf("plain:%d", i), &create}} {
			start := time.Now()
			p, _, err := r.Exec(ctx, way.session, benchutil.TrueReq)
			if err := benchutil.WaitTrue(b, p, err); err != nil {
				b.Fatal(err)
			}
			*way.out = append(*way.out, time.Since(start))
			if err := r.RemoveSession(ctx, way.session); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		if err := baseline(i); err != nil {
			b.Fatalf("%s: %v", baselineName, err)
		}
		base = append(base, time.Since(start))
		if err := r.FillPools(ctx); err != nil {
			b.Fatal(err)
		}
	}
	benchutil.Report(b, []string{"pool-claim", "no-pool", baselineName}, [][]time.Duration{claim, create, base})
}
