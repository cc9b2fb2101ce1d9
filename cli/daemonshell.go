package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/client"
	"github.com/berth-sh/berth/server/apiv1"
)

// ttyClient is the client side of one TTY WebSocket (GET /v1/sessions/{name}/tty).
type ttyClient struct {
	conn *websocket.Conn
	ctx  context.Context
}

// ttyOptions are the parameters of a TTY exec (the query of /tty).
type ttyOptions struct {
	argv     []string // nil: the daemon's default, the login shell
	env      []string // NAME=VALUE
	cwd      string
	user     string
	timeout  time.Duration // 0: none
	size     backend.WindowSize
	recreate bool
}

// openTTY opens a TTY exec in session through the daemon and returns once the
// command runs, with the "started" message. Errors: the dial's (with the daemon's
// JSON error, when it answered one), or the daemon's "error" message.
func (d *daemonClient) openTTY(ctx context.Context, session string, o ttyOptions) (*ttyClient, apiv1.TTYMessage, error) {
	q := url.Values{}
	for _, a := range o.argv {
		q.Add("argv", a)
	}
	for _, kv := range o.env {
		q.Add("env", kv)
	}
	if o.size.Rows > 0 && o.size.Cols > 0 {
		q.Set("rows", strconv.Itoa(int(o.size.Rows)))
		q.Set("cols", strconv.Itoa(int(o.size.Cols)))
	}
	for k, v := range map[string]string{"cwd": o.cwd, "user": o.user, "timeout": client.DurationText(o.timeout)} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.recreate {
		q.Set("recreate", "true")
	}
	u := d.URL(client.SessionPath(session, "tty") + "?" + q.Encode())
	u = "ws" + strings.TrimPrefix(u, "http") // http → ws, https → wss
	hdr := http.Header{}
	d.Authorize(hdr)
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: d.HTTPClient(), HTTPHeader: hdr})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			if aerr := client.AnswerError(resp, ""); aerr != nil {
				var de *client.APIError
				if errors.As(aerr, &de) {
					return nil, apiv1.TTYMessage{}, aerr
				}
			}
		}
		return nil, apiv1.TTYMessage{}, fmt.Errorf("session %s: opening a terminal through berth serve: %w", session, err)
	}
	conn.SetReadLimit(apiv1.MaxTTYMessage)
	t := &ttyClient{conn: conn, ctx: ctx}
	m, err := t.next(nil)
	if err == nil && m.Type != "started" {
		err = fmt.Errorf("berth serve sent %q before the command started", m.Type)
	}
	if err != nil {
		conn.CloseNow()
		return nil, m, err
	}
	return t, m, nil
}

// next reads messages, writing binary ones (the terminal's output) to out, until a
// text message, which it returns; an "error" message is returned as its error.
func (t *ttyClient) next(out io.Writer) (apiv1.TTYMessage, error) {
	for {
		typ, rd, err := t.conn.Reader(t.ctx)
		if err != nil {
			return apiv1.TTYMessage{}, fmt.Errorf("the terminal's connection to berth serve ended: %w", err)
		}
		if typ == websocket.MessageBinary {
			if out == nil {
				return apiv1.TTYMessage{}, errors.New("berth serve sent output before the command started")
			}
			if _, err := io.Copy(out, rd); err != nil {
				return apiv1.TTYMessage{}, err
			}
			continue
		}
		var m apiv1.TTYMessage
		if err := json.NewDecoder(rd).Decode(&m); err != nil {
			return m, fmt.Errorf("a message from berth serve: %v", err)
		}
		if m.Type == "error" && m.Error != nil {
			return m, &client.APIError{Info: *m.Error}
		}
		return m, nil
	}
}

// control sends one control message (resize, signal, eof, cancel).
func (t *ttyClient) control(m apiv1.TTYMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return t.conn.Write(t.ctx, websocket.MessageText, b)
}

// Write sends stdin bytes.
func (t *ttyClient) Write(b []byte) (int, error) {
	if err := t.conn.Write(t.ctx, websocket.MessageBinary, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// resize sends the terminal's new size.
func (t *ttyClient) resize(size backend.WindowSize) error {
	return t.control(apiv1.TTYMessage{Type: "resize", Rows: size.Rows, Cols: size.Cols})
}

// signal sends a signal to the command's process group.
func (t *ttyClient) signal(sig syscall.Signal) error {
	return t.control(apiv1.TTYMessage{Type: "signal", Signal: strconv.Itoa(int(sig))})
}

// wait writes the output to out until the result, which it returns; then it closes
// the connection.
func (t *ttyClient) wait(out io.Writer) (apiv1.ExecResult, error) {
	defer t.conn.CloseNow()
	m, err := t.next(out)
	if err != nil {
		return apiv1.ExecResult{}, err
	}
	if m.Type != "result" || m.Result == nil {
		return apiv1.ExecResult{}, fmt.Errorf("berth serve sent %q instead of the result", m.Type)
	}
	t.conn.Close(websocket.StatusNormalClosure, "")
	return *m.Result, nil
}

// close ends the TTY at once (the daemon then kills the command's tree).
func (t *ttyClient) close() { t.conn.CloseNow() }

// shell runs berth shell through the daemon: a login shell with a terminal in
// session's sandbox, in, out the client's terminal (in in raw mode while it runs,
// set up by the caller), resizes (winch: read the new size with getSize) and
// signals (sigs) forwarded. It returns the shell's result.
func (d *daemonClient) shell(ctx context.Context, session string, recreate bool, in io.Reader, out io.Writer,
	size backend.WindowSize, getSize func() (backend.WindowSize, bool), winch, sigs <-chan os.Signal, raw func() (restore func(), err error)) (apiv1.ExecResult, error) {
	o := ttyOptions{size: size, recreate: recreate}
	if term := os.Getenv("TERM"); term != "" {
		o.env = []string{"TERM=" + term}
	}
	t, started, err := d.openTTY(ctx, session, o)
	if err != nil {
		return apiv1.ExecResult{}, err
	}
	defer t.close()
	if started.Recreated && started.RecreatedReason != apiv1.RecreateReason {
		fmt.Fprintf(os.Stderr, "berth: session %s: %s\n", session, started.RecreatedReason)
	} else if started.Moved {
		fmt.Fprintf(os.Stderr, "berth: session %s: %s\n", session, started.MovedReason)
	}
	restore, err := raw()
	if err != nil {
		return apiv1.ExecResult{}, err
	}
	defer restore()
	done := make(chan struct{})
	defer close(done)
	go forwardTerminal(done, winch, sigs, getSize, t.resize, t.signal)
	go func() {
		io.Copy(t, in)
		t.control(apiv1.TTYMessage{Type: "eof"})
	}()
	return t.wait(out)
}

// execTTY is Exec with a terminal (berth exec -t) through the daemon's TTY
// WebSocket: the returned Process sends stdin (binary messages), resizes, signals
// and the end of stdin as TTY messages, and writes the terminal's output to
// req.Stdout. When ctx ends before the command runs, the connection is dropped (the
// daemon then kills whatever it started); once it runs, ctx's end sends a cancel
// message, so that the result of the killed command still comes (Canceled, as
// embedded), and drops the connection when none came within client.CancelWait.
func (d *daemonClient) execTTY(ctx context.Context, session string, req backend.ExecRequest) (backend.Process, *apiv1.ExecStarted, error) {
	// The connection's I/O outlives ctx: see above.
	ioCtx, abort := context.WithCancel(context.WithoutCancel(ctx))
	p := &ttyProcess{done: make(chan struct{})}
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		t := p.t
		p.mu.Unlock()
		if t == nil {
			abort()
			return
		}
		t.control(apiv1.TTYMessage{Type: "cancel"})
		timer := time.NewTimer(client.CancelWait)
		defer timer.Stop()
		select {
		case <-p.done:
		case <-timer.C:
			abort()
		}
	})
	env := req.Env
	if term := os.Getenv("TERM"); term != "" && !hasEnv(env, "TERM") {
		env = append([]string{"TERM=" + term}, env...)
	}
	t, started, err := d.openTTY(ioCtx, session, ttyOptions{argv: req.Argv, env: env, cwd: req.Dir, user: req.User, timeout: req.Timeout, size: req.Size})
	if err != nil {
		stop()
		abort()
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("the call was cancelled before the command ran: %w", ctx.Err())
		}
		return nil, nil, err
	}
	p.mu.Lock()
	p.t = t
	p.mu.Unlock()
	out := req.Stdout
	if out == nil {
		out = io.Discard
	}
	go func() {
		defer close(p.done)
		defer stop()
		defer abort()
		p.res, p.err = t.wait(out)
	}()
	return p, &apiv1.ExecStarted{Session: started.Session, Driver: started.Driver, Sandbox: started.Sandbox,
		Recreated: started.Recreated, RecreatedReason: started.RecreatedReason, Moved: started.Moved, MovedReason: started.MovedReason, Pooled: started.Pooled}, nil
}

// hasEnv reports whether env (NAME=VALUE pairs) sets name.
func hasEnv(env []string, name string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}

// ttyProcess is a TTY exec running through the daemon (execTTY).
type ttyProcess struct {
	mu   sync.Mutex
	t    *ttyClient    // set once the command runs
	done chan struct{} // closed when the result (or the error) is in
	res  apiv1.ExecResult
	err  error
}

func (p *ttyProcess) Write(b []byte) (int, error) { return p.t.Write(b) }

func (p *ttyProcess) CloseStdin() error { return p.t.control(apiv1.TTYMessage{Type: "eof"}) }

func (p *ttyProcess) Resize(size backend.WindowSize) error { return p.t.resize(size) }

func (p *ttyProcess) Signal(sig int) error { return p.t.signal(syscall.Signal(sig)) }

func (p *ttyProcess) Wait() (backend.ExecResult, error) {
	<-p.done
	return client.ResultOf(p.res, p.err)
}
