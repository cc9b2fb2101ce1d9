package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/server/apiv1"
)

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
// WebSocket), for text that is not UTF-8 (backend.CheckExecText, as embedded) and
// for an empty program name (backend.CheckArgv), each naming the session.
func (d *Client) Exec(ctx context.Context, session string, req backend.ExecRequest) (*Exec, error) {
	if req.TTY {
		return nil, backend.Errorf(backend.ErrInvalid, "a terminal exec goes over the TTY WebSocket, not a streamed exec")
	}
	// JSON would carry bytes that are not UTF-8 as U+FFFD, so the daemon could not
	// refuse them as the registry does embedded: this check is the encoding's.
	if err := backend.CheckExecText(req); err != nil {
		return nil, fmt.Errorf("session %q: %w", session, err)
	}
	// An empty program name is refused here with the session named, as embedded
	// berth words it (the daemon's edge refuses it too, without the session).
	if err := backend.CheckArgv(req); err != nil {
		return nil, fmt.Errorf("session %q: %w", session, err)
	}
	first := apiv1.ExecRequest{Argv: req.Argv, Env: EnvMap(req.Env), Cwd: req.Dir, User: req.User, Timeout: DurationText(req.Timeout)}
	return d.Stream(ctx, session, first, req.Stdout, req.Stderr, !req.Stdin)
}
