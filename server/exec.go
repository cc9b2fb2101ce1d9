package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/output"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiconv"
	"github.com/berth-sh/berth/server/apiv1"
)

// execCall is an ExecRequest checked and turned into what the registry takes.
type execCall struct {
	shell   bool
	argv    []string
	command string
	env     []string
	cwd     string
	user    string
	timeout time.Duration
	max     *int64
	stdin   []byte // nil: no stdin
	in      *input // a streamed request's input: stdin and signals
}

// checkExec validates req; errors are invalid and say which field is wrong.
func checkExec(req *apiv1.ExecRequest) (*execCall, error) {
	c := &execCall{argv: req.Argv, command: req.Command, cwd: req.Cwd, user: req.User, max: req.MaxOutput}
	switch {
	case len(req.Argv) > 0 && req.Command != "":
		return nil, errorf("invalid", "give either argv (a plain exec) or command (shell mode), not both")
	case len(req.Argv) == 0 && req.Command == "":
		return nil, errorf("invalid", "no command: give argv (a plain exec, e.g. [\"sh\",\"-c\",\"echo hi\"]) or command (shell mode)")
	case req.Command != "" && strings.TrimSpace(req.Command) == "":
		return nil, errorf("invalid", "command: empty shell-mode command")
	case req.Command != "" && req.User != "":
		return nil, errorf("invalid", "user: shell mode runs as the sandbox's user; drop user or use argv")
	case len(req.Argv) > 0 && req.Argv[0] == "":
		// The API's own edge refuses it (a TTY must hear it as a 400 before its
		// upgrade); the registry refuses it too, for its own callers.
		return nil, errorf("invalid", "argv[0]: empty program name")
	}
	c.shell = req.Command != ""
	for i, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return nil, errorf("invalid", "argv[%d] holds a NUL character", i)
		}
	}
	for _, v := range []struct{ name, val string }{{"command", req.Command}, {"cwd", req.Cwd}, {"user", req.User}} {
		if strings.ContainsRune(v.val, 0) {
			return nil, errorf("invalid", "%s holds a NUL character", v.name)
		}
	}
	env, err := envList(req.Env)
	if err != nil {
		return nil, err
	}
	c.env = env
	if req.Timeout != "" {
		d, err := config.ParseDuration(req.Timeout)
		if err != nil {
			return nil, errorf("invalid", "timeout: %v", err)
		}
		c.timeout = d
	}
	if req.MaxOutput != nil && *req.MaxOutput < 0 {
		return nil, errorf("invalid", "max_output %d: must be 0 or more bytes", *req.MaxOutput)
	}
	if c.shell && req.MaxOutput != nil && *req.MaxOutput == 0 {
		c.max = nil // shell mode: 0 is the rule's max_output
	}
	switch {
	case req.Stdin != nil && req.StdinBase64 != nil:
		return nil, errorf("invalid", "give stdin or stdin_base64, not both")
	case req.Stdin != nil:
		c.stdin = []byte(*req.Stdin)
	case req.StdinBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*req.StdinBase64)
		if err != nil {
			return nil, errorf("invalid", "stdin_base64: %v", err)
		}
		c.stdin = b
	}
	return c, nil
}

// wantsStream reports whether r asks for an NDJSON answer (Accept names NDJSON).
func wantsStream(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == apiv1.NDJSON {
			return true
		}
	}
	return false
}

// exec is POST /v1/sessions/{name}/exec.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	name := r.PathValue("name")
	var req apiv1.ExecRequest
	var rest *bufio.Reader // a streamed request's input events
	if isNDJSON(r) {
		line, br, err := s.readFirstLine(w, r)
		if err == nil {
			if derr := decodeStrict(line, &req); derr != nil {
				err = errorf("invalid", "request body's first line: %v", derr)
			}
		}
		if err != nil {
			s.writeError(w, r, err, name)
			if br != nil {
				discardInput(br, s.maxBody).finish(w, r, s.bodyTimeout, s.shutting)
			}
			return
		}
		rest = br
	} else if err := s.readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err, name)
		return
	}
	c, err := checkExec(&req)
	if err == nil && rest != nil && (req.Stdin != nil || req.StdinBase64 != nil) {
		err = errorf("invalid", "a streamed request sends its stdin as stdin events; drop stdin and stdin_base64 from its first line")
	}
	if err != nil {
		s.writeError(w, r, err, name)
		if rest != nil {
			discardInput(rest, s.maxBody).finish(w, r, s.bodyTimeout, s.shutting)
		}
		return
	}
	auditCommand(r, c)
	ref := s.acquire()
	defer s.release(ref)
	reg := ref.reg
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var in *input
	if rest != nil {
		in = newInput(rest, s.maxBody, reg.StateDir(), cancel)
		// Last, once the answer is written (every return below).
		defer in.finish(w, r, s.bodyTimeout, s.shutting)
	}
	c.in = in
	recreated := false
	if req.Recreate {
		if recreated, err = reg.Recreate(ctx, name); err != nil {
			s.writeError(w, r, err, name)
			return
		}
	}
	var st *stream
	if wantsStream(r) {
		st = newStream(w)
		defer st.open()
	}
	var res apiv1.ExecResult
	if c.shell {
		res, err = s.runShell(ctx, reg, name, c, st)
	} else {
		res, err = s.runPlain(ctx, reg, name, c, st)
	}
	if recreated && err == nil {
		res.Recreated, res.RecreatedReason = true, apiv1.RecreateReason
	}
	if in != nil && err != nil && ctx.Err() != nil {
		// The call was cancelled: by a bad input event, or by net/http because the
		// connection ended, which is also how a body that broke off ends. The body's
		// reader says which; let it finish reading first (it is at the body's end).
		in.settle()
	}
	if in != nil && in.badEvent() != nil {
		err = in.badEvent()
	}
	switch {
	case err != nil && (st == nil || !st.started()):
		s.writeError(w, r, err, name)
	case err != nil:
		info := errorInfo(err, name)
		auditError(r, info.Kind)
		st.event(apiv1.Event{Event: "error", Error: &info})
	case st != nil:
		st.event(apiv1.Event{Event: "result", Result: &res})
	default:
		writeJSON(w, http.StatusOK, res)
	}
	auditResult(r, res, err)
	s.metrics.exec(res.Driver, c.shell, st != nil, res, err, start)
	s.log.Info("exec", "session", name, "shell", c.shell, "exit_code", res.ExitCode, "timed_out", res.TimedOut, "duration_ms", res.DurationMS, "error", err)
}

// runPlain runs an argv exec: output captured for a JSON answer, or sent as events.
func (s *Server) runPlain(ctx context.Context, reg *registry.Registry, name string, c *execCall, st *stream) (apiv1.ExecResult, error) {
	breq := backend.ExecRequest{Argv: c.argv, Env: c.env, Dir: c.cwd, User: c.user, Timeout: c.timeout, Stdin: c.stdin != nil}
	var outCap, errCap *output.Capture
	var outEv, errEv *capped
	if st == nil {
		limit := int64(apiv1.DefaultMaxOutput)
		if c.max != nil {
			limit = *c.max
		}
		outCap, errCap = output.NewCapture(limit), output.NewCapture(limit)
		breq.Stdout, breq.Stderr = outCap, errCap
	} else {
		outEv, errEv = st.writer("stdout", c.max), st.writer("stderr", c.max)
		breq.Stdout, breq.Stderr = outEv, errEv
	}
	if c.in != nil {
		breq.Stdin = true
	}
	p, lease, err := reg.Exec(ctx, name, breq)
	if err != nil {
		return apiv1.ExecResult{}, err
	}
	if st != nil {
		st.event(apiv1.Event{Event: "started", Started: apiconv.StartedOf(lease)})
		st.open()
	}
	switch {
	case c.stdin != nil:
		go func() {
			p.Write(c.stdin)
			p.CloseStdin()
		}()
	case c.in != nil:
		go func() {
			io.Copy(processWriter{p}, c.in.sp)
			p.CloseStdin()
		}()
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case sig := <-c.in.signals:
					p.Signal(sig)
				case <-done:
					return
				}
			}
		}()
	}
	res, err := p.Wait()
	if err != nil {
		return apiv1.ExecResult{}, err
	}
	out := apiv1.ExecResult{
		ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
		DurationMS: res.Duration.Milliseconds(), Session: lease.Session, Driver: lease.Driver, Sandbox: lease.Sandbox,
		Recreated: lease.Recreated, RecreatedReason: lease.RecreatedReason, Moved: lease.Moved, MovedReason: lease.MovedReason,
		Pooled: lease.Pooled, Canceled: res.Canceled,
	}
	if st == nil {
		out.Stdout, out.StdoutTruncatedBytes = outCap.Text()
		out.Stderr, out.StderrTruncatedBytes = errCap.Text()
	} else {
		out.StdoutTruncatedBytes, out.StderrTruncatedBytes = outEv.dropped, errEv.dropped
	}
	return out, nil
}

// runShell runs a shell-mode call; a streamed answer gets the raw output as events
// besides the capped text in the result.
func (s *Server) runShell(ctx context.Context, reg *registry.Registry, name string, c *execCall, st *stream) (apiv1.ExecResult, error) {
	sreq := registry.ShellRequest{Command: c.command, Env: c.env, Dir: c.cwd, Timeout: c.timeout}
	if c.max != nil {
		sreq.MaxOutput = *c.max
	}
	switch {
	case c.stdin != nil:
		sreq.Stdin = bytes.NewReader(c.stdin)
	case c.in != nil:
		sreq.Stdin = c.in.sp
		// A shell-mode call takes no signals: one ends the call, as cancel does.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-c.in.signals:
				cancel()
			case <-ctx.Done():
			}
		}()
		return s.shellCall(ctx, reg, name, sreq, st)
	}
	return s.shellCall(ctx, reg, name, sreq, st)
}

// shellCall makes a shell-mode call and converts its result.
func (s *Server) shellCall(ctx context.Context, reg *registry.Registry, name string, sreq registry.ShellRequest, st *stream) (apiv1.ExecResult, error) {
	if st != nil {
		sreq.Stdout, sreq.Stderr = st.writer("stdout", nil), st.writer("stderr", nil)
		sreq.Started = func() {
			st.event(apiv1.Event{Event: "started", Started: &apiv1.ExecStarted{Session: name}})
			st.open()
		}
	}
	res, err := reg.Shell(ctx, name, sreq)
	if err != nil {
		return apiv1.ExecResult{}, err
	}
	return apiv1.ExecResult{
		ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
		DurationMS: res.Duration.Milliseconds(), Session: res.Session, Driver: res.Driver, Sandbox: res.Sandbox,
		Recreated: res.Recreated, RecreatedReason: res.RecreatedReason, Moved: res.Moved, MovedReason: res.MovedReason,
		Pooled: res.Pooled, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncatedBytes: res.StdoutTruncatedBytes, StderrTruncatedBytes: res.StderrTruncatedBytes,
		Cwd: res.Cwd, StdoutFile: res.StdoutFile, StderrFile: res.StderrFile,
		StdoutFileTruncatedBytes: res.StdoutFileTruncatedBytes, StderrFileTruncatedBytes: res.StderrFileTruncatedBytes,
		OutputFilesRemoved: res.OutputFilesRemoved, Canceled: res.Canceled,
	}, nil
}

// processWriter adapts a Process's stdin to io.Writer.
type processWriter struct{ p backend.Process }

func (w processWriter) Write(b []byte) (int, error) { return w.p.Write(b) }

// stream writes a streamed answer's events, each line flushed at once, so that a
// client that stops reading holds the command back (flow control: nothing grows).
type stream struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	mu    sync.Mutex
	begun bool
	err   error // the first failed write; later events are dropped
	// gate holds output events back until the started event is written (open):
	// the command runs, and may write, before registry.Exec or the shell call's
	// Started hook returns, and the started event must come first.
	gate     chan struct{}
	gateOnce sync.Once
}

func newStream(w http.ResponseWriter) *stream {
	return &stream{w: w, rc: http.NewResponseController(w), gate: make(chan struct{})}
}

// open lets output events through (once the started event is written, or when the
// call ends without one); it may be called more than once.
func (st *stream) open() { st.gateOnce.Do(func() { close(st.gate) }) }

// started reports whether the answer's header has been sent.
func (st *stream) started() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.begun
}

// beginLocked sends the answer's header (200, NDJSON) with the first event, once the
// command runs: errors before that get an ordinary error answer with their status.
func (st *stream) beginLocked() {
	if st.begun {
		return
	}
	st.begun = true
	st.w.Header().Set("Content-Type", apiv1.NDJSON)
	st.w.Header().Set("X-Content-Type-Options", "nosniff")
	st.w.WriteHeader(http.StatusOK)
	st.rc.Flush()
}

// event writes one event line; it returns the first write error.
func (st *stream) event(ev apiv1.Event) error { return st.line(ev) }

// logEvent writes one job log event line; it returns the first write error.
func (st *stream) logEvent(ev apiv1.LogEvent) error { return st.line(ev) }

// line writes v as one JSON line and flushes it; it returns the first write error.
func (st *stream) line(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.beginLocked()
	if st.err != nil {
		return st.err
	}
	if _, err := st.w.Write(append(b, '\n')); err != nil {
		st.err = err
		return err
	}
	if err := st.rc.Flush(); err != nil {
		st.err = err
	}
	return st.err
}

// writer returns an io.Writer that sends what it is given as events of kind name,
// the first *limit bytes only when limit is set (the rest counted in dropped).
func (st *stream) writer(name string, limit *int64) *capped {
	c := &capped{st: st, name: name, left: -1}
	if limit != nil {
		c.left = *limit
	}
	return c
}

// capped is one output stream's event writer.
type capped struct {
	st      *stream
	name    string
	left    int64 // bytes still to send; -1 for no cap
	dropped int64
}

// maxEvent is the most output bytes one event carries (before base64).
const maxEvent = 32 << 10

func (c *capped) Write(b []byte) (int, error) {
	<-c.st.gate
	n := len(b)
	if c.left >= 0 {
		keep := min(int64(len(b)), c.left)
		c.dropped += int64(len(b)) - keep
		c.left -= keep
		b = b[:keep]
	}
	for len(b) > 0 {
		k := min(len(b), maxEvent)
		if err := c.st.event(apiv1.Event{Event: c.name, Data: b[:k]}); err != nil {
			return 0, fmt.Errorf("sending %s: %w", c.name, err)
		}
		b = b[k:]
	}
	return n, nil
}

var _ io.Writer = (*capped)(nil)
