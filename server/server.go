// Package server is berth serve's HTTP API v1 over one long-lived registry: exec
// (plain JSON or NDJSON events), an interactive TTY over a WebSocket, files (tar
// streams both ways, small files' bytes), sessions (list, get, close, stop, rm,
// recreate) and health, with JSON errors whose HTTP status comes from berth's error kinds in
// one place (Kinds). docs/api.md describes the API and docs/openapi.yaml is its
// OpenAPI 3.1 document; Routes lists what the server serves, and a test checks the
// two against each other.
//
// The server takes a *registry.Registry and never opens one itself: the caller
// (berth serve, in cli) resolves the settings, opens the registry, listens,
// and hands a new registry to Reload when the config changes. Sandboxes and
// background jobs are never stopped by the server, not even by Shutdown.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// Limits of a request, unless an option sets others.
const (
	// DefaultMaxRequestBody is the largest request body, in bytes (1 MiB); a larger
	// one is answered 413 (too_large) and its connection closed.
	DefaultMaxRequestBody = 1 << 20
	// MaxHeaderBytes bounds a request's header lines (64 KiB); net/http answers a
	// larger header 431.
	MaxHeaderBytes = 64 << 10
	// ReadHeaderTimeout is how long a request's header may take to arrive (10 s);
	// net/http closes the connection of a slower one.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout is how long an idle keep-alive connection is kept (2 min).
	IdleTimeout = 2 * time.Minute
	// killWait is how long Shutdown waits, once it has cancelled the calls still
	// running at the end of its grace, for their trees to be killed and their
	// answers written before it closes their connections.
	killWait = 5 * time.Second
)

// Option configures New.
type Option func(*Server)

// WithLogger sets the server's logger (default: none).
func WithLogger(l hclog.Logger) Option { return func(s *Server) { s.log = l } }

// WithToken makes every request need the header "Authorization: Bearer TOKEN",
// compared in constant time; other requests are answered 401 (unauthorized). An
// empty token is no token: berth serve refuses a TCP listener without one.
func WithToken(token string) Option {
	return func(s *Server) {
		if token == "" {
			s.token = nil
			return
		}
		sum := sha256.Sum256([]byte(token))
		s.token = sum[:]
	}
}

// WithMetrics makes the server count into m (served at GET /metrics); open its
// registries with m.RegistryOptions() so that sandbox events and plugin restarts
// are counted too. Default: metrics of its own, without the registry's events.
func WithMetrics(m *Metrics) Option { return func(s *Server) { s.metrics = m } }

// WithPruneInterval sets how often RunRetention prunes when it is given no
// interval of its own, and what GET /v1/status reports as prune_interval_ms (the
// CLI's berth prune --watch tells its user so). Default 0: status reports 0, and
// RunRetention uses DefaultRetentionInterval.
func WithPruneInterval(d time.Duration) Option { return func(s *Server) { s.pruneEvery = d } }

// WithConfigCheck sets how POST /v1/config/check checks the daemon's config file
// (its path; berth serve passes berth config check's checks). Without it that
// route answers 501 (unsupported).
func WithConfigCheck(f func(ctx context.Context, path string) apiv1.ConfigCheck) Option {
	return func(s *Server) { s.checkConfig = f }
}

// WithVersion sets the version that health reports.
func WithVersion(v string) Option { return func(s *Server) { s.version = v } }

// WithMaxRequestBody sets the largest request body in bytes (default
// DefaultMaxRequestBody); n <= 0 keeps the default.
func WithMaxRequestBody(n int64) Option {
	return func(s *Server) {
		if n > 0 {
			s.maxBody = n
		}
	}
}

// WithBodyTimeout sets how long a request body may take to arrive, and a streamed
// exec's body to end once its answer is written (then its connection is closed);
// default DefaultBodyTimeout; d <= 0 keeps the default.
func WithBodyTimeout(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.bodyTimeout = d
		}
	}
}

// Server is the HTTP API over a registry. Make it with New, serve listeners with
// Serve, swap the registry with Reload, and end it with Shutdown.
type Server struct {
	log         hclog.Logger
	token       []byte // sha256 of the bearer token, nil for none
	version     string
	maxBody     int64
	bodyTimeout time.Duration
	http        *http.Server
	handler     http.Handler

	metrics        *Metrics
	metricsHandler http.Handler
	pruneEvery     time.Duration                                            // WithPruneInterval: RunRetention's and Status's
	checkConfig    func(ctx context.Context, path string) apiv1.ConfigCheck // WithConfigCheck
	audit          *auditLog                                                // nil: no audit log

	callsCtx    context.Context // the base of every request's context
	cancelCalls context.CancelFunc

	mu      sync.Mutex
	cur     *regRef
	closing bool
	// shutting is closed when Shutdown starts: answers already written stop
	// waiting for their request bodies' end (input.finish).
	shutting chan struct{}
	calls    int           // handlers running
	idle     chan struct{} // closed when calls drops to 0 while closing
}

// regRef is a registry and the calls that use it; a registry that Reload replaced
// is closed when its last call ends.
type regRef struct {
	reg     *registry.Registry
	n       int
	retired bool
	gone    chan struct{} // closed when it is retired (RunPools stops its loop)
}

func newRef(reg *registry.Registry) *regRef { return &regRef{reg: reg, gone: make(chan struct{})} }

// retire marks ref replaced or shut down; s.mu is held.
func (ref *regRef) retire() {
	if !ref.retired {
		ref.retired = true
		close(ref.gone)
	}
}

// New returns a server over reg, which it owns from now on: Shutdown (or a Reload
// that replaces it, once its calls have ended) closes it.
func New(reg *registry.Registry, opts ...Option) *Server {
	s := &Server{
		log:         hclog.NewNullLogger(),
		maxBody:     DefaultMaxRequestBody,
		bodyTimeout: apiv1.DefaultBodyTimeout,
		cur:         newRef(reg),
		shutting:    make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	if s.metrics == nil {
		s.metrics = NewMetrics()
	}
	s.metrics.srv = s
	s.metricsHandler = promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{ErrorLog: s.log.StandardLogger(nil)})
	s.callsCtx, s.cancelCalls = context.WithCancel(context.Background())
	s.handler = s.routes()
	s.http = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return s.callsCtx },
		ConnContext:       connContext,
		ErrorLog:          s.log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	return s
}

// Metrics returns the server's metrics (WithMetrics, or its own).
func (s *Server) Metrics() *Metrics { return s.metrics }

// Handler returns the server's HTTP handler (what Serve serves), for tests and for
// programs that serve it themselves.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve answers requests on ln until Shutdown; it then returns nil. Other errors
// are those of accepting connections. Serve may be called for several listeners.
func (s *Server) Serve(ln net.Listener) error {
	err := s.http.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Registry returns the registry that new calls use now.
func (s *Server) Registry() *registry.Registry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.reg
}

// Reload makes new calls use reg; calls running on the old registry finish on it,
// and it is closed (its plugins ended) when the last of them ends. The server owns
// reg from now on.
func (s *Server) Reload(reg *registry.Registry) {
	s.mu.Lock()
	old := s.cur
	s.cur = newRef(reg)
	old.retire()
	done := old.n == 0
	s.mu.Unlock()
	if done {
		old.reg.Close()
	}
}

// acquire returns the current registry for one call; release it when the call ends.
func (s *Server) acquire() *regRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur.n++
	return s.cur
}

func (s *Server) release(ref *regRef) {
	s.mu.Lock()
	ref.n--
	done := ref.n == 0 && ref.retired
	s.mu.Unlock()
	if done {
		ref.reg.Close()
	}
}

// enter counts a handler in; false when the server is shutting down.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.calls++
	return true
}

func (s *Server) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls--
	if s.calls == 0 && s.closing && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
}

// InFlight returns the number of calls being answered now.
func (s *Server) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Shutdown stops accepting connections and calls, lets the calls in flight finish
// until ctx is done (berth serve's --shutdown-grace), then cancels those still
// running (the agent kills their process trees), waits briefly for their answers
// and closes every connection. Last it closes the registry: the plugins it launched
// end, while sandboxes and background jobs keep running for the next berth serve
// to adopt. It returns ctx's error when the grace ran out, else nil.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.closing {
		close(s.shutting)
	}
	s.closing = true
	idle := make(chan struct{})
	if s.calls == 0 {
		close(idle)
	} else {
		s.idle = idle
	}
	s.mu.Unlock()

	// http.Server.Shutdown returns once every connection is idle: every answer,
	// streamed ones included, written to its end.
	shutDone := make(chan struct{})
	go func() {
		s.http.Shutdown(context.Background())
		close(shutDone)
	}()
	var graceErr error
	select {
	case <-shutDone:
	case <-ctx.Done():
		graceErr = ctx.Err()
		s.log.Warn("shutdown grace over: cancelling the calls still running", "calls", s.InFlight())
		s.cancelCalls()
		t := time.NewTimer(killWait)
		select {
		case <-shutDone:
		case <-t.C:
		}
		t.Stop()
		s.http.Close()
		<-shutDone
	}
	// http.Server.Shutdown does not wait for hijacked connections (the TTYs'
	// WebSockets), which the count of calls does: the grace bounds them too.
	if graceErr == nil {
		select {
		case <-idle:
		case <-ctx.Done():
			graceErr = ctx.Err()
			s.log.Warn("shutdown grace over: cancelling the calls still running", "calls", s.InFlight())
			s.cancelCalls()
		}
	}
	<-idle
	s.cancelCalls()
	s.mu.Lock()
	ref := s.cur
	ref.retire()
	done := ref.n == 0
	s.mu.Unlock()
	if done {
		ref.reg.Close()
	}
	if s.audit != nil {
		if err := s.audit.close(); err != nil {
			s.log.Error("closing the audit log", "error", err)
		}
	}
	return graceErr
}

// authorized reports whether r carries the bearer token (always, without one).
func (s *Server) authorized(r *http.Request) bool {
	if s.token == nil {
		return true
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(sum[:], s.token) == 1
}
