package server

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// MetricsNamespace prefixes every berth series (berth_...).
const MetricsNamespace = "berth"

// sessionsScrapeTimeout bounds the store read and the drivers' Inspect calls that
// berth_sessions costs a scrape.
const sessionsScrapeTimeout = 10 * time.Second

// Metrics are berth serve's Prometheus series, served at GET /metrics in the text
// exposition format (promhttp): the Go runtime's and the process's standard series
// (go_*, process_*) and berth's own, documented in docs/api.md:
//
//	berth_sessions{driver,state}                          gauge, read at scrape time (registry.Sessions)
//	berth_calls_in_flight                                 gauge
//	berth_execs_total{driver,mode,stream,outcome}         counter
//	berth_exec_duration_seconds{driver,mode,stream}       histogram, from request to result
//	berth_sandbox_creates_total{driver,cause}             counter (registry.SandboxEvent causes)
//	berth_sandbox_removes_total{driver,cause}             counter
//	berth_retention_actions_total{driver,action,cause}    counter (stop, remove, adopt by prune or expiry)
//	berth_plugin_restarts_total{driver,result}            counter (result "ok" or "failed")
//	berth_pool_size{scope,driver}                         gauge, a rule's pool size (config), at scrape time
//	berth_pool_members{scope,driver,state}                gauge, at scrape time (registry.Pools)
//	berth_pool_oldest_member_age_seconds{scope,driver}    gauge, the oldest ready member's age, at scrape time
//	berth_pool_claims_total{scope,driver}                 counter (registry.PoolClaim)
//	berth_pool_misses_total{scope,driver}                 counter, a new session found no ready member
//	berth_pool_refill_seconds{scope,driver}               histogram, a new member's reservation to its agent's answer
//	berth_pool_removes_total{scope,driver,cause}          counter (cause drift, max_idle, failed, stale)
//
// mode is "plain" (argv), "shell" or "tty" (the WebSocket); stream "true" for an
// NDJSON answer and for a TTY; outcome
// "exited", "timed_out" or the error kind of a failed call. Make one with
// NewMetrics, open the registry with its RegistryOptions, and pass it to New with
// WithMetrics; Reload's registries must be opened with the same options.
type Metrics struct {
	reg       *prometheus.Registry
	execs     *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	creates   *prometheus.CounterVec
	removes   *prometheus.CounterVec
	retention *prometheus.CounterVec
	restarts  *prometheus.CounterVec
	claims    *prometheus.CounterVec
	misses    *prometheus.CounterVec
	refill    *prometheus.HistogramVec
	poolGone  *prometheus.CounterVec
	srv       *Server
}

// NewMetrics returns berth's metrics on a registry of their own (never
// prometheus.DefaultRegisterer, so two servers in one process do not collide).
func NewMetrics() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.execs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: MetricsNamespace, Name: "execs_total",
		Help: "Execs answered, by driver, mode (plain, shell or tty), stream (NDJSON answer or TTY, or not) and outcome (exited, timed_out, or the error kind)."},
		[]string{"driver", "mode", "stream", "outcome"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: MetricsNamespace, Name: "exec_duration_seconds",
		Help:    "Exec latency from the request's arrival to its result, by driver, mode and stream.",
		Buckets: []float64{.001, .002, .003, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}},
		[]string{"driver", "mode", "stream"})
	m.creates = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: MetricsNamespace, Name: "sandbox_creates_total",
		Help: "Sandboxes created, by driver and cause (new, recreated, moved)."}, []string{"driver", "cause"})
	m.removes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: MetricsNamespace, Name: "sandbox_removes_total",
		Help: "Sandboxes removed, by driver and cause (rm, recreate, close, failed_create, or retention's: idle, age, orphan, ...)."}, []string{"driver", "cause"})
	m.retention = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: MetricsNamespace, Name: "retention_actions_total",
		Help: "Actions of retention and reconcile carried out (stop, remove, adopt), by driver, action and cause."}, []string{"driver", "action", "cause"})
	m.restarts = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: MetricsNamespace, Name: "plugin_restarts_total",
		Help: "Restarts of crashed driver plugins, by driver and result (ok, failed)."}, []string{"driver", "result"})
	m.claims = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: MetricsNamespace, Name: "pool_claims_total",
		Help: "Warm pool members claimed by new sessions, by the rule's scope and driver."}, []string{"scope", "driver"})
	m.misses = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: MetricsNamespace, Name: "pool_misses_total",
		Help: "New sessions of a rule with a warm pool that found no ready member (their sandbox was created), by scope and driver."}, []string{"scope", "driver"})
	m.refill = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: MetricsNamespace, Name: "pool_refill_seconds",
		Help:    "Time to make a warm pool member, from its reservation to its agent's answer, by scope and driver.",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}},
		[]string{"scope", "driver"})
	m.poolGone = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: MetricsNamespace, Name: "pool_removes_total",
		Help: "Warm pool members removed without a claim, by scope, driver and cause (drift, max_idle, failed, stale)."}, []string{"scope", "driver", "cause"})
	m.reg.MustRegister(m.execs, m.latency, m.creates, m.removes, m.retention, m.restarts,
		m.claims, m.misses, m.refill, m.poolGone, poolsCollector{m},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: MetricsNamespace, Name: "calls_in_flight", Help: "API calls being answered now."},
			func() float64 {
				if m.srv == nil {
					return 0
				}
				return float64(m.srv.InFlight())
			}),
		sessionsCollector{m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// RegistryOptions are the registry options that feed m (sandbox and warm pool
// events) and that
// berth serve's registries need: plugin supervision (registry.WithSupervision with
// its default backoff), whose restarts m counts.
func (m *Metrics) RegistryOptions() []registry.Option {
	return []registry.Option{
		registry.WithSandboxEvents(m.sandboxEvent),
		registry.WithPoolEvents(m.poolEvent),
		registry.WithSupervision(registry.SupervisePolicy{OnRestart: m.restarted}),
	}
}

// Gatherer returns the Prometheus registry that holds m's series.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

func (m *Metrics) sandboxEvent(ev registry.SandboxEvent) {
	switch ev.Action {
	case registry.EventCreate:
		m.creates.WithLabelValues(ev.Driver, ev.Cause).Inc()
	case registry.EventRemove:
		m.removes.WithLabelValues(ev.Driver, ev.Cause).Inc()
	}
	if ev.Retention {
		m.retention.WithLabelValues(ev.Driver, ev.Action, ev.Cause).Inc()
	}
}

func (m *Metrics) poolEvent(ev registry.PoolEvent) {
	switch ev.Kind {
	case registry.PoolClaim:
		m.claims.WithLabelValues(ev.Scope, ev.Driver).Inc()
	case registry.PoolMiss:
		m.misses.WithLabelValues(ev.Scope, ev.Driver).Inc()
	case registry.PoolReady:
		m.refill.WithLabelValues(ev.Scope, ev.Driver).Observe(ev.Took.Seconds())
	case registry.PoolRemove:
		m.poolGone.WithLabelValues(ev.Scope, ev.Driver, ev.Cause).Inc()
	}
}

func (m *Metrics) restarted(driver string, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	m.restarts.WithLabelValues(driver, result).Inc()
}

// exec counts one exec answer that began at start.
func (m *Metrics) exec(driver string, shell, stream bool, res apiv1.ExecResult, err error, start time.Time) {
	mode := "plain"
	if shell {
		mode = "shell"
	}
	m.execMode(driver, mode, stream, res, err, start)
}

// execMode counts one exec of mode (plain, shell, tty) that began at start.
func (m *Metrics) execMode(driver, mode string, stream bool, res apiv1.ExecResult, err error, start time.Time) {
	if driver == "" {
		driver = "unknown" // failed before a driver was chosen
	}
	st := strconv.FormatBool(stream)
	outcome := "exited"
	switch {
	case err != nil:
		outcome = errorInfo(err, "").Kind
	case res.TimedOut:
		outcome = "timed_out"
	}
	m.execs.WithLabelValues(driver, mode, st, outcome).Inc()
	if err == nil {
		m.latency.WithLabelValues(driver, mode, st).Observe(time.Since(start).Seconds())
	}
}

// sessionsCollector reports berth_sessions from the server's current registry at
// each scrape.
type sessionsCollector struct{ m *Metrics }

var sessionsDesc = prometheus.NewDesc(MetricsNamespace+"_sessions", "Recorded sessions, by driver and state (created, running, stopped, removed, missing, unknown).", []string{"driver", "state"}, nil)

func (c sessionsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sessionsDesc }

// scrape calls f with the server's current registry, held for the call, and a
// context bounded by sessionsScrapeTimeout; nothing without a server.
func (m *Metrics) scrape(f func(ctx context.Context, reg *registry.Registry, log hclog.Logger)) {
	s := m.srv
	if s == nil {
		return
	}
	ref := s.acquire()
	defer s.release(ref)
	ctx, cancel := context.WithTimeout(context.Background(), sessionsScrapeTimeout)
	defer cancel()
	f(ctx, ref.reg, s.log)
}

func (c sessionsCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.scrape(func(ctx context.Context, reg *registry.Registry, log hclog.Logger) {
		collectSessions(ctx, reg, log, ch)
	})
}

func collectSessions(ctx context.Context, reg *registry.Registry, log hclog.Logger, ch chan<- prometheus.Metric) {
	list, err := reg.Sessions(ctx)
	if err != nil {
		log.Warn("metrics: listing sessions", "error", err)
		ch <- prometheus.NewInvalidMetric(sessionsDesc, err)
		return
	}
	type key struct{ driver, state string }
	n := map[key]int{}
	for _, si := range list {
		n[key{si.Driver, si.State}]++
	}
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(v), k.driver, k.state)
	}
}

// serveMetrics is GET /metrics: the Prometheus text exposition of s's Metrics.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	s.metricsHandler.ServeHTTP(w, r)
}

// poolsCollector reports the warm pools' gauges from the server's current registry
// at each scrape (registry.Pools: the store only, no driver).
type poolsCollector struct{ m *Metrics }

var (
	poolSizeDesc    = prometheus.NewDesc(MetricsNamespace+"_pool_size", "Configured warm pool size of a rule, by scope and driver (0 for members left by an earlier config).", []string{"scope", "driver"}, nil)
	poolMembersDesc = prometheus.NewDesc(MetricsNamespace+"_pool_members", "Warm pool members, by scope, driver and state (ready, creating, claiming, draining).", []string{"scope", "driver", "state"}, nil)
	poolOldestDesc  = prometheus.NewDesc(MetricsNamespace+"_pool_oldest_member_age_seconds", "Age of the oldest ready warm pool member since it became ready, by scope and driver (0 with none ready).", []string{"scope", "driver"}, nil)
)

// poolStates are the states berth_pool_members always reports, 0 included.
var poolStates = []string{"ready", "creating", "claiming", "draining"}

func (c poolsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolSizeDesc
	ch <- poolMembersDesc
	ch <- poolOldestDesc
}

func (c poolsCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.scrape(func(ctx context.Context, reg *registry.Registry, log hclog.Logger) { collectPools(ctx, reg, log, ch) })
}

func collectPools(ctx context.Context, reg *registry.Registry, log hclog.Logger, ch chan<- prometheus.Metric) {
	list, err := reg.Pools(ctx)
	if err != nil {
		log.Warn("metrics: listing warm pools", "error", err)
		ch <- prometheus.NewInvalidMetric(poolMembersDesc, err)
		return
	}
	now := time.Now()
	for _, p := range list {
		ch <- prometheus.MustNewConstMetric(poolSizeDesc, prometheus.GaugeValue, float64(p.Size), p.Scope, p.Driver)
		counts := map[string]int{"ready": p.Ready, "creating": p.Creating, "claiming": p.Claiming, "draining": p.Draining}
		for _, st := range poolStates {
			ch <- prometheus.MustNewConstMetric(poolMembersDesc, prometheus.GaugeValue, float64(counts[st]), p.Scope, p.Driver, st)
		}
		age := 0.0
		for _, m := range p.Members {
			if m.State == "ready" && !m.Ready.IsZero() {
				age = max(age, now.Sub(m.Ready).Seconds())
			}
		}
		ch <- prometheus.MustNewConstMetric(poolOldestDesc, prometheus.GaugeValue, age, p.Scope, p.Driver)
	}
}
