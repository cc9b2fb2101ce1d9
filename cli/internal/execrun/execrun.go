// Package execrun is berth exec without --shell from its flags to its exit code,
// shared by berth's CLI (cli, embedded or through berth serve) and its thin
// front (cli/front, through berth serve), so that the two cannot disagree on
// berth exec's output, signals, messages and exit codes: berth's own exit codes
// (124 timeout, 125 berth failed or was used wrongly, 128+N a signal first; the rest
// are the command's, docs/cli.md), the errors that carry them (ExitError) and how
// they are printed (Report).
//
// It links only the standard library and berth's light packages (backend,
// server/apiv1, client, internal/output, internal/sigstart): the thin front links it, and
// must start fast.
package execrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/output"
	"github.com/berth-sh/berth/internal/sigstart"
	"github.com/berth-sh/berth/server/apiv1"
)

// Exit codes of berth itself; every other code is the command's.
const (
	// ExitTimeout is the exit code of an exec that timed out (as timeout(1)).
	ExitTimeout = 124
	// ExitInternal is the exit code when berth itself failed or was used wrongly.
	ExitInternal = 125
)

// defaultJSONCap is the per-stream output cap in --json mode when --max-output is
// not given.
const defaultJSONCap = 1 << 20

// Flags are berth exec's flags (docs/cli.md): the session, the command's
// environment (KEY=VALUE), working directory and timeout, -i, -t, --max-output
// (bytes per stream, -1 for none), --json, --shell's command and --recreate.
type Flags struct {
	Session   string
	Env       []string
	Workdir   string
	Timeout   time.Duration
	Stdin     bool
	TTY       bool
	MaxOutput int64
	JSON      bool
	Shell     string
	Recreate  bool
}

// DefaultSession is the session of a command without -s: $BERTH_SESSION, else
// "main".
func DefaultSession() string {
	if s := os.Getenv("BERTH_SESSION"); s != "" {
		return s
	}
	return "main"
}

// Starter is the way to a session's sandbox that Run starts the command through:
// the registry embedded, or berth serve. Exec starts req in session and returns its
// process and where it runs (the started event's fields); Recreate removes the
// session's sandbox first (--recreate) and reports whether there was one; Close
// releases what the way holds.
type Starter interface {
	Exec(ctx context.Context, session string, req backend.ExecRequest) (backend.Process, *apiv1.ExecStarted, error)
	Recreate(ctx context.Context, session string) (bool, error)
	Close() error
}

// ExitError carries an exit code out of a command; Err, when set, is printed
// (Report).
type ExitError struct {
	Code int
	Err  error
}

// Error returns Err's text, or "exit CODE" without one.
func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}

// ExitCode is an *ExitError with code and nothing to print.
func ExitCode(code int) error { return &ExitError{Code: code} }

// Usage is a berth failure (exit 125) for a command used wrongly, with the message
// format and args make.
func Usage(format string, args ...any) error {
	return &ExitError{Code: ExitInternal, Err: fmt.Errorf(format, args...)}
}

// Failure wraps err as a berth failure (exit 125); an *ExitError in err's chain is
// returned as it is, and nil stays nil.
func Failure(err error) error {
	if err == nil {
		return nil
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return err
	}
	return &ExitError{Code: ExitInternal, Err: err}
}

// Report prints a command's error on stderr as "berth: MESSAGE" (nothing for an
// *ExitError without Err) and returns berth's exit code for it: 0 for nil, an
// *ExitError's Code, else 125.
func Report(err error) int {
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintf(os.Stderr, "berth: %s\n", message(ee.Err))
		}
		return ee.Code
	}
	fmt.Fprintf(os.Stderr, "berth: %s\n", message(err))
	return ExitInternal
}

// Run runs argv in session f.Session as berth exec does without --shell: it checks
// the flags that cobra cannot (Check), sets up berth's output (capped, captured for
// --json, or raw for -t), opens the way to the sandbox with open (the registry
// embedded, or the daemon), starts the command (after --recreate's removal) while
// it watches SIGINT, SIGTERM and SIGHUP, forwards them to the command once it runs,
// passes stdin with -i, and returns nil for exit 0 or an *ExitError: the command's
// code, 124 for a timeout, 128+N for a signal that came first, 125 for berth's own
// failure with what failed (Report prints it and returns the code).
func Run(ctx context.Context, f *Flags, argv []string, open func(context.Context) (Starter, error)) error {
	if err := Check(f); err != nil {
		return err
	}
	req := backend.ExecRequest{Argv: argv, Env: f.Env, Dir: f.Workdir, Timeout: f.Timeout, Stdin: f.Stdin || f.TTY, TTY: f.TTY}
	out := newExecOutput(f, &req)
	if f.TTY {
		restore, err := rawTerminal(&req)
		if err != nil {
			return err
		}
		defer restore()
		out.restore = restore
	}

	a, err := open(ctx)
	if err != nil {
		return err
	}
	defer a.Close()

	execCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-out.stopped:
			cancel()
		case <-execCtx.Done():
		}
	}()
	// SIGINT, SIGTERM and SIGHUP have been caught since berth started (sigstart):
	// those that came already are in sigs.
	sigs := sigstart.Take()
	signal.Notify(sigs, syscall.SIGWINCH)
	defer signal.Stop(sigs)

	p, lease, recreated, early, err := startExec(execCtx, cancel, a, f.Session, f.Recreate, req, sigs)
	if err != nil {
		return StartError(f.Session, early, err)
	}
	if !f.JSON {
		ReportLease(f.Session, lease)
	}
	if recreated { // asked for: said in --json only
		lease.Recreated, lease.RecreatedReason = true, RecreateReason
	}
	fw := &signalForwarder{p: p, tty: f.TTY, cancel: cancel}
	fw.replay(early)
	done := make(chan struct{})
	defer close(done)
	go fw.run(sigs, done)
	if req.Stdin {
		go func() {
			io.Copy(ProcessWriter{P: p}, os.Stdin)
			p.CloseStdin()
		}()
	}
	res, err := p.Wait()
	return out.finish(f, lease, res, err)
}

// Check checks the flags of a plain exec that cobra cannot.
func Check(f *Flags) error {
	if err := CheckSession(f.Session); err != nil {
		return err
	}
	if err := CheckEnv(f.Env); err != nil {
		return err
	}
	if f.Timeout < 0 {
		return Usage("--timeout %v: must not be negative", f.Timeout)
	}
	if f.JSON && f.TTY {
		return Usage("--json and -t cannot be combined: a terminal merges stdout and stderr")
	}
	return nil
}

// execOutput is where a plain exec's output goes: berth's own stdout and stderr
// (the first failed write stops the command, as a closed pipe does, and berth exits
// 125 saying why: output is never lost silently), capped by --max-output, or
// captured for --json.
type execOutput struct {
	stdout, stderr       *outWriter
	outCap, errCap       *output.Capture
	outStream, errStream *headWriter
	stopped              chan struct{} // closed at the first failed write
	restore              func()        // puts the terminal back (-t)
}

// newExecOutput sets req's writers as f asks and returns them.
func newExecOutput(f *Flags, req *backend.ExecRequest) *execOutput {
	o := &execOutput{stopped: make(chan struct{})}
	var once sync.Once
	stop := func() { once.Do(func() { close(o.stopped) }) }
	o.stdout = &outWriter{w: os.Stdout, name: "stdout", fail: stop}
	o.stderr = &outWriter{w: os.Stderr, name: "stderr", fail: stop}
	capBytes := f.MaxOutput
	if f.JSON && capBytes < 0 {
		capBytes = defaultJSONCap
	}
	switch {
	case f.JSON:
		o.outCap, o.errCap = output.NewCapture(capBytes), output.NewCapture(capBytes)
		req.Stdout, req.Stderr = o.outCap, o.errCap
	case capBytes >= 0:
		o.outStream, o.errStream = &headWriter{w: o.stdout, n: capBytes}, &headWriter{w: o.stderr, n: capBytes}
		req.Stdout, req.Stderr = o.outStream, o.errStream
	default:
		req.Stdout, req.Stderr = o.stdout, o.stderr
	}
	return o
}

// rawTerminal checks that stdin is a terminal, sets req's initial size from
// berth's terminal and puts it in raw mode; the returned function restores it.
func rawTerminal(req *backend.ExecRequest) (func(), error) {
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return nil, Usage("-t needs a terminal on stdin; drop -t or run from a terminal")
	}
	if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
		req.Size = backend.WindowSize{Rows: uint16(h), Cols: uint16(w)}
	} else {
		req.Size = backend.WindowSize{Rows: 24, Cols: 80}
	}
	state, err := term.MakeRaw(fd)
	if err != nil {
		return nil, Failure(fmt.Errorf("cannot put the terminal in raw mode: %w", err))
	}
	var once sync.Once
	return func() { once.Do(func() { term.Restore(fd, state) }) }, nil
}

// EarlySignals are the signals that came while the command was being started.
type EarlySignals struct {
	// Signals are the terminating signals, in the order they came.
	Signals []os.Signal
	// Resized says that a SIGWINCH came: the terminal's size is sent once the
	// command runs.
	Resized bool
}

// ErrBeforeStart is startExec's error for a signal that came before anything was
// started.
var ErrBeforeStart = errors.New("the signal came before anything was started")

// PendingSignal returns a terminating signal that berth has received by now: it is in
// sigs once sigstart.Sync returns (a SIGWINCH there only sets early.Resized), or nil.
func PendingSignal(sigs <-chan os.Signal, early *EarlySignals) os.Signal {
	sigstart.Sync()
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGWINCH {
				early.Resized = true
				continue
			}
			return s
		default:
			return nil
		}
	}
}

// StartError is berth's error for a call that did not start: 128+N with
// "interrupted before the command ran" when a signal came first, else a failure.
func StartError(session string, early EarlySignals, err error) error {
	if len(early.Signals) > 0 {
		return &ExitError{Code: 128 + int(early.Signals[0].(syscall.Signal)), Err: fmt.Errorf("session %s: interrupted before the command ran: %v", session, err)}
	}
	return Failure(err)
}

// startExec starts the command in session (after --recreate's removal, which
// recreated reports), watching sigs meanwhile.
// A signal that is already in sigs (it came while berth was starting up or reading its
// config) means that nothing is started: berth exits 128+N (startError).
// Until reg.Exec returns, a sandbox may be being created or pulled, or the command may
// have just started while its session is recorded. A signal then is kept: when the
// call succeeds it is forwarded to the command (EarlySignals), as one a moment later
// would be; when the call is still busy StartGrace later (or at a second signal) the
// call is cancelled, and berth exits 128+N leaving nothing half made.
func startExec(ctx context.Context, cancel context.CancelFunc, reg Starter, session string, recreate bool, req backend.ExecRequest, sigs <-chan os.Signal) (backend.Process, *apiv1.ExecStarted, bool, EarlySignals, error) {
	var early EarlySignals
	if s := PendingSignal(sigs, &early); s != nil {
		early.Signals = append(early.Signals, s)
		return nil, nil, false, early, ErrBeforeStart
	}
	starting := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		var grace <-chan time.Time
		for {
			select {
			case <-starting:
				return
			case <-grace:
				cancel()
				return
			case s := <-sigs:
				if s == syscall.SIGWINCH {
					early.Resized = true
					continue
				}
				early.Signals = append(early.Signals, s)
				if len(early.Signals) > 1 {
					cancel()
					return
				}
				grace = time.After(StartGrace)
			}
		}
	}()
	recreated, err := RecreateFirst(ctx, reg, session, recreate)
	var p backend.Process
	var lease *apiv1.ExecStarted
	if err == nil {
		p, lease, err = reg.Exec(ctx, session, req)
	}
	close(starting)
	<-watched
	return p, lease, recreated, early, err
}

// signalForwarder passes berth's signals on to the running command: SIGWINCH as a
// resize (-t), a second SIGINT as the kill of its tree, the others to its process
// group.
type signalForwarder struct {
	p          backend.Process
	tty        bool
	cancel     context.CancelFunc
	interrupts int
}

func (fw *signalForwarder) handle(s os.Signal) {
	sig := s.(syscall.Signal)
	switch {
	case sig == syscall.SIGWINCH:
		if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil && fw.tty {
			fw.p.Resize(backend.WindowSize{Rows: uint16(h), Cols: uint16(w)})
		}
	case sig == syscall.SIGINT && fw.interrupts > 0:
		fw.cancel() // the second interrupt kills the tree
	default:
		if sig == syscall.SIGINT {
			fw.interrupts++
		}
		fw.p.Signal(int(sig))
	}
}

// replay forwards what came while the command was being started: it started after
// all, so they are the command's.
func (fw *signalForwarder) replay(early EarlySignals) {
	if early.Resized {
		fw.handle(syscall.SIGWINCH)
	}
	for _, s := range early.Signals {
		fw.handle(s)
	}
}

// run forwards sigs until done is closed.
func (fw *signalForwarder) run(sigs <-chan os.Signal, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case s := <-sigs:
			fw.handle(s)
		}
	}
}

// finish reports the command's end: a failed write of berth's own output, the
// call's error, the --json object or the --max-output note, and berth's exit code
// (the command's, 124 for a timeout, 130 for an exec cancelled by a second SIGINT).
func (o *execOutput) finish(f *Flags, lease *apiv1.ExecStarted, res backend.ExecResult, err error) error {
	if o.restore != nil {
		o.restore()
	}
	for _, w := range []*outWriter{o.stdout, o.stderr} {
		if w.err != nil {
			return Failure(fmt.Errorf("writing the command's %s: %v; the command was stopped", w.name, w.err))
		}
	}
	if err != nil {
		return Failure(err)
	}
	if f.JSON {
		out := apiv1.ExecResult{
			ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
			DurationMS: res.Duration.Milliseconds(), Session: lease.Session, Driver: lease.Driver, Sandbox: lease.Sandbox,
			Recreated: lease.Recreated, RecreatedReason: lease.RecreatedReason,
			Moved: lease.Moved, MovedReason: lease.MovedReason, Pooled: lease.Pooled, Canceled: res.Canceled,
		}
		out.Stdout, out.StdoutTruncatedBytes = o.outCap.Text()
		out.Stderr, out.StderrTruncatedBytes = o.errCap.Text()
		enc := json.NewEncoder(os.Stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(out); err != nil {
			return Failure(err)
		}
	} else {
		for _, h := range []*headWriter{o.outStream, o.errStream} {
			if h != nil && h.dropped > 0 {
				fmt.Fprintf(os.Stderr, "berth: output capped by --max-output: %d bytes dropped\n", h.dropped)
			}
		}
	}
	switch {
	case res.TimedOut:
		return TimedOut(f)
	case res.Canceled && res.ExitCode == 0:
		return ExitCode(128 + int(syscall.SIGINT))
	case res.ExitCode != 0:
		return ExitCode(res.ExitCode)
	}
	return nil
}

// outWriter writes to one of berth's own output streams. After the first failure it
// drops the rest and calls fail once; err is read after the exec has ended.
type outWriter struct {
	w    io.Writer
	name string
	fail func()
	err  error
}

func (o *outWriter) Write(b []byte) (int, error) {
	if o.err == nil {
		if _, err := o.w.Write(b); err != nil {
			o.err = err
			o.fail()
		}
	}
	return len(b), nil
}

// ProcessWriter adapts a Process's stdin to io.Writer.
type ProcessWriter struct{ P backend.Process }

// Write sends b to the process's stdin (Process.Write).
func (w ProcessWriter) Write(b []byte) (int, error) { return w.P.Write(b) }

// headWriter passes the first n bytes through and counts the rest.
type headWriter struct {
	w       io.Writer
	n       int64
	dropped int64
}

func (h *headWriter) Write(b []byte) (int, error) {
	keep := int64(len(b))
	if keep > h.n {
		keep = h.n
	}
	if keep > 0 {
		if _, err := h.w.Write(b[:keep]); err != nil {
			return 0, err
		}
		h.n -= keep
	}
	h.dropped += int64(len(b)) - keep
	return len(b), nil
}

// StartGrace is how long a signal that came while berth was still getting the
// sandbox and starting the command waits for the command to start before it cancels
// the call: long enough for the session record written after the start, far shorter
// than a sandbox create or an image pull.
const StartGrace = time.Second

// RecreateReason is the recreated_reason of a call made with --recreate (the
// API's recreate field says apiv1.RecreateReason).
const RecreateReason = "recreated as asked (--recreate)"

// RecreateFirst removes session's sandbox when on (--recreate) and reports whether
// there was one.
func RecreateFirst(ctx context.Context, reg interface {
	Recreate(ctx context.Context, session string) (bool, error)
}, session string, on bool) (bool, error) {
	if !on {
		return false, nil
	}
	return reg.Recreate(ctx, session)
}

// ReportLease says on stderr, in one line, when session's sandbox is new (the files
// of the old one are gone, never silently) or when the session is back in an earlier
// sandbox (the one it leaves keeps running until prune); nothing otherwise.
func ReportLease(session string, lease *apiv1.ExecStarted) {
	switch {
	case lease.Recreated:
		fmt.Fprintf(os.Stderr, "berth: session %s: %s\n", session, lease.RecreatedReason)
	case lease.Moved:
		fmt.Fprintf(os.Stderr, "berth: session %s: %s\n", session, lease.MovedReason)
	}
}

// TimedOut is the end of an exec whose --timeout passed (plain or shell mode): a
// note on stderr (none with --json, whose timed_out says it) and exit 124.
func TimedOut(f *Flags) error {
	if !f.JSON {
		fmt.Fprintf(os.Stderr, "berth: the command timed out after %v (--timeout); its process tree was killed\n", f.Timeout)
	}
	return ExitCode(ExitTimeout)
}

// CheckSession refuses the session name "--": pflag takes the argument after -s as
// its value, so `berth exec -s -- CMD` names a session "--" where the name was left
// out. berth-cli's -s flags refuse it as they parse (a flag error, exit 125); the
// front hands such a command line over.
func CheckSession(session string) error {
	if session == "--" {
		return Usage("-s %q: %s", session, MissingSession)
	}
	return nil
}

// MissingSession is CheckSession's message without the value.
const MissingSession = `the session name is missing (-s took the "--" after it); give the name after -s: -s NAME -- CMD [ARG...]`

// CheckEnv checks -e values: each must be KEY=VALUE with a non-empty KEY.
func CheckEnv(env []string) error {
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return Usage("-e %q: want KEY=VALUE", kv)
		}
	}
	return nil
}
