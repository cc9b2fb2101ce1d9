package cli

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/client"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/flock"
	"github.com/berth-sh/berth/internal/sigstart"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// serveExecutable is the HTTP API server's executable (cmd/berth-serve), found
// beside the berth binary: berth's command line plus package server, which links
// Prometheus' client (whose initialisers cost every process that links them about
// a millisecond at start). `berth serve` runs it in its own place.
const serveExecutable = "berth-serve"

// Server is the HTTP API's server under `berth serve`: package server's, which
// cmd/berth-serve hands to Main (WithServer), so that this package links neither
// it nor Prometheus.
type Server interface {
	// RegistryOptions are the options that every registry given to the server
	// must be opened with (its metrics' observers), the first and each reload's.
	RegistryOptions() []registry.Option
	// OpenAudit makes sure the audit log at path can be written (creating it);
	// its error names the path.
	OpenAudit(path string) error
	// Start returns the server of reg with o, not yet serving.
	Start(reg *registry.Registry, o ServerOptions) Daemon
}

// ServerOptions are berth serve's settings of the server (its flags, resolved).
type ServerOptions struct {
	Log     hclog.Logger // the server's log (berth serve's stderr)
	Token   string       // the bearer token every request must carry; "" for none
	Version string       // berth's version, for GET /v1/status
	// MaxRequestBody bounds a request body, in bytes; BodyTimeout its arrival.
	MaxRequestBody int64
	BodyTimeout    time.Duration
	// AuditPath is the audit log ("" for none), rotated at AuditMaxMB MiB, with
	// AuditKeep rotated files kept.
	AuditPath  string
	AuditMaxMB int
	AuditKeep  int
	// PruneInterval is how often RunRetention prunes.
	PruneInterval time.Duration
	// ConfigCheck answers POST /v1/config/check.
	ConfigCheck func(ctx context.Context, path string) apiv1.ConfigCheck
}

// Daemon is one running server: server.Server's methods (RunRetention with the
// interval of ServerOptions.PruneInterval, and no report hook).
type Daemon interface {
	// Serve answers the API on ln until Shutdown; its error is the listener's.
	Serve(ln net.Listener) error
	// RunRetention prunes every PruneInterval until ctx ends.
	RunRetention(ctx context.Context)
	// RunPools keeps the warm pools filled, checking every interval, until ctx ends.
	RunPools(ctx context.Context, interval time.Duration)
	// InFlight counts the calls being answered.
	InFlight() int
	// Reload makes the server use reg (opened with RegistryOptions) from now on.
	Reload(reg *registry.Registry)
	// Shutdown stops taking calls and waits for those in flight until ctx ends,
	// then cancels them; the error is ctx's when it had to.
	Shutdown(ctx context.Context) error
}

// serveSocket is the name of berth serve's default unix socket in the state dir;
// serveLock the name of the lock file that makes it one per state dir.
const (
	serveSocket = client.SocketName
	serveLock   = "serve.lock"
)

// minTokenBytes is the shortest bearer token berth serve accepts.
const minTokenBytes = 16

type serveFlags struct {
	listen        string
	tokenFile     string
	tlsCert       string
	tlsKey        string
	pruneInterval time.Duration
	poolInterval  time.Duration
	grace         time.Duration
	logJSON       bool
	maxBody       string
	bodyTimeout   time.Duration
	auditLog      string
	auditMaxSize  string
	auditKeep     int
}

func newServeCmd(g *globals) *cobra.Command {
	f := &serveFlags{pruneInterval: apiv1.DefaultRetentionInterval, poolInterval: registry.DefaultPoolInterval, grace: 30 * time.Second, bodyTimeout: apiv1.DefaultBodyTimeout}
	cmd := &cobra.Command{
		Use:   "serve [--listen ADDR] [--token-file FILE] [--tls-cert FILE --tls-key FILE]",
		Short: "Run berth as a long-lived service with an HTTP API",
		Long: `Run berth as a service: one process per state dir holds one registry (driver
plugins launched once), prunes every --prune-interval (retention and reconcile, as
berth prune), keeps the rules' warm pools filled (checked every --pool-interval
and after each claim's call), and answers the HTTP API v1 (docs/api.md) on a unix socket in the
state dir (STATE/berth.sock, mode 0600) unless --listen says otherwise.

A TCP listener (--listen tcp://127.0.0.1:PORT) needs --token-file: every request
must carry "Authorization: Bearer TOKEN". A non-loopback address also needs TLS
(--tls-cert and --tls-key).

SIGHUP reloads the config file (checked first: a bad file keeps the running config
and logs why, with file:line:col). SIGTERM or SIGINT shut down: no new calls, calls
in flight may finish within --shutdown-grace, then they are cancelled (their
process trees killed). Sandboxes, background jobs and ready pool members are never
stopped: the next berth serve adopts them. Logs go to stderr (JSON with --log-json).

The server is its own executable, berth-serve, found beside berth (built with it:
go build ./cmd/...): berth serve runs it in its place, with the same arguments and
process id.`,
		Example: `  berth serve
  berth serve --listen tcp://127.0.0.1:7878 --token-file ~/.config/berth/token
  curl --unix-socket ~/.local/state/berth/berth.sock -H 'Content-Type: application/json' \
    -d '{"argv":["sh","-c","echo hi; exit 3"]}' http://berth/v1/sessions/chat:1/exec`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.server == nil {
				return execServe(g)
			}
			return runServe(g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "", "where to listen: unix:///PATH or tcp://HOST:PORT (default unix://STATE/berth.sock)")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the bearer token that every request must carry (required for tcp://; mode 0600, at least 16 bytes)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "TLS certificate file (PEM) for a tcp:// listener; required for a non-loopback address")
	fl.StringVar(&f.tlsKey, "tls-key", "", "TLS private key file (PEM) for --tls-cert")
	fl.Var(durationValue{&f.pruneInterval}, "prune-interval", "prune (retention and reconcile) every INTERVAL")
	fl.Var(durationValue{&f.poolInterval}, "pool-interval", "check the warm pools (refill, max_idle, drift) every INTERVAL; a claim refills when its call ends (250ms at the latest)")
	fl.Var(durationValue{&f.grace}, "shutdown-grace", "on SIGTERM/SIGINT, how long calls in flight may go on before they are cancelled")
	fl.BoolVar(&f.logJSON, "log-json", false, "log JSON lines on stderr instead of text")
	fl.StringVar(&f.maxBody, "max-request-body", "1m", "largest request body (a size: 64k, 1m); larger ones are answered 413")
	fl.Var(durationValue{&f.bodyTimeout}, "request-timeout", "how long a request body may take to arrive (slower ones are answered 408), and a streamed exec's body to end after its answer (then its connection is closed)")
	fl.StringVar(&f.auditLog, "audit-log", "", "audit log of calls, JSON lines (default STATE/audit.log; \"off\" writes none)")
	fl.StringVar(&f.auditMaxSize, "audit-max-size", strconv.Itoa(apiv1.DefaultAuditMaxMB)+"m", "rotate the audit log when it reaches this size (whole MiB, at least 1m)")
	fl.IntVar(&f.auditKeep, "audit-keep", apiv1.DefaultAuditKeep, "how many rotated audit logs to keep")
	return takesSignals(cmd)
}

// listenAddr is a parsed --listen.
type listenAddr struct {
	network string // "unix" or "tcp"
	addr    string // a path or HOST:PORT
}

// parseListen parses --listen; "" is the socket in the state dir.
func parseListen(s, stateDir string) (listenAddr, error) {
	if s == "" {
		return listenAddr{"unix", filepath.Join(stateDir, serveSocket)}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return listenAddr{}, execrun.Usage("--listen %q: %v; use unix:///PATH or tcp://HOST:PORT", s, err)
	}
	switch u.Scheme {
	case "unix":
		p := u.Path
		if u.Host != "" || !filepath.IsAbs(p) {
			return listenAddr{}, execrun.Usage("--listen %q: a unix socket needs an absolute path: unix:///PATH", s)
		}
		return listenAddr{"unix", filepath.Clean(p)}, nil
	case "tcp":
		if u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") {
			return listenAddr{}, execrun.Usage("--listen %q: want tcp://HOST:PORT (e.g. tcp://127.0.0.1:7878)", s)
		}
		return listenAddr{"tcp", u.Host}, nil
	}
	return listenAddr{}, execrun.Usage("--listen %q: unknown scheme; use unix:///PATH or tcp://HOST:PORT", s)
}

// readToken reads a bearer token file: owner-only, at least minTokenBytes after
// trimming white space; what names where the path came from in errors
// (--token-file, BERTH_TOKEN_FILE).
func readToken(path, what string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", execrun.Usage("%s: %v", what, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", execrun.Usage("%s %s: mode %04o lets others read the token; chmod 600 %s", what, path, st.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", execrun.Usage("%s: %v", what, err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < minTokenBytes {
		return "", execrun.Usage("%s %s: the token is %d bytes; use at least %d (e.g. head -c 32 /dev/urandom | base64 > %s)", what, path, len(tok), minTokenBytes, path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", execrun.Usage("%s %s: the token holds white space; put one token on one line", what, path)
	}
	return tok, nil
}

// serveLevel is berth serve's log level: --log-level, else BERTH_LOG, else the
// config's log_level, else info.
func (g *globals) serveLevel(cfg *config.Config) (hclog.Level, error) {
	level, src := g.flagLogLevel()
	if level == "" {
		level, src = cfg.LogLevel, "log_level"
	}
	if level == "" {
		level = "info"
	}
	if !slices.Contains(config.LogLevels, level) {
		return hclog.NoLevel, execrun.Usage("%s %q is not a log level; use one of %v", src, level, config.LogLevels)
	}
	return hclog.LevelFromString(level), nil
}

// serveLogger is berth serve's logger: stderr, text or JSON, at serveLevel.
func (g *globals) serveLogger(cfg *config.Config, json bool) (hclog.Logger, error) {
	level, err := g.serveLevel(cfg)
	if err != nil {
		return nil, err
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       "berth",
		Level:      level,
		Output:     os.Stderr,
		JSONFormat: json,
	}), nil
}

// execServe runs berth-serve, found beside the berth binary, in this process's
// place with this command's arguments: the same process (its pid is what berth
// status and the lock file name), so a supervisor that started berth serve
// supervises the server. It returns nil when SIGINT or SIGTERM came before the
// exec, and an error when the exec fails.
func execServe(g *globals) error {
	self, err := g.self()
	if err != nil {
		return execrun.Failure(err)
	}
	exe := filepath.Join(filepath.Dir(self), serveExecutable)
	if _, err := os.Stat(exe); err != nil {
		return execrun.Failure(fmt.Errorf("berth serve runs %s, the HTTP API's server, from beside berth: %v; build both into one directory (CGO_ENABLED=0 go build -o DIR/ ./cmd/...) and run DIR/berth serve (go run builds one executable alone)", serveExecutable, err))
	}
	// berth-serve catches SIGINT, SIGTERM and SIGHUP again from its start
	// (sigstart) and handles them as serve does. Of those caught here until now, a
	// SIGINT or SIGTERM ends serve before it serves (exit 0, as its shutdown), and a
	// SIGHUP, which asks for a reload of a config that berth-serve has yet to read,
	// is dropped. SIGHUP stays ignored across the exec (the new program keeps an
	// ignored signal ignored until it catches it), so one sent meanwhile cannot end
	// the server; SIGINT and SIGTERM get their default action.
	sigs := sigstart.Take()
	signal.Ignore(syscall.SIGHUP)
	sigstart.Sync() // every signal sent before now is in sigs
	for pending := true; pending; {
		select {
		case s := <-sigs:
			if s != syscall.SIGHUP {
				return nil
			}
		default:
			pending = false
		}
	}
	signal.Stop(sigs)
	argv := append([]string{exe}, g.args...)
	err = syscall.Exec(exe, argv, os.Environ())
	signal.Reset(syscall.SIGHUP)
	return execrun.Failure(fmt.Errorf("running %s: %v", exe, err))
}

// openServeRegistry resolves the settings and opens a registry with log as its
// logger and srv's options.
func (g *globals) openServeRegistry(ctx context.Context, log hclog.Logger, srv Server) (*registry.Registry, error) {
	s, err := g.settings()
	if err != nil {
		return nil, err
	}
	opts := append(append(s.opts, registry.WithLogger(log)), srv.RegistryOptions()...)
	return registry.Open(ctx, s.cfg, opts...)
}

// serveProcs is how many Ps (GOMAXPROCS) berth serve runs with when $GOMAXPROCS
// does not say: half of what Go would use (its CPUs, or the container's CPU
// limit), at least one. The daemon relays: each exec is a few short bursts of work
// between waits on its client, the agent and the store, while the sandboxes'
// commands need the CPUs. With a P per CPU, every burst also woke an idle thread to
// look for more work, which on a 2-CPU VM was a fifth of serve's CPU per exec of
// `true` (0.94 against 0.68 ms with one P) and 10 % of the call's time.
func serveProcs() int { return max(1, runtime.GOMAXPROCS(0)/2) }

func runServe(g *globals, f *serveFlags) error {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(serveProcs())
	}
	sigs := sigstart.Take()
	// A log reader that went away (berth serve 2>&1 | head) must not end the daemon:
	// with SIGPIPE caught, a write to a closed stderr fails instead of killing it
	// (caught, not ignored, so the plugins and commands it starts get the default).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx := context.Background()
	if f.grace < 0 {
		return execrun.Usage("--shutdown-grace %v: must not be negative", f.grace)
	}
	if f.pruneInterval <= 0 {
		return execrun.Usage("--prune-interval %v: must be positive, e.g. 30s", f.pruneInterval)
	}
	if f.poolInterval <= 0 {
		return execrun.Usage("--pool-interval %v: must be positive, e.g. 10s", f.poolInterval)
	}
	if f.bodyTimeout <= 0 {
		return execrun.Usage("--request-timeout %v: must be positive, e.g. 30s", f.bodyTimeout)
	}
	maxBody, err := config.ParseBytes(f.maxBody)
	if err != nil {
		return execrun.Usage("--max-request-body: %v", err)
	}
	auditMax, err := config.ParseBytes(f.auditMaxSize)
	if err != nil || auditMax < 1<<20 {
		return execrun.Usage("--audit-max-size %q: want a size of at least 1m (whole MiB), e.g. 10m", f.auditMaxSize)
	}
	if f.auditKeep < 1 {
		return execrun.Usage("--audit-keep %d: keep at least 1 rotated file", f.auditKeep)
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return execrun.Usage("--tls-cert and --tls-key go together")
	}
	self, err := g.self()
	if err != nil {
		return execrun.Failure(err)
	}
	cfg, err := g.loadConfig(self)
	if err != nil {
		return execrun.Failure(err)
	}
	log, err := g.serveLogger(cfg, f.logJSON)
	if err != nil {
		return err
	}
	reg, err := g.openServeRegistry(ctx, log, g.server)
	if err != nil {
		return execrun.Failure(err)
	}
	stateDir := reg.StateDir()
	addr, err := parseListen(f.listen, stateDir)
	if err != nil {
		reg.Close()
		return err
	}
	var token string
	switch {
	case f.tokenFile != "":
		if token, err = readToken(f.tokenFile, "--token-file"); err != nil {
			reg.Close()
			return err
		}
	case addr.network == "tcp":
		reg.Close()
		return execrun.Usage("--listen %s: a TCP listener needs --token-file (a bearer token that every request must carry); refusing to serve without one", f.listen)
	}
	if addr.network == "unix" && f.tlsCert != "" {
		reg.Close()
		return execrun.Usage("--tls-cert and --tls-key are for a tcp:// listener; a unix socket is protected by its mode (0600)")
	}
	if addr.network == "tcp" && f.tlsCert == "" && !client.Loopback(addr.addr) {
		reg.Close()
		return execrun.Usage("--listen %s: a non-loopback address needs TLS: give --tls-cert and --tls-key (or listen on 127.0.0.1)", f.listen)
	}

	lock, err := lockServe(stateDir)
	if err != nil {
		reg.Close()
		return err
	}
	defer lock.Unlock(true)
	ln, cleanup, err := listen(addr, f)
	if err != nil {
		reg.Close()
		return err
	}
	defer cleanup()
	auditPath := f.auditLog
	switch auditPath {
	case "":
		auditPath = filepath.Join(stateDir, apiv1.AuditFile)
	case "off":
		auditPath = ""
	}
	if auditPath != "" {
		if err := g.server.OpenAudit(auditPath); err != nil {
			reg.Close()
			return execrun.Failure(fmt.Errorf("--audit-log: %v", err))
		}
	}

	srv := g.server.Start(reg, ServerOptions{Log: log, Token: token, Version: version,
		MaxRequestBody: maxBody, BodyTimeout: f.bodyTimeout,
		AuditPath: auditPath, AuditMaxMB: int((auditMax + (1 << 20) - 1) >> 20), AuditKeep: f.auditKeep, PruneInterval: f.pruneInterval,
		ConfigCheck: func(ctx context.Context, path string) apiv1.ConfigCheck { return checkConfig(ctx, g, path) }})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	retCtx, stopRetention := context.WithCancel(ctx)
	retDone := make(chan struct{})
	go func() {
		defer close(retDone)
		srv.RunRetention(retCtx)
	}()
	// The warm pools of the current registry (a reload stops the old one's loop
	// and starts the new one's).
	poolCtx, stopPools := context.WithCancel(ctx)
	poolsDone := make(chan struct{})
	go func() {
		defer close(poolsDone)
		srv.RunPools(poolCtx, f.poolInterval)
	}()
	where := "unix://" + addr.addr // the socket's path, however it was bound
	if addr.network == "tcp" {
		where = "tcp://" + ln.Addr().String() // the port, when it was 0
	}
	log.Info("berth serve ready", "audit_log", auditPath, "listen", where, "pid", os.Getpid(), "state_dir", stateDir, "config", cfgPath(reg), "version", version, "gomaxprocs", runtime.GOMAXPROCS(0))

	for {
		select {
		case err := <-served:
			stopRetention()
			stopPools()
			<-retDone
			<-poolsDone
			srv.Shutdown(ctx)
			if err != nil {
				return execrun.Failure(fmt.Errorf("serving %s: %v", addr.addr, err))
			}
			return nil
		case s := <-sigs:
			if s == syscall.SIGHUP {
				reload(ctx, g, srv, log, stateDir)
				continue
			}
			log.Info("shutting down", "signal", s.String(), "calls_in_flight", srv.InFlight(), "grace", f.grace)
			stopRetention()
			stopPools() // no new members; those ready stay for the next serve
			graceCtx, cancel := context.WithTimeout(ctx, f.grace)
			go func() {
				// A second SIGINT or SIGTERM ends the grace at once.
				for s := range sigs {
					if s != syscall.SIGHUP {
						log.Warn("second signal: cancelling the calls in flight now", "signal", s.String())
						cancel()
						return
					}
				}
			}()
			err := srv.Shutdown(graceCtx)
			cancel()
			<-retDone
			<-poolsDone
			if err != nil {
				log.Warn("shut down after cancelling the calls that outlasted the grace", "grace", f.grace)
			} else {
				log.Info("shut down")
			}
			return nil
		}
	}
}

func cfgPath(reg *registry.Registry) string {
	if p := reg.Config().Path; p != "" {
		return p
	}
	return "(built-in default)"
}

// reload reads the config again and, when it is good and keeps the state dir, makes
// the server use a new registry on it; otherwise it logs why and keeps the running
// one.
func reload(ctx context.Context, g *globals, srv Daemon, log hclog.Logger, stateDir string) {
	reg, err := g.openServeRegistry(ctx, log, g.server)
	if err != nil {
		log.Error("config reload refused; keeping the running config", "error", err.Error())
		return
	}
	if reg.StateDir() != stateDir {
		reg.Close()
		log.Error("config reload refused; keeping the running config", "error",
			fmt.Sprintf("the new config moves the state dir from %s to %s; restart berth serve for that", stateDir, reg.StateDir()))
		return
	}
	if level, err := g.serveLevel(reg.Config()); err == nil {
		log.SetLevel(level) // the config's log_level, unless a flag or BERTH_LOG sets one
	}
	srv.Reload(reg)
	log.Info("config reloaded", "config", cfgPath(reg), "rules", len(reg.Config().Rules))
}

// lockServe takes STATE/serve.lock, so that one berth serve runs per state dir, and
// writes this process's pid into it. Another holder's pid is named in the error.
func lockServe(stateDir string) (*flock.Held, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, execrun.Failure(fmt.Errorf("state dir %s: %v", stateDir, err))
	}
	path := filepath.Join(stateDir, serveLock)
	h, ok, err := flock.TryLock(path)
	if err != nil {
		return nil, execrun.Failure(err)
	}
	if !ok {
		pid := "unknown"
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) != "" {
			pid = strings.TrimSpace(string(b))
		}
		return nil, execrun.Failure(fmt.Errorf("another berth serve (pid %s) is running on state dir %s; stop it first (kill -TERM %s) or use another --state-dir", pid, stateDir, pid))
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		h.Unlock(true)
		return nil, execrun.Failure(err)
	}
	return h, nil
}

// listen opens the listener of addr: a unix socket of mode 0600 in a directory that
// no one else can write (a stale socket there is replaced: the lock says no berth
// serve uses it), or a TCP port, with TLS when f asks. cleanup closes it and removes
// the socket.
func listen(addr listenAddr, f *serveFlags) (net.Listener, func(), error) {
	if addr.network == "tcp" {
		ln, err := net.Listen("tcp", addr.addr)
		if err != nil {
			return nil, nil, execrun.Failure(fmt.Errorf("listening on %s: %v", addr.addr, err))
		}
		if f.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
			if err != nil {
				ln.Close()
				return nil, nil, execrun.Usage("--tls-cert/--tls-key: %v", err)
			}
			ln = tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}})
		}
		return ln, func() { ln.Close() }, nil
	}
	path := addr.addr
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	if err != nil {
		return nil, nil, execrun.Failure(fmt.Errorf("socket directory: %v", err))
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && (int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o022 != 0) {
		return nil, nil, execrun.Failure(fmt.Errorf("socket directory %s (mode %04o, owner uid %d): others could replace the socket; use a directory that only you (uid %d) can write", dir, st.Mode().Perm(), sys.Uid, os.Geteuid()))
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, nil, execrun.Failure(fmt.Errorf("%s exists and is not a socket; move it away", path))
		}
		os.Remove(path) // stale: we hold the serve lock
	}
	// A path past the 107 bytes a socket address holds is bound through the
	// directory's descriptor, /proc/self/fd/N/NAME, as berth dials its agents: a
	// deep state dir still gets its socket (clients dial it the same way).
	bindPath := path
	if len(path) > client.MaxSocketPath {
		d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, execrun.Failure(fmt.Errorf("socket directory: %v", err))
		}
		defer d.Close()
		bindPath = fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path))
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", bindPath)
	syscall.Umask(old)
	if err != nil {
		return nil, nil, execrun.Failure(fmt.Errorf("listening on %s: %v", path, err))
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, nil, execrun.Failure(err)
	}
	var ino uint64
	if fi, err := os.Lstat(path); err == nil {
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			ino = sys.Ino
		}
	}
	return ln, func() {
		ln.Close()
		// Remove the socket only while it is still ours.
		if fi, err := os.Lstat(path); err == nil {
			if sys, ok := fi.Sys().(*syscall.Stat_t); ok && sys.Ino == ino {
				os.Remove(path)
			}
		}
	}, nil
}
