// Package client is the Go client of berth serve's HTTP API (docs/api.md), in the
// shape of containerd's client: New(address, ...Opt) returns a Client whose methods
// are the API's calls (Status, Sessions, Exec, CopyIn, ...), each one request,
// with the daemon's error answers as *APIError (whose message is what embedded
// berth prints for the same error) and a daemon that went away as *GoneError. A
// streamed exec (Exec) is a backend.Process: its stdin, signals and cancel travel as
// input events of one request, its output and result as events of the answer.
//
// berth's CLI and its thin front (cli/front) are built on it. It links only the
// standard library, golang.org/x/sys and berth's light packages (backend,
// server/apiv1, internal/phase), so a program that calls a daemon starts fast and
// links no registry, driver or gRPC code.
package client

import (
	"context"
	"crypto/tls"
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

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/server/apiv1"
)

const (
	// EnvHost is the variable berth's CLI reads for the daemon to use: an address
	// that New accepts (unix:///PATH, https://HOST:PORT, http://LOOPBACK-IP:PORT).
	EnvHost = "BERTH_HOST"
	// SocketName is berth serve's default unix socket in its state dir
	// (STATE/berth.sock).
	SocketName = "berth.sock"
)

// MaxSocketPath is the longest path a unix socket address holds (sun_path less its
// NUL); a client dials a longer one through its directory's descriptor.
const MaxSocketPath = 107

// Client is a client of one running berth serve. Every call is one HTTP request
// (over a unix socket, a transport that dials the socket), with the bearer token
// when one was given, and no overall timeout, which would cut long copies and
// execs: bound a call with its context. A Client is safe for concurrent use; Close
// drops its idle connections.
type Client struct {
	where string // what errors name: unix:///PATH or the URL
	base  string // URL prefix of every call: http://berth or the URL
	http  *http.Client
	token string
}

// Opt is an option of New.
type Opt func(*options) error

type options struct {
	token string
	tls   *tls.Config
}

// WithToken sends token as the bearer token of every call (berth serve's
// --token-file, or an API key); a daemon on a unix socket needs none. Error: an
// empty token, or one with a line break.
func WithToken(token string) Opt {
	return func(o *options) error {
		if token == "" || strings.ContainsAny(token, "\r\n") {
			return backend.Errorf(backend.ErrInvalid, "client.WithToken: the token is empty or holds a line break; pass the token file's first line")
		}
		o.token = token
		return nil
	}
}

// WithTLSConfig sets the TLS configuration of an https:// address (e.g. RootCAs
// holding berth serve's --tls-cert when it is self-signed). Default: the system's
// roots, TLS 1.2 or later. It has no effect on other addresses. Error: nil.
func WithTLSConfig(cfg *tls.Config) Opt {
	return func(o *options) error {
		if cfg == nil {
			return backend.Errorf(backend.ErrInvalid, "client.WithTLSConfig: nil config; leave the option out for the system's roots")
		}
		o.tls = cfg.Clone()
		return nil
	}
}

// New returns a client of the berth serve at address, without connecting (the
// first call connects; Status is the usual first one):
//
//   - unix:///PATH or an absolute PATH: the daemon's unix socket (berth serve's
//     default is STATE/berth.sock, SocketName); a path longer than a socket
//     address holds is dialled through its directory's descriptor, as serve binds it;
//   - https://HOST:PORT: a daemon with --listen and --tls-cert;
//   - http://IP:PORT with a loopback IP (127.0.0.1, ::1): a daemon listening on
//     loopback without TLS. Plain http to any other address is refused: the token
//     would cross the network in clear.
//
// Errors wrap backend.ErrInvalid and name the address and the fix: another scheme
// (tcp:// is how serve's --listen is written, not a client's address), a relative
// socket path, anything after the port, a bad option.
func New(address string, opts ...Opt) (*Client, error) {
	var o options
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if filepath.IsAbs(address) {
		address = "unix://" + address
	}
	u, err := url.Parse(address)
	if err != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "address %q: %w; use unix:///PATH, https://HOST:PORT or http://127.0.0.1:PORT", address, err)
	}
	switch u.Scheme {
	case "unix":
		if u.Host != "" || !filepath.IsAbs(u.Path) {
			return nil, backend.Errorf(backend.ErrInvalid, "address %q: a unix socket needs an absolute path: unix:///PATH", address)
		}
		c := unixClient(filepath.Clean(u.Path))
		c.token = o.token
		return c, nil
	case "http", "https":
	case "tcp":
		addr := u.Host
		if h, port, err := net.SplitHostPort(u.Host); err == nil && (h == "" || net.ParseIP(h).IsUnspecified()) {
			addr = net.JoinHostPort("127.0.0.1", port) // a listener on every address: name one of them
		}
		return nil, backend.Errorf(backend.ErrInvalid, "address %q: tcp:// is how berth serve's --listen is written; a client names the address as http://%s (a listener on loopback without TLS) or https://%s (one with --tls-cert; the name its certificate holds)", address, addr, addr)
	default:
		return nil, backend.Errorf(backend.ErrInvalid, "address %q: unknown scheme; use unix:///PATH, https://HOST:PORT or http://127.0.0.1:PORT", address)
	}
	if u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "address %q: want %s://HOST:PORT, nothing after the port", address, u.Scheme)
	}
	if u.Scheme == "http" && !Loopback(u.Host) {
		return nil, backend.Errorf(backend.ErrInvalid, "address %q: plain http only to a loopback IP (127.0.0.1, ::1): the token would cross the network in clear; use https://", address)
	}
	var dl net.Dialer
	tr := &http.Transport{DialContext: watched(dl.DialContext), DisableCompression: true, MaxIdleConnsPerHost: 4, Proxy: nil}
	if u.Scheme == "https" {
		tr.TLSClientConfig = o.tls
		if tr.TLSClientConfig == nil {
			tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	}
	base := u.Scheme + "://" + u.Host
	return &Client{where: base, base: base, token: o.token, http: &http.Client{Transport: tr, CheckRedirect: noRedirect}}, nil
}

// Loopback reports whether hostport's host ("HOST:PORT", "[V6]:PORT", or a host
// without a port) is a loopback IP (127.0.0.0/8, ::1). A name is not, "localhost"
// included: it could resolve anywhere. It is the rule for plain http, on both ends:
// New refuses an http:// address that is not loopback, and berth serve refuses to
// listen on one without TLS.
func Loopback(hostport string) bool {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		h = hostport
	}
	ip := net.ParseIP(strings.Trim(h, "[]"))
	return ip != nil && ip.IsLoopback()
}

// unixClient is a client over the unix socket at path; a path longer than a socket
// address holds is dialled through its directory's descriptor.
func unixClient(path string) *Client {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		if len(path) <= MaxSocketPath {
			return dl.DialContext(ctx, "unix", path)
		}
		dir, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		defer dir.Close()
		return dl.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
	}
	return &Client{where: "unix://" + path, base: "http://berth",
		http: &http.Client{Transport: &http.Transport{DialContext: watched(dial), DisableCompression: true, MaxIdleConnsPerHost: 4},
			CheckRedirect: noRedirect}}
}

// Where is the daemon's address as errors name it: unix:///PATH, or
// SCHEME://HOST:PORT.
func (c *Client) Where() string { return c.where }

// URL is the URL of the API path p (which starts with "/v1/"), for a route that
// has no method here (berth's CLI dials the TTY WebSocket with it): use HTTPClient,
// and Authorize the request.
func (c *Client) URL(p string) string { return strings.TrimSuffix(c.base, "/") + p }

// HTTPClient is the client's HTTP client: its transport reaches the daemon (over
// the unix socket for a unix:// address) and follows no redirect.
func (c *Client) HTTPClient() *http.Client { return c.http }

// Authorize sets the Authorization header of h to the client's bearer token, when it
// has one.
func (c *Client) Authorize(h http.Header) {
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
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

// noRedirect is the CheckRedirect of the client: it follows no redirect. The API
// answers none, and a streamed exec's body could not be sent again (following one
// hung); a 3xx answer is an error answer (AnswerError).
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

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

// APIError is an error answer of the daemon (an apiv1.ErrorBody, or an "error" event
// of a streamed answer): its message is what embedded berth would print for the same
// error.
type APIError struct {
	// StatusCode is the answer's HTTP status (200 for an error event).
	StatusCode int
	Info       apiv1.ErrorInfo
}

// Error returns the daemon's message.
func (e *APIError) Error() string { return e.Info.Message }

// Request makes a request of the daemon at the API path path, for a route that has
// no method here; the methods are built on it. body, when not nil, is sent as JSON
// (an io.Reader is sent as it is, with contentType). Errors: an *APIError for an
// error answer (the body is closed), else the transport's error saying that the
// daemon went away.
func (d *Client) Request(ctx context.Context, method, path string, body any, contentType, accept string) (*http.Response, error) {
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
	d.Authorize(req.Header)
	resp, err := d.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, d.Gone(err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, AnswerError(resp, d.where)
	}
	return resp, nil
}

// Gone wraps a transport error: nothing takes the connection (the daemon stopped,
// or the address is wrong), or the daemon broke it. The result is a *GoneError.
func (d *Client) Gone(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var oe *net.OpError
	return &GoneError{Where: d.where, Err: err, Dial: errors.As(err, &oe) && oe.Op == "dial"}
}

// GoneError is a call's transport error (Client.Gone): Dial when no connection was
// made (nothing listens at Where: connection refused, no such socket), else the
// daemon broke the connection during the call.
type GoneError struct {
	Where string
	Err   error
	Dial  bool
}

// Error says what happened at Where: "berth serve at WHERE takes no connection
// (...); it may have stopped" or "... went away during the call (...); ...".
func (e *GoneError) Error() string {
	return fmt.Sprintf("berth serve at %s %s; it may have stopped", e.Where, e.What())
}

// What says what happened, without the address: "takes no connection (CAUSE)" or
// "went away during the call (CAUSE)".
func (e *GoneError) What() string {
	if e.Dial {
		return fmt.Sprintf("takes no connection (%v)", e.Err)
	}
	return fmt.Sprintf("went away during the call (%v)", e.Err)
}

// Unwrap returns the transport's error.
func (e *GoneError) Unwrap() error { return e.Err }

// Call makes a request with a JSON body (nil for none) and decodes a JSON answer
// into out (nil: the answer is dropped).
func (d *Client) Call(ctx context.Context, method, path string, in, out any) error {
	resp, err := d.Request(ctx, method, path, in, "", "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return d.Gone(fmt.Errorf("reading the answer: %w", err))
	}
	return nil
}

// Get is Call for a GET.
func (d *Client) Get(ctx context.Context, path string, out any) error {
	return d.Call(ctx, http.MethodGet, path, nil, out)
}

// SessionPath is the API path of session's operation op ("" for the session itself):
// the name is one percent-encoded path segment.
func SessionPath(session, op string) string {
	p := "/v1/sessions/" + url.PathEscape(session)
	if op != "" {
		p += "/" + op
	}
	return p
}

// AnswerError turns an error answer of the daemon into an error with its message (the
// message that berth's embedded call would give); an answer that is no ErrorBody is
// described by its status and its first bytes, naming the daemon's address where
// when it is known.
func AnswerError(resp *http.Response, where string) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var eb apiv1.ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Message != "" {
		return &APIError{StatusCode: resp.StatusCode, Info: eb.Error}
	}
	if where != "" {
		return fmt.Errorf("berth serve at %s answered %s: %.200s", where, resp.Status, b)
	}
	return fmt.Errorf("berth serve answered %s: %.200q", resp.Status, b)
}

// Recreate removes session's sandbox (POST /v1/sessions/{name}/recreate) so that its
// next exec creates a new one from its rule's current config, and reports whether
// there was one. Errors: Call's.
func (d *Client) Recreate(ctx context.Context, session string) (bool, error) {
	var a apiv1.RecreateAnswer
	err := d.Call(ctx, http.MethodPost, SessionPath(session, "recreate"), nil, &a)
	return a.Removed, err
}

// Close drops the client's idle connections; it always returns nil.
func (d *Client) Close() error {
	d.http.CloseIdleConnections()
	return nil
}

// Refused reports whether err, from a call over a unix socket, means that nobody
// listens there: a socket that a berth serve left behind (connection refused), or one
// removed meanwhile.
func Refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}
