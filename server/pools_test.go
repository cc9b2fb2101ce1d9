package server

// Warm pools through the server in this process: GET /v1/pools, pooled in the
// exec and session answers, the berth_pool_* metrics, and RunPools across a
// Reload, over registries on the local driver (this test binary is the agent).

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"
	dto "github.com/prometheus/client_model/go"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

const poolConfig = `
scope "task:*" {
  driver = "local"
  pool {
    size     = 2
    max_idle = "30m"
  }
}
scope "*" {
  driver = "local"
}
`

// openPooled opens a registry on state with config src (local in this process)
// and m's registry options.
func openPooled(t *testing.T, state, src string, m *Metrics) *registry.Registry {
	t.Helper()
	cfg, err := config.Parse([]byte(src), filepath.Join(state, "..", "config.hcl"), config.WithKnownDrivers("local"))
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]registry.Option{registry.WithStateDir(state),
		registry.WithDriver(local.Name, func() backend.TerminalBackend { return local.New() })}, m.RegistryOptions()...)
	reg, err := registry.Open(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func getJSON[T any](t *testing.T, url string) T {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v T
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &v) != nil {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return v
}

func postExec(t *testing.T, base, session string) apiv1.ExecResult {
	t.Helper()
	resp, err := http.Post(base+"/v1/sessions/"+session+"/exec", "application/json", strings.NewReader(`{"argv":["true"]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var res apiv1.ExecResult
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &res) != nil || res.ExitCode != 0 {
		t.Fatalf("exec in %s: %d %s", session, resp.StatusCode, b)
	}
	return res
}

// metric returns the value of the series name{labels} in m (a counter's, a
// gauge's, or a histogram's sample count); ok is false when there is none.
func metric(t *testing.T, m *Metrics, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, s := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range s.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				return s.GetCounter().GetValue(), true
			case dto.MetricType_GAUGE:
				return s.GetGauge().GetValue(), true
			case dto.MetricType_HISTOGRAM:
				return float64(s.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

// pooledServer serves a registry of poolConfig (local in this process) with its
// metrics; when the test ends, sessions are removed, the pool drained and the
// server shut down.
func pooledServer(t *testing.T, sessions ...string) (*registry.Registry, *httptest.Server, *Metrics) {
	t.Helper()
	ctx := context.Background()
	m := NewMetrics()
	reg := openPooled(t, filepath.Join(t.TempDir(), "state"), poolConfig, m)
	s := New(reg, WithMetrics(m))
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		for _, n := range sessions {
			s.Registry().RemoveSession(ctx, n)
		}
		s.Registry().DrainPools(ctx)
		s.Shutdown(ctx)
	})
	return reg, ts, m
}

// A miss, a fill and a claim, counted; GET /v1/pools and pooled in the answers.
func TestPoolsInProcess(t *testing.T) {
	ctx := context.Background()
	reg, ts, m := pooledServer(t, "task:1", "task:2", "other")
	pool := map[string]string{"scope": "task:*", "driver": "local"}
	if ps := getJSON[[]apiv1.Pool](t, ts.URL+"/v1/pools"); len(ps) != 1 || ps[0].Size != 2 || ps[0].MaxIdleMS != 1800000 || ps[0].Ready != 0 || ps[0].Members == nil {
		t.Fatalf("before a fill: %+v", ps)
	}
	// Nothing fills the pool yet: a miss.
	if res := postExec(t, ts.URL, "task:1"); res.Pooled {
		t.Fatalf("exec with an empty pool: %+v, want a sandbox of its own", res)
	}
	if err := reg.FillPools(ctx); err != nil {
		t.Fatal(err)
	}
	ps := getJSON[[]apiv1.Pool](t, ts.URL+"/v1/pools")
	if len(ps) != 1 || ps[0].Ready != 2 || len(ps[0].Members) != 2 || ps[0].Members[0].State != "ready" || ps[0].Members[0].Ready.IsZero() {
		t.Fatalf("after a fill: %+v", ps)
	}
	res := postExec(t, ts.URL, "task:2")
	if !res.Pooled || (res.Sandbox != ps[0].Members[0].Sandbox && res.Sandbox != ps[0].Members[1].Sandbox) {
		t.Fatalf("exec with a full pool: %+v, want a member of %+v claimed", res, ps[0].Members)
	}
	if res := postExec(t, ts.URL, "other"); res.Pooled {
		t.Fatalf("a rule without a pool: %+v", res)
	}
	sess := getJSON[apiv1.Session](t, ts.URL+"/v1/sessions/task:2")
	if !sess.Pooled || sess.Sandbox != res.Sandbox {
		t.Fatalf("session task:2: %+v", sess)
	}
	if sess := getJSON[apiv1.Session](t, ts.URL+"/v1/sessions/task:1"); sess.Pooled {
		t.Fatalf("session task:1: %+v", sess)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"berth_pool_claims_total", pool, 1},
		{"berth_pool_misses_total", pool, 1},
		{"berth_pool_refill_seconds", pool, 2},
		{"berth_pool_size", pool, 2},
		{"berth_pool_members", map[string]string{"scope": "task:*", "state": "ready"}, 1},
		{"berth_pool_members", map[string]string{"scope": "task:*", "state": "creating"}, 0},
	} {
		if got, ok := metric(t, m, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if age, ok := metric(t, m, "berth_pool_oldest_member_age_seconds", pool); !ok || age <= 0 {
		t.Errorf("berth_pool_oldest_member_age_seconds = %v (present %v), want > 0", age, ok)
	}
	if err := reg.DrainPools(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := metric(t, m, "berth_pool_removes_total", map[string]string{"scope": "task:*", "cause": "drift"}); got != 1 {
		t.Errorf("berth_pool_removes_total{cause=drift} = %v after draining 1 member, want 1", got)
	}
}

// RunPools fills the current registry's pools, and after a Reload the new
// registry's loop runs: a config without the pool drains it.
func TestPoolsRunAcrossReload(t *testing.T) {
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "state")
	m := NewMetrics()
	s := New(openPooled(t, state, poolConfig, m), WithMetrics(m))
	ts := httptest.NewServer(s.Handler())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.RunPools(runCtx, 0)
	}()
	t.Cleanup(func() {
		stop()
		<-done
		ts.Close()
		s.Registry().RemoveSession(ctx, "task:1")
		s.Registry().DrainPools(ctx)
		s.Shutdown(ctx)
	})
	ready := func(n int) func() bool {
		return func() bool {
			ps := getJSON[[]apiv1.Pool](t, ts.URL+"/v1/pools")
			return len(ps) == 1 && ps[0].Ready == n && len(ps[0].Members) == n
		}
	}
	testwait.Until(t, "RunPools to fill the pool of 2", ready(2))
	if res := postExec(t, ts.URL, "task:1"); !res.Pooled {
		t.Fatalf("exec: %+v, want a claim", res)
	}
	testwait.Until(t, "RunPools to refill the pool after the claim", ready(2))

	s.Reload(openPooled(t, state, "scope \"*\" {\n  driver = \"local\"\n}\n", m))
	// An entry is dropped before its member is removed and counted: wait for both.
	testwait.Until(t, "the new registry's loop to drain the pool its config no longer has", func() bool {
		n, _ := metric(t, m, "berth_pool_removes_total", map[string]string{"scope": "task:*", "cause": "drift"})
		return n == 2 && len(getJSON[[]apiv1.Pool](t, ts.URL+"/v1/pools")) == 0
	})
	// The claimed member stays the session's.
	if sess := getJSON[apiv1.Session](t, ts.URL+"/v1/sessions/task:1"); !sess.Pooled || sess.State != "running" {
		t.Errorf("session task:1 after the reload: %+v", sess)
	}
	stop()
	<-done // RunPools returns when its context ends
}

// A TTY of a new session of a rule with a pool claims a member: its started message
// and its result say pooled, as the exec answers do.
func TestPoolTTYInProcess(t *testing.T) {
	ctx := context.Background()
	reg, ts, m := pooledServer(t, "task:tty")
	if err := reg.FillPools(ctx); err != nil {
		t.Fatal(err)
	}
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ts.URL, "http")+"/v1/sessions/task:tty/tty?argv=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	var msgs []apiv1.TTYMessage
	for len(msgs) == 0 || msgs[len(msgs)-1].Type != "result" {
		typ, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("after %+v: %v", msgs, err)
		}
		if typ == websocket.MessageText {
			var msg apiv1.TTYMessage
			if err := json.Unmarshal(b, &msg); err != nil {
				t.Fatalf("message %q: %v", b, err)
			}
			msgs = append(msgs, msg)
		}
	}
	first, last := msgs[0], msgs[len(msgs)-1]
	if first.Type != "started" || !first.Pooled || first.Sandbox == "" {
		t.Errorf("first message %+v, want started and pooled", first)
	}
	if last.Result == nil || last.Result.ExitCode != 0 || !last.Result.Pooled || last.Result.Sandbox != first.Sandbox {
		t.Errorf("last message %+v (%+v), want the result, pooled, of %s", last, last.Result, first.Sandbox)
	}
	if got, _ := metric(t, m, "berth_pool_claims_total", map[string]string{"scope": "task:*", "driver": "local"}); got != 1 {
		t.Errorf("berth_pool_claims_total = %v after the TTY's claim, want 1", got)
	}
}
