package cli

// Warm pools under a real berth serve on the local driver: claims by berth exec, the
// pool refilled as berth sessions --pool shows it, members left by one serve claimed
// by the next, and the pool drained by a reload whose config has none.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/server/apiv1"
)

// poolConfig is a config whose task:* sessions have a pool of size on local.
func poolConfig(size int) string {
	return fmt.Sprintf("scope \"task:*\" {\n  driver = \"local\"\n  pool {\n    size = %d\n  }\n}\nscope \"*\" {\n  driver = \"local\"\n}\n", size)
}

// pools returns the daemon's GET /v1/pools.
func (d *daemon) pools() []apiv1.Pool {
	d.t.Helper()
	status, b := d.call("GET", "/v1/pools", "")
	var ps []apiv1.Pool
	if status != http.StatusOK || json.Unmarshal(b, &ps) != nil {
		d.t.Fatalf("GET /v1/pools: %d %s", status, b)
	}
	return ps
}

// waitReady waits until the daemon's first pool has n ready members and nothing
// else, and returns it.
func (d *daemon) waitPool(n int) apiv1.Pool {
	d.t.Helper()
	var p apiv1.Pool
	testwait.Until(d.t, fmt.Sprintf("the pool to hold %d ready members", n), func() bool {
		ps := d.pools()
		if len(ps) == 0 {
			return false
		}
		p = ps[0]
		return p.Ready == n && len(p.Members) == n
	})
	return p
}

// metricLine returns the value text of the /metrics line that starts with series
// ("" when there is none).
func (d *daemon) metricLine(series string) string {
	d.t.Helper()
	status, b := d.call("GET", "/metrics", "")
	if status != http.StatusOK {
		d.t.Fatalf("GET /metrics: %d %s", status, b)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	return ""
}

// drainPools reloads the daemon with a config without pools and waits until the
// pools are gone and the removals done (the env's cleanup then finds no process
// of the state dir).
func (e *env) drainPools(d *daemon) {
	e.t.Helper()
	e.writeFile("config.hcl", "scope \"*\" {\n  driver = \"local\"\n}\n")
	n := len(d.logs("config reloaded"))
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.waitLog("config reloaded", n+1)
	testwait.Until(e.t, "the reloaded daemon to drain its pools", func() bool { return len(d.pools()) == 0 })
	d.stop() // waits for the drain's removals, which shutdown lets finish
}

// The done-when line on local: with a pool of 4 under berth serve, berth
// exec -s task:N -- true for 10 new N in a row each succeeds, the first 4 are
// claims, no two sessions share a sandbox, and berth sessions --pool then shows the
// pool refilled.
func TestServePoolDoneWhen(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", poolConfig(4))
	d := e.serve()
	members := map[string]bool{}
	for _, m := range d.waitPool(4).Members {
		members[m.Sandbox] = true
	}
	seen := map[string]string{}
	claims := 0
	for i := 1; i <= 10; i++ {
		session := fmt.Sprintf("task:%d", i)
		r := e.must("exec", "--json", "-s", session, "--", "true")
		var res apiv1.ExecResult
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatalf("exec --json in %s: %v\n%v", session, err, r)
		}
		if prev, dup := seen[res.Sandbox]; dup {
			t.Fatalf("%s and %s got the same sandbox %s", prev, session, res.Sandbox)
		}
		seen[res.Sandbox] = session
		if res.Pooled {
			claims++
		}
		if i <= 4 && (!res.Pooled || !members[res.Sandbox]) {
			t.Fatalf("exec %d in %s: %+v, want a claim of one of the 4 ready members", i, session, res)
		}
	}
	rows := e.sessions()
	if len(rows) != 10 {
		t.Fatalf("sessions: %+v", rows)
	}
	var pooled []struct {
		Session string `json:"session"`
		Pooled  bool   `json:"pooled"`
	}
	json.Unmarshal([]byte(e.must("sessions", "--json").stdout), &pooled)
	n := 0
	for _, p := range pooled {
		if p.Pooled {
			n++
		}
	}
	if n != claims {
		t.Errorf("berth sessions --json says %d sessions are pooled; the execs said %d", n, claims)
	}
	d.waitPool(4)
	out := e.must("sessions", "--pool").stdout
	if !strings.Contains(out, "SCOPE") || !regexpLine(out, `^task:\*\s+local\s+4\s+4\s+0\s+0\s+0\s`) {
		t.Errorf("berth sessions --pool after the refill:\n%s", out)
	}
	// --json through the daemon is GET /v1/pools; embedded it reads the same store.
	var viaDaemon, embedded []apiv1.Pool
	json.Unmarshal([]byte(e.must("sessions", "--pool", "--json").stdout), &viaDaemon)
	json.Unmarshal([]byte(e.must("--no-daemon", "sessions", "--pool", "--json").stdout), &embedded)
	if len(viaDaemon) != 1 || fmt.Sprint(viaDaemon) != fmt.Sprint(embedded) {
		t.Errorf("berth sessions --pool --json: through the daemon %+v, embedded %+v", viaDaemon, embedded)
	}
	if got := d.metricLine(`berth_pool_claims_total{driver="local",scope="task:*"}`); got != fmt.Sprint(claims) {
		t.Errorf("berth_pool_claims_total %q, want %d", got, claims)
	}
	e.drainPools(d)
}

// Members that one berth serve made are left running at its shutdown and claimed by
// the next serve on the state dir, which creates no sandbox for the claim.
func TestServePoolAcrossRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", poolConfig(2))
	d := e.serve()
	made := map[string]bool{}
	for _, m := range d.waitPool(2).Members {
		made[m.Sandbox] = true
	}
	d.stop()
	// Embedded, the store still shows them ready.
	var ps []apiv1.Pool
	json.Unmarshal([]byte(e.must("sessions", "--pool", "--json").stdout), &ps)
	if len(ps) != 1 || ps[0].Ready != 2 {
		t.Fatalf("after the first serve stopped: %+v", ps)
	}
	for _, m := range ps[0].Members {
		if !procAlive(e, m.Sandbox) {
			t.Fatalf("member %s is not running after the first serve stopped", m.Sandbox)
		}
	}
	d2 := e.serve()
	res := d2.exec("task:1", `{"argv":["true"]}`)
	if !res.Pooled || !made[res.Sandbox] {
		t.Fatalf("second serve's first exec: %+v, want a claim of a member of the first serve %v", res, made)
	}
	if got := d2.metricLine(`berth_sandbox_creates_total{cause="new",driver="local"}`); got != "" {
		t.Errorf("the second serve created a sandbox of its own for the claim: berth_sandbox_creates_total{cause=new} %s", got)
	}
	if got := d2.metricLine(`berth_pool_claims_total{driver="local",scope="task:*"}`); got != "1" {
		t.Errorf("berth_pool_claims_total %q, want 1", got)
	}
	e.drainPools(d2)
}

// regexpLine reports whether a line of out matches the regular expression re.
func regexpLine(out, re string) bool {
	return regexp.MustCompile("(?m)" + re).MatchString(out)
}

// procAlive reports whether a process of e's state dir names sandbox (its agent,
// whose argv or environment holds the sandbox's directory).
func procAlive(e *env, sandbox string) bool {
	for _, p := range procsOf(e.state) {
		for _, s := range append(slices.Clone(p.cmdline), p.environ...) {
			if strings.Contains(s, sandbox) {
				return true
			}
		}
	}
	return false
}
