package containerd_test

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/berth-sh/berth/internal/testsupport/benchreg"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/registry"
)

// BenchmarkPoolClaimToFirstExec measures, on each daemon, a new session from the
// registry's Exec call to its first `true` finished, through a registry as a library
// (the containerd driver's plugin already running), interleaved: claiming a member
// of a warm pool of 4 ("pool-claim"), creating the session's sandbox on a rule
// without a pool ("no-pool"), and a client program creating a container, starting
// its task and running one exec ("client-direct"; benchreg.PoolRounds). p50 and p95
// in milliseconds over at least 20 rounds.
//
//	go test ./containerd -run '^$' -bench PoolClaimToFirstExec -benchtime 30x
func BenchmarkPoolClaimToFirstExec(b *testing.B) {
	for _, dm := range daemons {
		b.Run(dm.name, func(b *testing.B) {
			f := newBenchFixture(b, dm)
			rule := fmt.Sprintf("  driver = \"containerd\"\n  image = %s\n", strconv.Quote(testimage.Ref))
			cfg := driverBlock(f.addr) + "scope \"pooled:*\" {\n" + rule + "  pool { size = 4 }\n}\nscope \"*\" {\n" + rule + "}\n"
			reg := benchreg.OpenRegistry(b, cfg, filepath.Join(b.TempDir(), "state"), registry.WithBerthBinary(berthBin))
			benchreg.PoolRounds(b, reg, "client-direct", func(i int) error {
				c, t, err := f.clientContainer(benchName("pc", i))
				if err == nil {
					err = f.clientExec(t, i)
				}
				f.clientRemove(c, t)
				return err
			})
		})
	}
}
