package server

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/berth-sh/berth/registry"
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
	m.reg.MustRegister(m.execs, m.latency, m.creates, m.removes, m.retention, m.restarts,
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

// RegistryOptions are the registry options that feed m (sandbox events) and that
// berth serve's registries need: plugin supervision (registry.WithSupervision with
// its default backoff), whose restarts m counts.
func (m *Metrics) RegistryOptions() []registry.Option {
	return []registry.Option{
		registry.WithSandboxEvents(m.sandboxEvent),
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

func (m *Metrics) restarted(driver string, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	m.restarts.WithLabelValues(driver, result).Inc()
}

// exec counts one exec answer that began at start.
func (m *Metrics) exec(driver string, shell, stream bool, res ExecResult, err error, start time.Time) {
	mode := "plain"
	if shell {
		mode = "shell"
	}
	m.execMode(driver, mode, stream, res, err, start)
}

// execMode counts one exec of mode (plain, shell, tty) that began at start.
func (m *Metrics) execMode(driver, mode string, stream bool, res ExecResult, err error, start time.Time) {
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

func (c sessionsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.srv
	if s == nil {
		return
	}
	ref := s.acquire()
	defer s.release(ref)
	ctx, cancel := context.WithTimeout(context.Background(), sessionsScrapeTimeout)
	defer cancel()
	list, err := ref.reg.Sessions(ctx)
	if err != nil {
		s.log.Warn("metrics: listing sessions", "error", err)
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
