package docker_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/berth-sh/berth/internal/testsupport/benchreg"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/registry"
)

// BenchmarkPoolClaimToFirstExec measures a new session, from the registry's Exec call
// to its first `true` finished, through a registry as a library (the docker driver's
// plugin already running), interleaved: claiming a member of a warm pool of 4
// ("pool-claim"), creating the session's sandbox on a rule without a pool
// ("no-pool"), and `docker run --rm IMAGE true` (benchreg.PoolRounds). p50 and p95 in
// milliseconds over at least 20 rounds.
//
//	go test ./docker -run '^$' -bench PoolClaimToFirstExec -benchtime 30x
func BenchmarkPoolClaimToFirstExec(b *testing.B) {
	host := benchEngine(b)
	cfg := fmt.Sprintf("driver \"docker\" {\n  host = %q\n}\nscope \"pooled:*\" {\n  driver = \"docker\"\n  image = %q\n  pool { size = 4 }\n}\nscope \"*\" {\n  driver = \"docker\"\n  image = %q\n}\n", host, testimage.Ref, testimage.Ref)
	reg := benchreg.OpenRegistry(b, cfg, filepath.Join(b.TempDir(), "state"), registry.WithBerthBinary(berthBin))
	benchreg.PoolRounds(b, reg, "docker-run", func(int) error {
		out, err := exec.Command("docker", "-H", host, "run", "--rm", "--network", "none", testimage.Ref, "true").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v %s", err, out)
		}
		return nil
	})
}
