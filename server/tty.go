package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/server/apiv1"
)

// The interactive endpoint: GET /v1/sessions/{name}/tty upgrades to a WebSocket
// (RFC 6455) that carries one TTY exec. Binary messages are bytes: the client's are
// the command's stdin, the server's its terminal output. Text messages are one JSON
// TTYMessage each: the client sends resize, signal and eof; the server sends started
// (once the command runs), then result (its end) or error, and closes the
// connection. docs/api.md describes it.

// ttyChunk is the most output bytes one binary message carries.
const ttyChunk = 32 << 10

// ttyRequest reads a TTY's query parameters: argv (repeated; default LoginShell),
// env (repeated NAME=VALUE), cwd, user, timeout, rows and cols (default 24×80) and
// recreate (true or false), checked as an exec request's fields.
func ttyRequest(r *http.Request) (*execCall, backend.WindowSize, bool, error) {
	q := r.URL.Query()
	size := backend.WindowSize{Rows: 24, Cols: 80}
	for _, d := range []struct {
		name string
		dst  *uint16
	}{{"rows", &size.Rows}, {"cols", &size.Cols}} {
		if v := q.Get(d.name); v != "" {
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n == 0 {
				return nil, size, false, errorf("invalid", "%s %q: give a number of characters from 1 to 65535", d.name, v)
			}
			*d.dst = uint16(n)
		}
	}
	recreate := false
	if v := q.Get("recreate"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, size, false, errorf("invalid", "recreate %q: give true or false", v)
		}
		recreate = b
	}
	for k := range q {
		switch k {
		case "argv", "env", "cwd", "user", "timeout", "rows", "cols", "recreate":
		default:
			return nil, size, false, errorf("invalid", "unknown query parameter %q; a TTY takes argv, env, cwd, user, timeout, rows, cols and recreate (see docs/api.md)", k)
		}
	}
	req := apiv1.ExecRequest{Argv: q["argv"], Cwd: q.Get("cwd"), User: q.Get("user"), Timeout: q.Get("timeout")}
	if len(req.Argv) == 0 {
		req.Argv = apiv1.LoginShell
	}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, size, false, errorf("invalid", "env %q: give NAME=VALUE", kv)
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	c, err := checkExec(&req)
	return c, size, recreate, err
}

// isUpgrade reports whether r asks for a WebSocket.
func isUpgrade(r *http.Request) bool {
	for _, v := range strings.Split(r.Header.Get("Upgrade"), ",") {
		if strings.EqualFold(strings.TrimSpace(v), "websocket") {
			return true
		}
	}
	return false
}

// tty is GET /v1/sessions/{name}/tty: one TTY exec over a WebSocket. The request's
// checks (token, session name, parameters) answer with ordinary JSON errors before
// the upgrade. The Origin check is coder/websocket's default: a request with an
// Origin header whose host is not the request's Host is refused (403), so a web
// page cannot open a TTY through a browser that can reach the listener; a browser
// cannot send the bearer token either, which a TCP listener needs. A client that
// goes away (its connection drops or it closes the WebSocket before the result)
// cancels the exec: the command's whole tree is killed, as for any exec.
func (s *Server) tty(w http.ResponseWriter, r *http.Request) {
	name, session, ok := s.sessionName(w, r)
	if !ok {
		return
	}
	c, size, recreate, err := ttyRequest(r)
	if err == nil && !isUpgrade(r) {
		err = errorf("invalid", "this path takes a WebSocket (a GET with Upgrade: websocket); see docs/api.md")
	}
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	auditCommand(r, c)
	start := time.Now()
	ref := s.acquire()
	defer s.release(ref)
	reg := ref.reg
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		s.log.Debug("tty: no WebSocket", "session", session, "error", err)
		return // Accept has answered
	}
	defer conn.CloseNow()
	conn.SetReadLimit(apiv1.MaxTTYMessage)
	// The connection is hijacked: net/http no longer cancels the request's context
	// when the client goes away. ctx, the exec's, is cancelled when the read loop
	// ends (the client went away or broke the protocol) or by the daemon's shutdown
	// (the request's context). The connection's own I/O uses ioCtx, which outlives
	// ctx by sendTimeout (coder/websocket closes a connection whose read or write
	// context is cancelled), so that the result of a cancelled exec still reaches a
	// client that is there, and a client that reads nothing holds nothing.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ioCtx, ioCancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer ioCancel()
	go func() {
		<-ctx.Done()
		timer := time.NewTimer(sendTimeout)
		defer timer.Stop()
		select {
		case <-timer.C:
			ioCancel()
		case <-ioCtx.Done():
		}
	}()
	t := &ttyConn{conn: conn, ctx: ioCtx, ready: make(chan struct{}), cancel: cancel}
	driver := ""
	fail := func(err error, status websocket.StatusCode) {
		info := errorInfo(err, name)
		auditError(r, info.Kind)
		s.metrics.execMode(driver, "tty", true, apiv1.ExecResult{}, err, start)
		s.log.Info("tty", "session", session, "error", err)
		t.send(apiv1.TTYMessage{Type: "error", Error: &info})
		conn.Close(status, "")
	}
	recreated := false
	if recreate {
		if recreated, err = reg.Recreate(ctx, session); err != nil {
			fail(err, websocket.StatusInternalError)
			return
		}
	}
	p, lease, err := reg.Exec(ctx, session, backend.ExecRequest{
		Argv: c.argv, Env: c.env, Dir: c.cwd, User: c.user, Timeout: c.timeout,
		TTY: true, Size: size, Stdin: true, Stdout: t, Stderr: t, // stderr: a command that cannot run says why (the agent writes it there)
	})
	if err != nil {
		fail(err, websocket.StatusInternalError)
		return
	}
	driver = lease.Driver
	started := apiv1.TTYMessage{Type: "started", Session: lease.Session, Driver: lease.Driver, Sandbox: lease.Sandbox,
		Recreated: lease.Recreated || recreated, RecreatedReason: lease.RecreatedReason, Moved: lease.Moved, MovedReason: lease.MovedReason,
		Pooled: lease.Pooled}
	if recreated {
		started.RecreatedReason = apiv1.RecreateReason
	}
	t.send(started)
	close(t.ready)
	var perr error // the read loop's protocol error; set before it cancels ctx
	var perrMu sync.Mutex
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		err := t.readLoop(p)
		if !errors.Is(err, errClientGone) {
			perrMu.Lock()
			perr = err
			perrMu.Unlock()
		}
		cancel() // the tree is killed
	}()
	// A cancelled exec (Canceled, 143) has its result sent as a plain exec's is: to
	// no one when the client went away, to the client when the daemon's shutdown
	// grace ran out. One that the client's protocol error cancelled gets that error.
	res, err := p.Wait()
	perrMu.Lock()
	protoErr := perr
	perrMu.Unlock()
	switch {
	case protoErr != nil:
		fail(protoErr, websocket.StatusPolicyViolation)
	case err != nil:
		fail(err, websocket.StatusInternalError)
	default:
		out := apiv1.ExecResult{
			ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
			DurationMS: res.Duration.Milliseconds(), Session: lease.Session, Driver: lease.Driver, Sandbox: lease.Sandbox,
			Recreated: started.Recreated, RecreatedReason: started.RecreatedReason, Moved: lease.Moved, MovedReason: lease.MovedReason,
			Pooled: lease.Pooled, Canceled: res.Canceled,
		}
		auditResult(r, out, nil)
		s.metrics.execMode(driver, "tty", true, out, nil, start)
		s.log.Info("tty", "session", session, "exit_code", res.ExitCode, "canceled", res.Canceled, "duration_ms", out.DurationMS)
		t.send(apiv1.TTYMessage{Type: "result", Result: &out})
		conn.Close(websocket.StatusNormalClosure, "")
	}
	conn.CloseNow() // ends the read loop, if the close handshake did not
	<-readDone
}

// errClientGone is readLoop's error when the client closed the WebSocket or its
// connection dropped.
var errClientGone = errors.New("the client went away")

// ttyConn is the server's side of a TTY WebSocket: the command's output writer and
// the reader of the client's messages.
type ttyConn struct {
	conn  *websocket.Conn
	ctx   context.Context // the connection's I/O (see tty: it outlives the exec's)
	ready chan struct{}   // closed once "started" is sent: output comes after it
	mu    sync.Mutex      // one text message at a time beside the output
	// cancel cancels the exec (a "cancel" message): its tree is killed and its
	// result, with Canceled, still sent.
	cancel context.CancelFunc
}

// Write sends terminal output as binary messages (the command's stdout).
func (t *ttyConn) Write(b []byte) (int, error) {
	select {
	case <-t.ready:
	case <-t.ctx.Done():
		return 0, t.ctx.Err()
	}
	n := len(b)
	for len(b) > 0 {
		k := min(len(b), ttyChunk)
		if err := t.conn.Write(t.ctx, websocket.MessageBinary, b[:k]); err != nil {
			return 0, err
		}
		b = b[k:]
	}
	return n, nil
}

// send writes one JSON text message within sendTimeout; errors are dropped (the
// client is gone).
func (t *ttyConn) send(m apiv1.TTYMessage) {
	b, err := json.Marshal(m)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, sendTimeout)
	defer cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.conn.Write(ctx, websocket.MessageText, b)
}

// sendTimeout bounds the write of one control message (started, result, error), and
// how long the connection outlives its cancelled exec.
const sendTimeout = 5 * time.Second

// readLoop applies the client's messages to p in order until the connection ends:
// errClientGone then, or an invalid error for a message that breaks the protocol.
// A binary message is read whole (within the read limit) before any of it is
// written: no byte of a message past the limit reaches the command, which is
// killed when the connection closes (1009).
func (t *ttyConn) readLoop(p backend.Process) error {
	var buf bytes.Buffer
	for {
		typ, rd, err := t.conn.Reader(t.ctx)
		if err != nil {
			if errors.Is(err, websocket.ErrMessageTooBig) {
				return errorf("invalid", "a message larger than %d bytes; send stdin in smaller messages", apiv1.MaxTTYMessage)
			}
			return errClientGone
		}
		buf.Reset()
		if _, err := buf.ReadFrom(rd); err != nil {
			return errClientGone
		}
		if typ == websocket.MessageBinary {
			if buf.Len() > 0 {
				// An error is the command's: it exited or closed its stdin, and
				// no longer reads. The message is dropped.
				p.Write(buf.Bytes())
			}
		} else if err := applyControl(p, buf.Bytes(), t.cancel); err != nil {
			return err
		}
		if buf.Cap() > ttyChunk {
			buf = bytes.Buffer{} // an idle TTY keeps no large message's buffer
		}
	}
}

// applyControl applies one client text message to p; cancel is the exec's (a
// "cancel" message).
func applyControl(p backend.Process, b []byte, cancel context.CancelFunc) error {
	var m apiv1.TTYMessage
	if err := decodeStrict(b, &m); err != nil {
		return errorf("invalid", "TTY message %s: %v", shownMessage(b), err)
	}
	switch m.Type {
	case "resize":
		if m.Rows == 0 || m.Cols == 0 {
			return errorf("invalid", "resize: give rows and cols, both at least 1")
		}
		p.Resize(backend.WindowSize{Rows: m.Rows, Cols: m.Cols})
	case "signal":
		sig, err := signalNumber(m.Signal)
		if err != nil {
			return err
		}
		p.Signal(sig)
	case "eof":
		p.CloseStdin()
	case "cancel":
		cancel()
	default:
		return errorf("invalid", "TTY message type %q: a client sends resize, signal, eof or cancel (see docs/api.md)", m.Type)
	}
	return nil
}

// signalNumber reads a signal's name ("INT", "SIGINT") or number ("2").
func signalNumber(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 65 {
		return n, nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if n := unix.SignalNum(name); n != 0 {
		return int(n), nil
	}
	return 0, errorf("invalid", "signal %q: give a signal's name (INT, TERM, HUP...) or number", s)
}

// shownMessage is a client message as an error quotes it: at most 64 bytes, quoted.
func shownMessage(b []byte) string {
	if len(b) > 64 {
		return strconv.Quote(string(b[:64])) + "..."
	}
	return strconv.Quote(string(b))
}
