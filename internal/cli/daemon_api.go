package cli

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
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/agent"
	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// The api of a daemon: each method is one call of the HTTP API (docs/api.md).

func (d *daemonClient) Sessions(ctx context.Context) ([]apiv1.Session, error) {
	var rows []apiv1.Session
	err := d.get(ctx, "/v1/sessions", &rows)
	return rows, err
}

// Pools is GET /v1/pools: the daemon's warm pools.
func (d *daemonClient) Pools(ctx context.Context) ([]apiv1.Pool, error) {
	var rows []apiv1.Pool
	err := d.get(ctx, "/v1/pools", &rows)
	return rows, err
}

func (d *daemonClient) CloseSession(ctx context.Context, session string) error {
	return d.call(ctx, http.MethodPost, sessionPath(session, "close"), nil, nil)
}

func (d *daemonClient) StopSession(ctx context.Context, session string) error {
	return d.call(ctx, http.MethodPost, sessionPath(session, "stop"), nil, nil)
}

func (d *daemonClient) RemoveSession(ctx context.Context, session string) error {
	return d.call(ctx, http.MethodDelete, sessionPath(session, ""), nil, nil)
}

func (d *daemonClient) Recreate(ctx context.Context, session string) (bool, error) {
	var a apiv1.RecreateAnswer
	err := d.call(ctx, http.MethodPost, sessionPath(session, "recreate"), nil, &a)
	return a.Removed, err
}

func (d *daemonClient) Prune(ctx context.Context, opts registry.PruneOptions) (*registry.PruneReport, error) {
	var rep registry.PruneReport
	if err := d.call(ctx, http.MethodPost, "/v1/prune", apiv1.PruneRequest{DryRun: opts.DryRun, Owner: opts.Owner}, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

func (d *daemonClient) JobStart(ctx context.Context, session string, req registry.JobStartRequest) (apiv1.Job, error) {
	var j apiv1.Job
	err := d.call(ctx, http.MethodPost, sessionPath(session, "jobs"), apiv1.JobStartRequest{Argv: req.Argv, Env: envMap(req.Env), Cwd: req.Dir}, &j)
	return j, err
}

func (d *daemonClient) Jobs(ctx context.Context, session string) ([]apiv1.Job, error) {
	var jobs []apiv1.Job
	err := d.get(ctx, sessionPath(session, "jobs"), &jobs)
	return jobs, err
}

func (d *daemonClient) JobKill(ctx context.Context, session, id string) error {
	return d.call(ctx, http.MethodPost, sessionPath(session, "jobs/"+url.PathEscape(id)+"/kill"), nil, nil)
}

// JobLogs reads GET .../jobs/{id}/logs: output events go to w, a gap is reported as
// the agent client reports it (req.OnGap, else a line in w).
func (d *daemonClient) JobLogs(ctx context.Context, session string, req registry.JobLogsRequest, w io.Writer) (agent.JobLogsEnd, error) {
	q := url.Values{"offset": {strconv.FormatInt(req.Offset, 10)}}
	if req.Follow {
		q.Set("follow", "true")
	}
	resp, err := d.request(ctx, http.MethodGet, sessionPath(session, "jobs/"+url.PathEscape(req.ID)+"/logs")+"?"+q.Encode(), nil, "", apiv1.NDJSON)
	if err != nil {
		return agent.JobLogsEnd{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev apiv1.LogEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return agent.JobLogsEnd{}, d.gone(fmt.Errorf("a log event: %w", err))
		}
		switch ev.Event {
		case "gap":
			if req.OnGap != nil {
				req.OnGap(ev.Dropped)
			} else if _, err := fmt.Fprintf(w, "[... %d bytes dropped ...]\n", ev.Dropped); err != nil {
				return agent.JobLogsEnd{}, fmt.Errorf("job logs: %w", err)
			}
		case "output":
			if _, err := w.Write(ev.Data); err != nil {
				return agent.JobLogsEnd{}, fmt.Errorf("job logs: %w", err)
			}
		case "end":
			return agent.JobLogsEnd{Offset: ev.Offset, Ended: ev.Ended, ExitCode: ev.ExitCode, Signal: ev.Signal}, nil
		case "error":
			if ev.Error != nil {
				return agent.JobLogsEnd{}, &apiError{status: http.StatusOK, info: *ev.Error}
			}
		}
	}
	if ctx.Err() != nil {
		return agent.JobLogsEnd{}, ctx.Err()
	}
	return agent.JobLogsEnd{}, d.gone(fmt.Errorf("the log ended without its end event: %v", sc.Err()))
}

// DriverRows is GET /v1/drivers: the daemon's drivers (its running plugins).
func (d *daemonClient) DriverRows(ctx context.Context) ([]apiv1.Driver, error) {
	var rows []apiv1.Driver
	err := d.get(ctx, "/v1/drivers", &rows)
	return rows, err
}

// Explanation is GET /v1/config/explain: how the daemon's config places session.
func (d *daemonClient) Explanation(ctx context.Context, session string) (apiv1.Explanation, error) {
	var ex apiv1.Explanation
	err := d.get(ctx, "/v1/config/explain?"+url.Values{"session": {session}}.Encode(), &ex)
	return ex, err
}

// configCheck is POST /v1/config/check: the daemon checks its own config file as
// berth config check does (checkConfig).
func (d *daemonClient) configCheck(ctx context.Context) (apiv1.ConfigCheck, error) {
	var chk apiv1.ConfigCheck
	err := d.call(ctx, http.MethodPost, "/v1/config/check", nil, &chk)
	return chk, err
}

// Close drops the client's idle connections.
func (d *daemonClient) Close() error {
	d.client.CloseIdleConnections()
	return nil
}

// envMap turns KEY=VALUE pairs into the API's env object (a later KEY wins, as in
// an environment).
func envMap(env []string) map[string]string {
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

// durationText is a timeout as the API takes it ("" for none).
func durationText(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return d.String()
}

// Exec runs a plain exec through the daemon as a streamed request and answer
// (docs/api.md), or one with a terminal (req.TTY) over the TTY WebSocket
// (execTTY): the returned Process sends stdin, signals and, when ctx is
// cancelled, a cancel event; its output events go to req.Stdout and req.Stderr.
func (d *daemonClient) Exec(ctx context.Context, session string, req backend.ExecRequest) (backend.Process, *registry.Lease, error) {
	if req.TTY {
		return d.execTTY(ctx, session, req)
	}
	first := apiv1.ExecRequest{Argv: req.Argv, Env: envMap(req.Env), Cwd: req.Dir, User: req.User, Timeout: durationText(req.Timeout)}
	p, err := d.stream(ctx, session, first, req.Stdout, req.Stderr, !req.Stdin)
	if err != nil {
		return nil, nil, err
	}
	st := p.started
	return p, &registry.Lease{Session: st.Session, Driver: st.Driver, Sandbox: st.Sandbox,
		Recreated: st.Recreated, RecreatedReason: st.RecreatedReason, Moved: st.Moved, MovedReason: st.MovedReason, Pooled: st.Pooled}, nil
}

// Shell makes a shell-mode call through the daemon: req.Stdin is sent as stdin
// events, req.Started is called at the "started" event, and a cancelled ctx sends a
// cancel event (the answer then says canceled).
func (d *daemonClient) Shell(ctx context.Context, session string, req registry.ShellRequest) (registry.ShellResult, error) {
	first := apiv1.ExecRequest{Command: req.Command, Env: envMap(req.Env), Cwd: req.Dir, Timeout: durationText(req.Timeout)}
	if req.MaxOutput > 0 {
		first.MaxOutput = &req.MaxOutput
	}
	// The result carries the capped text; the output events are not needed.
	stdout, stderr := orDiscard(req.Stdout), orDiscard(req.Stderr)
	p, err := d.stream(ctx, session, first, stdout, stderr, req.Stdin == nil)
	if err != nil {
		return registry.ShellResult{}, err
	}
	if req.Started != nil {
		req.Started()
	}
	if req.Stdin != nil {
		go func() {
			io.Copy(processWriter{p}, req.Stdin)
			p.CloseStdin()
		}()
	}
	<-p.done
	if p.err != nil {
		return registry.ShellResult{}, p.err
	}
	r := p.res
	return registry.ShellResult{
		ExecResult: backend.ExecResult{ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, Canceled: r.Canceled, OOMKilled: r.OOMKilled,
			Duration: time.Duration(r.DurationMS) * time.Millisecond, Cwd: r.Cwd},
		Session: r.Session, Driver: r.Driver, Sandbox: r.Sandbox,
		Recreated: r.Recreated, RecreatedReason: r.RecreatedReason, Moved: r.Moved, MovedReason: r.MovedReason, Pooled: r.Pooled,
		Stdout: r.Stdout, Stderr: r.Stderr, StdoutTruncatedBytes: r.StdoutTruncatedBytes, StderrTruncatedBytes: r.StderrTruncatedBytes,
		StdoutFile: r.StdoutFile, StderrFile: r.StderrFile,
		StdoutFileTruncatedBytes: r.StdoutFileTruncatedBytes, StderrFileTruncatedBytes: r.StderrFileTruncatedBytes,
		OutputFilesRemoved: r.OutputFilesRemoved,
	}, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// cancelWait is how long a streamed exec waits, after it sent a cancel event, for
// the daemon's result before it drops the connection (which kills the tree too): a
// daemon that no longer answers must not hold berth forever.
const cancelWait = 30 * time.Second

// remoteProcess is an exec running through the daemon: a streamed request (its
// body, written here) and a streamed answer (read by a goroutine).
type remoteProcess struct {
	d       *daemonClient
	mu      sync.Mutex // one event line at a time on body
	body    *io.PipeWriter
	abort   context.CancelFunc // drops the connection
	unwatch func()             // stops watching the connection (it may be reused)
	started *apiv1.ExecStarted
	done    chan struct{} // closed when the answer has ended; then res or err
	res     apiv1.ExecResult
	err     error
}

// stream sends first as the first line of a streamed exec request of session and
// returns once the command runs (the "started" event) or the call failed. eof sends
// the end of stdin at once. ctx's end sends a cancel event.
func (d *daemonClient) stream(ctx context.Context, session string, first apiv1.ExecRequest, stdout, stderr io.Writer, eof bool) (*remoteProcess, error) {
	line, err := json.Marshal(first)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	// The request outlives ctx: a cancelled ctx is sent as a cancel event, so that
	// the answer (the result of the killed command) still comes.
	reqCtx, abort := context.WithCancel(context.WithoutCancel(ctx))
	p := &remoteProcess{d: d, body: pw, abort: abort, done: make(chan struct{})}
	go func() {
		p.send(append(line, '\n'))
		if eof {
			p.CloseStdin()
		}
	}()
	stop := context.AfterFunc(ctx, func() {
		p.event(apiv1.Event{Event: apiv1.InputCancel})
		t := time.NewTimer(cancelWait)
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
	resp, err := d.request(reqCtx, http.MethodPost, sessionPath(session, "exec"), pr, apiv1.NDJSON, apiv1.NDJSON)
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
	if p.started = waitStarted(started, p.done); p.started != nil {
		return p, nil
	}
	if p.err == nil {
		p.err = d.gone(errors.New("the answer ended before the command started"))
	}
	return nil, p.err
}

// waitStarted returns the started event that read passes on started, or nil when the
// answer ended (done closed) without one. A short command's whole answer (started,
// then its result) can be read before the caller waits: done is then closed too, and
// a select that picked either at random took such a call for one that never started
// (exit 125, "the answer ended before the command started"). read sends on started
// before it closes done, so started is looked at again once done is closed.
func waitStarted(started <-chan *apiv1.ExecStarted, done <-chan struct{}) *apiv1.ExecStarted {
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
func (p *remoteProcess) read(resp *http.Response, stdout, stderr io.Writer, started chan<- *apiv1.ExecStarted, stop func() bool) {
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
				p.err = p.d.gone(fmt.Errorf("an answer line: %w", jerr))
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
					p.err = &apiError{status: http.StatusOK, info: *ev.Error}
					return
				}
			}
		}
		if err != nil {
			if !got {
				p.err = p.d.gone(fmt.Errorf("the answer ended without its result: %v", err))
			}
			return
		}
		if got {
			return
		}
	}
}

// event sends one input event.
func (p *remoteProcess) event(ev apiv1.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return p.send(append(b, '\n'))
}

func (p *remoteProcess) send(line []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.body.Write(line)
	return err
}

// maxStdinEvent is the most stdin bytes one event carries.
const maxStdinEvent = 32 << 10

func (p *remoteProcess) Write(b []byte) (int, error) {
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

func (p *remoteProcess) CloseStdin() error { return p.event(apiv1.Event{Event: apiv1.InputEOF}) }

func (p *remoteProcess) Resize(backend.WindowSize) error {
	return backend.Errorf(backend.ErrInvalid, "resize: not a terminal exec")
}

func (p *remoteProcess) Signal(sig int) error {
	return p.event(apiv1.Event{Event: apiv1.InputSignal, Signal: sig})
}

func (p *remoteProcess) Wait() (backend.ExecResult, error) {
	<-p.done
	return resultOf(p.res, p.err)
}

// resultOf is a daemon's exec result (or err) as a Process's Wait returns it.
func resultOf(r apiv1.ExecResult, err error) (backend.ExecResult, error) {
	if err != nil {
		return backend.ExecResult{}, err
	}
	return backend.ExecResult{ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, Canceled: r.Canceled,
		OOMKilled: r.OOMKilled, Duration: time.Duration(r.DurationMS) * time.Millisecond}, nil
}
