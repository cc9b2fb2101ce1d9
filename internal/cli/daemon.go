package cli

// This file is the CLI's side of berth serve: finding the daemon a command should use
// (g.daemon), and daemonClient, the HTTP client that makes the calls of berth's
// commands through it (its methods mirror the registry's, so that each command has
// one code path, over an api: embedded or daemon).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/registry/config"
	"github.com/berth-sh/berth/server/apiv1"
)

// The environment that points berth's CLI at a daemon, or away from one.
const (
	// envHost names the daemon to use: unix:///PATH, https://HOST:PORT, or
	// http://LOOPBACK-IP:PORT. When set, the daemon must answer (no fallback).
	envHost = "BERTH_HOST"
	// envTokenFile is the file holding the bearer token of a TCP daemon.
	envTokenFile = "BERTH_TOKEN_FILE"
	// envTLSCA is a PEM file of the CA certificates that an https daemon's
	// certificate is checked against (default: the system's roots).
	envTLSCA = "BERTH_TLS_CA"
	// envNoDaemon=1 is --no-daemon.
	envNoDaemon = "BERTH_NO_DAEMON"
)

// statusTimeout bounds the status call that detection makes: a daemon that accepts
// connections but does not answer is an error, never a hang.
const statusTimeout = 10 * time.Second

// daemonClient is the CLI's one client of a running berth serve: the api methods
// (daemon_api.go), the files routes (daemoncopy.go) and the TTY WebSocket
// (daemonshell.go) all go through its http.Client (for a unix socket, one whose
// transport dials the socket; no Timeout, which would cut long copies and shells),
// with its bearer token.
type daemonClient struct {
	// where is what the user is told: unix:///PATH or the URL.
	where  string
	base   string // URL prefix of every call: http://berth or the URL
	client *http.Client
	token  string
	// status is what the daemon said of itself at detection.
	status apiv1.Status
}

// noDaemon reports why this command runs embedded whatever runs: --no-daemon,
// BERTH_NO_DAEMON, or a flag that changes how drivers are run in this process
// (--in-process, conformance's --plugin); "" when none does.
func (g *globals) noDaemon() string {
	switch {
	case g.noDaemonFlag:
		return "--no-daemon"
	case os.Getenv(envNoDaemon) != "" && os.Getenv(envNoDaemon) != "0":
		return envNoDaemon + "=" + os.Getenv(envNoDaemon)
	case g.inProcess:
		return "--in-process"
	case len(g.plugins) > 0:
		return "--plugin"
	}
	return ""
}

// daemon returns the berth serve that this command goes through, or nil to run
// embedded. With BERTH_HOST set that daemon must answer; otherwise it is the one
// whose socket STATE/berth.sock answers (no socket, or a stale one that refuses the
// connection: embedded). Before it is used, its status is checked against this
// command's state dir, config file and clock offset: a daemon that runs with other
// ones is refused with an error that names both and the fix, never used silently.
// --no-daemon and BERTH_NO_DAEMON=1 (see noDaemon) return nil at once.
//
// This is the one place that picks embedded or daemon: a command that can run
// through the daemon calls g.api (which calls this), or this directly.
func (g *globals) daemon(ctx context.Context) (*daemonClient, error) {
	if g.noDaemon() != "" {
		return nil, nil
	}
	want, err := g.wantedIdentity()
	if err != nil {
		return nil, err
	}
	phase.Mark("config")
	host := os.Getenv(envHost)
	var d *daemonClient
	if host != "" {
		if d, err = dialHost(host); err != nil {
			return nil, err
		}
	} else {
		sock := filepath.Join(want.StateDir, serveSocket)
		if _, err := os.Lstat(sock); err != nil {
			return nil, nil // no daemon
		}
		d = unixClient(sock)
	}
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	if err := d.get(sctx, "/v1/status", &d.status); err != nil {
		var refused bool
		if host == "" {
			refused = errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
		}
		if refused {
			return nil, nil // a socket that a berth serve left behind: nobody listens
		}
		fix := fmt.Sprintf("unset %s or use --no-daemon to run embedded", envHost)
		if host == "" {
			fix = "stop it, or use --no-daemon to run embedded"
		}
		return nil, fmt.Errorf("berth serve at %s does not answer its status call: %v; %s", d.where, err, fix)
	}
	if err := d.matches(want, host != ""); err != nil {
		return nil, err
	}
	phase.Mark("daemon")
	return d, nil
}

// identity is what a command and a daemon must agree on.
type identity struct {
	StateDir, Config    string
	ClockOffset         time.Duration
	explicitState       bool // --state-dir or BERTH_STATE_DIR
	explicitConfig      bool // --config or BERTH_CONFIG
	explicitClockOffset bool
}

// wantedIdentity resolves this command's state dir, config file and clock offset as
// an embedded run would.
func (g *globals) wantedIdentity() (identity, error) {
	self, err := g.self()
	if err != nil {
		return identity{}, err
	}
	cfg, err := g.loadConfig(self)
	if err != nil {
		return identity{}, err
	}
	g.detected = cfg // an embedded run opens its registry with it: not read twice
	dir, err := g.resolveStateDir(cfg)
	if err != nil {
		return identity{}, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return identity{}, err
	}
	off, err := clockOffset()
	if err != nil {
		return identity{}, err
	}
	return identity{StateDir: filepath.Clean(dir), Config: cfg.Path, ClockOffset: off,
		explicitState:       g.stateDir != "" || os.Getenv(config.EnvStateDir) != "",
		explicitConfig:      g.configPath != "" || os.Getenv(config.EnvConfig) != "",
		explicitClockOffset: os.Getenv(envClockOffset) != ""}, nil
}

// matches refuses a daemon whose state dir, config file or clock offset is not the
// command's. With BERTH_HOST (explicit), only what the command sets itself (a flag
// or its variable) must match: the daemon may be another machine's.
func (d *daemonClient) matches(want identity, explicit bool) error {
	st := d.status
	var diffs []string
	if (!explicit || want.explicitState) && filepath.Clean(st.StateDir) != want.StateDir {
		diffs = append(diffs, fmt.Sprintf("state dir %s (this command: %s; --state-dir or %s)", st.StateDir, want.StateDir, config.EnvStateDir))
	}
	if (!explicit || want.explicitConfig) && st.Config != want.Config {
		diffs = append(diffs, fmt.Sprintf("config %s (this command: %s; --config or %s)", orBuiltin(st.Config), orBuiltin(want.Config), config.EnvConfig))
	}
	if (!explicit || want.explicitClockOffset) && st.ClockOffsetMS != want.ClockOffset.Milliseconds() {
		diffs = append(diffs, fmt.Sprintf("clock offset %v (this command: %v; %s)", time.Duration(st.ClockOffsetMS)*time.Millisecond, want.ClockOffset, envClockOffset))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("berth serve at %s (pid %d) runs with %s; refusing to mix them: run this command with the daemon's settings, or with --no-daemon (or %s=1) to run it embedded",
		d.where, st.PID, strings.Join(diffs, ", and "), envNoDaemon)
}

func orBuiltin(p string) string {
	if p == "" {
		return "(none: the built-in default)"
	}
	return p
}

// unixClient is a client over the unix socket at path; a path longer than a socket
// address holds is dialled through its directory's descriptor, as serve binds it.
func unixClient(path string) *daemonClient {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		if len(path) <= maxSocketPath {
			return dl.DialContext(ctx, "unix", path)
		}
		dir, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		defer dir.Close()
		return dl.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
	}
	return &daemonClient{where: "unix://" + path, base: "http://berth",
		client: &http.Client{Transport: &http.Transport{DialContext: watched(dial), DisableCompression: true, MaxIdleConnsPerHost: 4}}}
}

// watchedConn is a connection that tells, once, when the transport closes it: a
// streamed exec's request body (an io.Pipe that berth writes while the call runs)
// must then end, or net/http's transport would wait for it forever before it
// reports the broken connection (its write loop is reading the body).
type watchedConn struct {
	net.Conn
	mu      sync.Mutex
	closed  bool
	onClose func()
}

// watch sets f to be called when c is closed (at once if it is); nil clears it.
func (c *watchedConn) watch(f func()) {
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.onClose = f
	}
	c.mu.Unlock()
	if closed && f != nil {
		f()
	}
}

func (c *watchedConn) Close() error {
	c.mu.Lock()
	f := c.onClose
	c.closed, c.onClose = true, nil
	c.mu.Unlock()
	if f != nil {
		f()
	}
	return c.Conn.Close()
}

// watched wraps a dial function so that its connections are watchedConns.
func watched(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &watchedConn{Conn: c}, nil
	}
}

// watchedOf returns the watchedConn under c (a TLS connection's too), or nil.
func watchedOf(c net.Conn) *watchedConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	wc, _ := c.(*watchedConn)
	return wc
}

// dialHost is the client of BERTH_HOST: unix:///PATH, https://HOST:PORT (with
// BERTH_TOKEN_FILE) or http://LOOPBACK-IP:PORT (with BERTH_TOKEN_FILE).
func dialHost(host string) (*daemonClient, error) {
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %v; use unix:///PATH, https://HOST:PORT or http://127.0.0.1:PORT", envHost, host, err)
	}
	switch u.Scheme {
	case "unix":
		if u.Host != "" || !filepath.IsAbs(u.Path) {
			return nil, fmt.Errorf("%s=%q: a unix socket needs an absolute path: unix:///PATH", envHost, host)
		}
		return unixClient(filepath.Clean(u.Path)), nil
	case "http", "https":
	default:
		return nil, fmt.Errorf("%s=%q: unknown scheme; use unix:///PATH, https://HOST:PORT or http://127.0.0.1:PORT", envHost, host)
	}
	if u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("%s=%q: want %s://HOST:PORT, nothing after the port", envHost, host, u.Scheme)
	}
	if u.Scheme == "http" && !loopback(u.Host) {
		return nil, fmt.Errorf("%s=%q: plain http only to a loopback IP (127.0.0.1, ::1): the token would cross the network in clear; use https://", envHost, host)
	}
	tokFile := os.Getenv(envTokenFile)
	if tokFile == "" {
		return nil, fmt.Errorf("%s=%q: a TCP daemon needs its bearer token: set %s to the file that berth serve's --token-file reads", envHost, host, envTokenFile)
	}
	tok, err := readToken(tokFile, envTokenFile)
	if err != nil {
		return nil, err
	}
	var dl net.Dialer
	tr := &http.Transport{DialContext: watched(dl.DialContext), DisableCompression: true, MaxIdleConnsPerHost: 4, Proxy: nil}
	if ca := os.Getenv(envTLSCA); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", envTLSCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", envTLSCA, ca)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &daemonClient{where: u.Scheme + "://" + u.Host, base: u.Scheme + "://" + u.Host, client: &http.Client{Transport: tr}, token: tok}, nil
}

// apiError is an error answer of the daemon: its message is what embedded berth
// would print for the same error.
type apiError struct {
	status int
	info   apiv1.ErrorInfo
}

func (e *apiError) Error() string { return e.info.Message }

// request makes a request of the daemon. body, when not nil, is sent as JSON
// (an io.Reader is sent as it is, with contentType). Errors: an *apiError for an
// error answer (the body is closed), else the transport's error saying that the
// daemon went away.
func (d *daemonClient) request(ctx context.Context, method, path string, body any, contentType, accept string) (*http.Response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case io.Reader:
		rd = b
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		rd = strings.NewReader(string(data))
		contentType = "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, d.base+path, rd)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if d.token != "" {
		req.Header.Set("Authorization", "Bearer "+d.token)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, d.gone(err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, answerError(resp, d.where)
	}
	return resp, nil
}

// gone wraps a transport error: the daemon stopped or broke the connection.
func (d *daemonClient) gone(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("berth serve at %s went away during the call (%w); it may have stopped: run the command again (embedded when no daemon runs), or with --no-daemon", d.where, err)
}

// call makes a request with a JSON body (nil for none) and decodes a JSON answer
// into out (nil: the answer is dropped).
func (d *daemonClient) call(ctx context.Context, method, path string, in, out any) error {
	resp, err := d.request(ctx, method, path, in, "", "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return d.gone(fmt.Errorf("reading the answer: %w", err))
	}
	return nil
}

// get is call for a GET.
func (d *daemonClient) get(ctx context.Context, path string, out any) error {
	return d.call(ctx, http.MethodGet, path, nil, out)
}

// sessionPath is the API path of session's operation op ("" for the session itself):
// the name is one percent-encoded path segment.
func sessionPath(session, op string) string {
	p := "/v1/sessions/" + url.PathEscape(session)
	if op != "" {
		p += "/" + op
	}
	return p
}
