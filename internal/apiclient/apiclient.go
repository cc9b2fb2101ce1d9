// Package apiclient is the client side of berth serve's HTTP API (docs/api.md) that
// berth's CLI and its thin front (cli/front) share: a client over the daemon's
// unix socket or a URL, its calls with their error answers (APIError), and the
// streamed exec (Exec): the request's input events, the answer's output events and
// result.
//
// It links only the standard library and berth's light packages (backend,
// server/apiv1, internal/phase): the thin front links it, and must start fast.
package apiclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/server/apiv1"
)

// What berth's CLI and its front agree on to find the daemon of a command (both
// read these; docs/cli.md).
const (
	// EnvHost names the daemon to use: unix:///PATH, https://HOST:PORT, or
	// http://LOOPBACK-IP:PORT. When set, the daemon must answer (no fallback).
	EnvHost = "BERTH_HOST"
	// EnvNoDaemon set to anything but "" and "0" is --no-daemon (NoDaemonEnv).
	EnvNoDaemon = "BERTH_NO_DAEMON"
	// EnvClockOffset shifts berth's clock for retention (a duration; the daemon's
	// must be the command's).
	EnvClockOffset = "BERTH_CLOCK_OFFSET"
	// SocketName is berth serve's default unix socket in the state dir.
	SocketName = "berth.sock"
	// StatusTimeout bounds the status call that detection makes: a daemon that
	// accepts connections but does not answer is an error, never a hang.
	StatusTimeout = 10 * time.Second
)

// NoDaemonEnv returns "BERTH_NO_DAEMON=VALUE" when that variable asks to run
// embedded (set, and not "0"), else "".
func NoDaemonEnv() string {
	if v := os.Getenv(EnvNoDaemon); v != "" && v != "0" {
		return EnvNoDaemon + "=" + v
	}
	return ""
}

// MaxSocketPath is the longest path a unix socket address holds (sun_path less its
// NUL); Unix dials a longer one through its directory's descriptor.
const MaxSocketPath = 107

// Client is one client of a running berth serve: every call goes through HTTP (for a
// unix socket, a client whose transport dials the socket; no Timeout, which would cut
// long copies and shells), with the bearer token Token when it is set.
type Client struct {
	// Where is what the user is told: unix:///PATH or the URL.
	Where string
	// Base is the URL prefix of every call: http://berth or the URL.
	Base  string
	HTTP  *http.Client
	Token string
	// Status is what the daemon said of itself (GET /v1/status), once the caller
	// has asked.
	Status apiv1.Status
}

// Unix is a client over the unix socket at path; a path longer than a socket
// address holds is dialled through its directory's descriptor, as serve binds it.
func Unix(path string) *Client {
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
	return &Client{Where: "unix://" + path, Base: "http://berth",
		HTTP: &http.Client{Transport: &http.Transport{DialContext: Watched(dial), DisableCompression: true, MaxIdleConnsPerHost: 4},
			CheckRedirect: NoRedirect}}
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

// NoRedirect is the CheckRedirect of berth's clients of the API: they follow no
// redirect. The API answers none, and a streamed exec's body could not be sent again
// (following one hung); a 3xx answer is an error answer (AnswerError).
func NoRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Watched wraps a dial function so that its connections are watchedConns.
func Watched(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
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

// Request makes a request of the daemon. body, when not nil, is sent as JSON
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
	req, err := http.NewRequestWithContext(ctx, method, d.Base+path, rd)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if d.Token != "" {
		req.Header.Set("Authorization", "Bearer "+d.Token)
	}
	resp, err := d.HTTP.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, d.Gone(err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, AnswerError(resp, d.Where)
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
	return &GoneError{Where: d.Where, Err: err, Dial: errors.As(err, &oe) && oe.Op == "dial"}
}

// GoneError is a call's transport error (Client.Gone): Dial when no connection was
// made (nothing listens at Where: connection refused, no such socket), else the
// daemon broke the connection during the call.
type GoneError struct {
	Where string
	Err   error
	Dial  bool
}

// Error says what happened at Where and what to do: run the command again, or
// embedded.
func (e *GoneError) Error() string {
	return fmt.Sprintf("berth serve at %s %s; it may have stopped: run the command again (embedded when no daemon runs), or with --no-daemon", e.Where, e.what())
}

// what says what happened, without the address.
func (e *GoneError) what() string {
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

// CancelWait is how long a streamed exec waits, after it sent a cancel event, for
// the daemon's result before it drops the connection (which kills the tree too): a
// daemon that no longer answers must not hold berth forever.
const CancelWait = 30 * time.Second

// Exec is an exec running through the daemon (POST /v1/sessions/{name}/exec with
// NDJSON both ways): a streamed request (its body, written here) and a streamed
// answer (read by a goroutine). It is a backend.Process: its methods send input
// events, and Wait returns the result.
type Exec struct {
	d       *Client
	mu      sync.Mutex // one event line at a time on body
	body    *io.PipeWriter
	abort   context.CancelFunc // drops the connection
	unwatch func()             // stops watching the connection (it may be reused)
	started *apiv1.ExecStarted
	done    chan struct{} // closed when the answer has ended; then res or err
	res     apiv1.ExecResult
	err     error
}

// Stream sends first as the first line of a streamed exec request of session and
// returns once the command runs (the "started" event; Started) or the call failed:
// an *APIError for the daemon's error answer, else an error saying that the daemon
// went away or that ctx ended first. Output events go to stdout and stderr as they
// come. eof sends the end of stdin at once. ctx's end sends a cancel event; the
// answer (the killed command's result) still comes.
func (d *Client) Stream(ctx context.Context, session string, first apiv1.ExecRequest, stdout, stderr io.Writer, eof bool) (*Exec, error) {
	line, err := json.Marshal(first)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	// The request outlives ctx: a cancelled ctx is sent as a cancel event, so that
	// the answer (the result of the killed command) still comes.
	reqCtx, abort := context.WithCancel(context.WithoutCancel(ctx))
	p := &Exec{d: d, body: pw, abort: abort, done: make(chan struct{})}
	go func() {
		p.send(append(line, '\n'))
		if eof {
			p.CloseStdin()
		}
	}()
	stop := context.AfterFunc(ctx, func() {
		p.event(apiv1.Event{Event: apiv1.InputCancel})
		t := time.NewTimer(CancelWait)
		defer t.Stop()
		select {
		case <-p.done:
		case <-t.C:
			abort()
		}
	})
	// When the transport closes the connection (the daemon went away), the body
	// ends: see watchedConn.
	var conn *watchedConn
	var connMu sync.Mutex
	reqCtx = httptrace.WithClientTrace(reqCtx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if wc := watchedOf(info.Conn); wc != nil {
			connMu.Lock()
			conn = wc
			connMu.Unlock()
			wc.watch(func() { pw.CloseWithError(errors.New("the connection to berth serve was closed")) })
		}
	}})
	p.unwatch = func() {
		connMu.Lock()
		defer connMu.Unlock()
		if conn != nil {
			conn.watch(nil)
		}
	}
	resp, err := d.Request(reqCtx, http.MethodPost, SessionPath(session, "exec"), pr, apiv1.NDJSON, apiv1.NDJSON)
	if err != nil {
		stop()
		pw.CloseWithError(err)
		abort()
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return nil, fmt.Errorf("the call was cancelled before the command ran: %w", ctx.Err())
		}
		return nil, err
	}
	started := make(chan *apiv1.ExecStarted, 1)
	go p.read(resp, stdout, stderr, started, stop)
	if p.started = WaitStarted(started, p.done); p.started != nil {
		return p, nil
	}
	if p.err == nil {
		p.err = d.Gone(errors.New("the answer ended before the command started"))
	}
	return nil, p.err
}

// WaitStarted returns the started event that read passes on started, or nil when the
// answer ended (done closed) without one. A short command's whole answer (started,
// then its result) can be read before the caller waits: done is then closed too, and
// a select that picked either at random took such a call for one that never started
// (exit 125, "the answer ended before the command started"). read sends on started
// before it closes done, so started is looked at again once done is closed.
func WaitStarted(started <-chan *apiv1.ExecStarted, done <-chan struct{}) *apiv1.ExecStarted {
	select {
	case s := <-started:
		return s
	case <-done:
	}
	select {
	case s := <-started:
		return s
	default:
		return nil
	}
}

// read reads the answer's events until its end.
func (p *Exec) read(resp *http.Response, stdout, stderr io.Writer, started chan<- *apiv1.ExecStarted, stop func() bool) {
	defer close(p.done)
	defer stop()
	defer p.abort()
	defer resp.Body.Close()
	// The request body ends first: the daemon ends its answer once it has
	// (server.input.finish).
	defer p.body.Close()
	defer p.unwatch() // before the connection can go back to the pool
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	got := false
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var ev apiv1.Event
			if jerr := json.Unmarshal(line, &ev); jerr != nil {
				p.err = p.d.Gone(fmt.Errorf("an answer line: %w", jerr))
				return
			}
			switch ev.Event {
			case "started":
				phase.Mark("started")
				if ev.Started != nil {
					started <- ev.Started
				}
			case "stdout":
				stdout.Write(ev.Data)
			case "stderr":
				stderr.Write(ev.Data)
			case "result":
				phase.Mark("ended")
				if ev.Result != nil {
					p.res, got = *ev.Result, true
				}
			case "error":
				if ev.Error != nil {
					p.err = &APIError{StatusCode: http.StatusOK, Info: *ev.Error}
					return
				}
			}
		}
		if err != nil {
			if !got {
				p.err = p.d.Gone(fmt.Errorf("the answer ended without its result: %v", err))
			}
			return
		}
		if got {
			return
		}
	}
}

// event sends one input event.
func (p *Exec) event(ev apiv1.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return p.send(append(b, '\n'))
}

func (p *Exec) send(line []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.body.Write(line)
	return err
}

// maxStdinEvent is the most stdin bytes one event carries.
const maxStdinEvent = 32 << 10

// Write sends b as stdin events of at most 32 KiB each.
func (p *Exec) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), maxStdinEvent)
		if err := p.event(apiv1.Event{Event: apiv1.InputStdin, Data: b[:k]}); err != nil {
			return n, err
		}
		n += k
		b = b[k:]
	}
	return n, nil
}

// CloseStdin sends the end of stdin (an "eof" event).
func (p *Exec) CloseStdin() error { return p.event(apiv1.Event{Event: apiv1.InputEOF}) }

// Resize fails with backend.ErrInvalid: a streamed exec has no terminal.
func (p *Exec) Resize(backend.WindowSize) error {
	return backend.Errorf(backend.ErrInvalid, "resize: not a terminal exec")
}

// Signal sends signal sig (a Linux signal number) to the command's process group
// (a "signal" event).
func (p *Exec) Signal(sig int) error {
	return p.event(apiv1.Event{Event: apiv1.InputSignal, Signal: sig})
}

// Wait waits for the answer's end and returns the command's result, or the error
// that ended the call (an *APIError for an "error" event).
func (p *Exec) Wait() (backend.ExecResult, error) {
	<-p.done
	return ResultOf(p.res, p.err)
}

// Started is the "started" event's placement of the command.
func (p *Exec) Started() *apiv1.ExecStarted { return p.started }

// Done is closed when the answer has ended; Result then holds.
func (p *Exec) Done() <-chan struct{} { return p.done }

// Result is the answer's whole result event (or the error that ended the call), once
// Done is closed.
func (p *Exec) Result() (apiv1.ExecResult, error) {
	<-p.done
	return p.res, p.err
}

// ResultOf is a daemon's exec result (or err) as a Process's Wait returns it.
func ResultOf(r apiv1.ExecResult, err error) (backend.ExecResult, error) {
	if err != nil {
		return backend.ExecResult{}, err
	}
	return backend.ExecResult{ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, Canceled: r.Canceled,
		OOMKilled: r.OOMKilled, Duration: time.Duration(r.DurationMS) * time.Millisecond}, nil
}

// EnvMap turns KEY=VALUE pairs into the API's env object (a later KEY wins, as in
// an environment).
func EnvMap(env []string) map[string]string {
	if len(env) == 0 {
		return nil
	}
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// DurationText is a timeout as the API takes it ("" for none).
func DurationText(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return d.String()
}

// Exec runs a plain exec (req.Argv, not a terminal: req.TTY must be false) through
// the daemon as a streamed request and answer (Stream): req.Env, Dir, User and
// Timeout become the request's fields, its output events go to req.Stdout and
// req.Stderr, and without req.Stdin the command reads EOF at once. Errors: Stream's,
// and backend.ErrInvalid for req.TTY (berth's CLI runs those over the TTY
// WebSocket) and for text that is not UTF-8 (backend.CheckExecText, as embedded).
func (d *Client) Exec(ctx context.Context, session string, req backend.ExecRequest) (*Exec, error) {
	if req.TTY {
		return nil, backend.Errorf(backend.ErrInvalid, "a terminal exec goes over the TTY WebSocket, not a streamed exec")
	}
	// JSON would carry bytes that are not UTF-8 as U+FFFD: refuse them as the
	// registry does embedded.
	if err := backend.CheckExecText(req); err != nil {
		return nil, fmt.Errorf("session %q: %w", session, err)
	}
	if err := backend.CheckArgv(req); err != nil {
		return nil, fmt.Errorf("session %q: %w", session, err)
	}
	first := apiv1.ExecRequest{Argv: req.Argv, Env: EnvMap(req.Env), Cwd: req.Dir, User: req.User, Timeout: DurationText(req.Timeout)}
	return d.Stream(ctx, session, first, req.Stdout, req.Stderr, !req.Stdin)
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
	d.HTTP.CloseIdleConnections()
	return nil
}

// Refused reports whether err, from a call over a unix socket, means that nobody
// listens there: a socket that a berth serve left behind (connection refused), or one
// removed meanwhile.
func Refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// FixNoStatus is StatusFailed's fix for the daemon of the command's own state dir.
const FixNoStatus = "stop it, or use --no-daemon to run embedded"

// StatusFailed is the error for a daemon at where that did not answer its status
// call with err; fix says what to do about it.
func StatusFailed(where string, err error, fix string) error {
	var ge *GoneError
	if errors.As(err, &ge) && ge.Where == where {
		return fmt.Errorf("berth serve at %s does not answer its status call: it %s; %s", where, ge.what(), fix)
	}
	return fmt.Errorf("berth serve at %s does not answer its status call: %v; %s", where, err, fix)
}
