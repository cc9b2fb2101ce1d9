package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/kubernetes"
)

// ScaleEnv switches TestSessionsAtOnce on: its value is how many sessions to
// create at once (1 or more; "1" or "yes" mean 50). It is off by default because
// it holds the test cluster's one node for a minute or more.
const ScaleEnv = "BERTH_K8S_SCALE"

// TestSessionsAtOnce creates N sessions (default 50) at once on the test cluster's
// one node, each by a whole `berth exec -s scale:I -- true` of its own with the
// test cluster's storage class (a Pod, a Secret and a volume claim each), and
// checks that every one succeeds; it logs the total time and each exec's p50 and
// p95, then removes them all (`berth rm`, at once too) and checks that no Pod or
// claim is left. The default requests (cpu_request 10m, memory_request 32Mi) are
// what lets 50 fit a 2-core node.
//
//	BERTH_K8S_SCALE=50 go test ./kubernetes -run TestSessionsAtOnce -v
func TestSessionsAtOnce(t *testing.T) {
	v := os.Getenv(ScaleEnv)
	if v == "" {
		t.Skipf("set %s=50 to create 50 sessions at once on the test cluster", ScaleEnv)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		n = 50
	}
	c, cfg := cluster(t)
	b := newBerth(t, driverBlock(cfg)+fmt.Sprintf(`
scope "scale:*" {
  driver = "kubernetes"
  image  = %q
}
`, c.TestImage))
	all := func(verb string, args func(i int) []string) ([]time.Duration, time.Duration, []error) {
		durs := make([]time.Duration, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := time.Now()
				_, stderr, err := b.run(args(i)...)
				durs[i] = time.Since(s)
				if err != nil {
					errs[i] = fmt.Errorf("berth %s (scale:%d): %v: %s", verb, i, err, strings.TrimSpace(stderr))
				}
			}()
		}
		wg.Wait()
		return durs, time.Since(start), errs
	}
	pods := map[string]bool{} // the sandboxes' Pod names, filled in below
	created, total, errs := all("exec", func(i int) []string { return []string{"exec", "-s", fmt.Sprintf("scale:%d", i), "--", "true"} })
	t.Cleanup(func() {
		removed, total, errs := all("rm", func(i int) []string { return []string{"rm", fmt.Sprintf("scale:%d", i)} })
		p50, p95 := benchutil.Percentiles(removed)
		t.Logf("%d sessions removed at once: total %s, each berth rm p50 %s p95 %s", n, total.Round(time.Millisecond), p50.Round(time.Millisecond), p95.Round(time.Millisecond))
		for _, err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		out, err := c.KubectlAs(context.Background(), c.AdminKubeconfig, "", "get", "pods,persistentvolumeclaims", "-o", "name")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Fields(out) {
			if _, name, _ := strings.Cut(l, "/"); pods[strings.TrimSuffix(name, "-data")] {
				t.Errorf("left after berth rm: %s", l)
			}
		}
	})
	out, _, err := b.run("sessions", "--json")
	var list []struct{ Sandbox string }
	if err == nil {
		err = json.Unmarshal([]byte(out), &list)
	}
	if err != nil {
		t.Errorf("berth sessions --json: %v", err)
	}
	for _, s := range list {
		pods[kubernetes.PodName(s.Sandbox)] = true
	}
	if len(pods) != n {
		t.Errorf("berth sessions lists %d sandboxes, want %d", len(pods), n)
	}
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			t.Error(err)
		}
	}
	p50, p95 := benchutil.Percentiles(created)
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("%d sessions created at once (%d failed): total %s, each berth exec p50 %s p95 %s; load average %s", n, failed, total.Round(time.Millisecond), p50.Round(time.Millisecond), p95.Round(time.Millisecond), strings.Join(strings.Fields(string(load))[:3], " "))
}
