package cli

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

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/output"
	"github.com/berth-sh/berth/internal/sigstart"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/registry/config"
	"github.com/berth-sh/berth/server/apiv1"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// defaultJSONCap is the per-stream output cap in --json mode when --max-output is not given.
const defaultJSONCap = 1 << 20

type execFlags struct {
	session   string
	env       []string
	workdir   string
	timeout   time.Duration
	stdin     bool
	tty       bool
	maxOutput int64
	json      bool
	shell     string
	recreate  bool
}

func newExecCmd(g *globals) *cobra.Command {
	f := &execFlags{}
	cmd := &cobra.Command{
		Use:   "exec [flags] -- CMD [ARG...] | exec [flags] --shell 'COMMAND'",
		Short: "Run a command in a session's sandbox",
		Long: `Run CMD in the sandbox of SESSION (default "main"), streaming its stdout and stderr,
and exit with its exit code. berth's own exit codes: 124 the command timed out, 125 berth
failed or was used wrongly, 126 not executable, 127 not found. SIGINT, SIGTERM and SIGHUP
are forwarded to the command's process group; a second SIGINT kills its process tree.

With --shell, COMMAND runs in shell mode (bash, else sh): the directory and exported
variables it leaves are the session's starting point for its next --shell call, calls
of one session run one at a time, and each stream is capped (head, a marker line with
the exact count of bytes left out, tail; 50 KiB unless --max-output or the rule's
max_output), the full stream kept in a file under the state dir.`,
		Example: `  berth exec -- sh -c 'echo hello; exit 3'
  berth exec -s chat:4711 --timeout 30s -- make test
  berth exec -s main --json --max-output 65536 -- ls -la
  berth exec -s chat:1 --shell 'cd /src && export CC=clang'
  berth exec -s chat:1 --shell 'make test' --json
  berth exec -s chat:1 --recreate -- true`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("max-output") && f.maxOutput < 0 {
				return usageError("--max-output %d: must be 0 or more bytes", f.maxOutput)
			}
			if cmd.Flags().Changed("shell") {
				if len(args) > 0 {
					return usageError("--shell takes the whole command as its value; drop the arguments after it (%q)", args)
				}
				return runShellMode(cmd.Context(), g, f)
			}
			if len(args) == 0 {
				return usageError("no command: give one after -- (berth exec -- CMD [ARG...]) or use --shell 'COMMAND'")
			}
			return runExec(cmd.Context(), g, f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.session, "session", "s", defaultSession(), "session name ($BERTH_SESSION sets the default)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable for this command (KEY=VALUE, repeatable)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory in the sandbox")
	fl.Var(durationValue{&f.timeout}, "timeout", "kill the command's process tree after this long (e.g. 30s, 5m, 1d) and exit 124")
	fl.BoolVarP(&f.stdin, "interactive", "i", false, "pass stdin to the command")
	fl.BoolVarP(&f.tty, "tty", "t", false, "allocate a terminal for the command")
	fl.Int64Var(&f.maxOutput, "max-output", -1, "cap each output stream at BYTES (default: no cap; 1 MiB per stream with --json)")
	fl.StringVar(&f.shell, "shell", "", "run this command string in shell mode (- reads it from stdin, for a command longer than the argument limit): cd and export carry over to the session's next --shell call; output capped at 50 KiB per stream unless --max-output")
	fl.BoolVar(&f.recreate, "recreate", false, "remove the session's sandbox first and run in a new one made from its rule's current config (the remedy for drift; files, processes and shell state in the old one are lost)")
	fl.BoolVar(&f.json, "json", false, "print one JSON object with the result and the output at the end (image pull progress, if any, as JSON lines on stderr)")
	fl.SetInterspersed(false)
	return takesSignals(cmd)
}

func defaultSession() string {
	if s := os.Getenv("BERTH_SESSION"); s != "" {
		return s
	}
	return "main"
}

// execJSON is the --json output of berth exec: the API's exec result
// (apiv1.ExecResult), so that berth exec --json and POST /v1/sessions/{name}/exec
// print the same object.
type execJSON = apiv1.ExecResult

func runExec(ctx context.Context, g *globals, f *execFlags, argv []string) error {
	if err := checkExecFlags(f); err != nil {
		return err
	}
	req := backend.ExecRequest{Argv: argv, Env: f.env, Dir: f.workdir, Timeout: f.timeout, Stdin: f.stdin || f.tty, TTY: f.tty}
	out := newExecOutput(f, &req)
	if f.tty {
		restore, err := rawTerminal(&req)
		if err != nil {
			return err
		}
		defer restore()
		out.restore = restore
	}

	g.onPull = newPullDisplay(f.json).event
	a, err := g.api(ctx)
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

	p, lease, recreated, early, err := startExec(execCtx, cancel, a, f.session, f.recreate, req, sigs)
	if err != nil {
		return startError(f.session, early, err)
	}
	if !f.json {
		reportLease(f.session, lease)
	}
	if recreated { // asked for: said in --json only
		lease.Recreated, lease.RecreatedReason = true, recreateReason
	}
	fw := &signalForwarder{p: p, tty: f.tty, cancel: cancel}
	fw.replay(early)
	done := make(chan struct{})
	defer close(done)
	go fw.run(sigs, done)
	if req.Stdin {
		go func() {
			io.Copy(processWriter{p}, os.Stdin)
			p.CloseStdin()
		}()
	}
	res, err := p.Wait()
	return out.finish(f, lease, res, err)
}

// checkExecFlags checks the flags of a plain exec that cobra cannot.
func checkExecFlags(f *execFlags) error {
	if err := checkEnvFlags(f.env); err != nil {
		return err
	}
	if f.timeout < 0 {
		return usageError("--timeout %v: must not be negative", f.timeout)
	}
	if f.json && f.tty {
		return usageError("--json and -t cannot be combined: a terminal merges stdout and stderr")
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
func newExecOutput(f *execFlags, req *backend.ExecRequest) *execOutput {
	o := &execOutput{stopped: make(chan struct{})}
	var once sync.Once
	stop := func() { once.Do(func() { close(o.stopped) }) }
	o.stdout = &outWriter{w: os.Stdout, name: "stdout", fail: stop}
	o.stderr = &outWriter{w: os.Stderr, name: "stderr", fail: stop}
	capBytes := f.maxOutput
	if f.json && capBytes < 0 {
		capBytes = defaultJSONCap
	}
	switch {
	case f.json:
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
		return nil, usageError("-t needs a terminal on stdin; drop -t or run from a terminal")
	}
	if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
		req.Size = backend.WindowSize{Rows: uint16(h), Cols: uint16(w)}
	} else {
		req.Size = backend.WindowSize{Rows: 24, Cols: 80}
	}
	state, err := term.MakeRaw(fd)
	if err != nil {
		return nil, failure(fmt.Errorf("cannot put the terminal in raw mode: %w", err))
	}
	var once sync.Once
	return func() { once.Do(func() { term.Restore(fd, state) }) }, nil
}

// earlySignals are the signals that came while the command was being started.
type earlySignals struct {
	signals []os.Signal
	resized bool // a SIGWINCH came: the terminal's size is sent once the command runs
}

// errBeforeStart is startExec's error for a signal that came before anything was
// started.
var errBeforeStart = errors.New("the signal came before anything was started")

// pendingSignal returns a terminating signal that berth has received by now: it is in
// sigs once sigstart.Sync returns (a SIGWINCH there only sets early.resized), or nil.
func pendingSignal(sigs <-chan os.Signal, early *earlySignals) os.Signal {
	sigstart.Sync()
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGWINCH {
				early.resized = true
				continue
			}
			return s
		default:
			return nil
		}
	}
}

// startError is berth's error for a call that did not start: 128+N with
// "interrupted before the command ran" when a signal came first, else a failure.
func startError(session string, early earlySignals, err error) error {
	if len(early.signals) > 0 {
		return &exitError{code: 128 + int(early.signals[0].(syscall.Signal)), err: fmt.Errorf("session %s: interrupted before the command ran: %v", session, err)}
	}
	return failure(err)
}

// startExec starts the command in session (after --recreate's removal, which
// recreated reports), watching sigs meanwhile.
// A signal that is already in sigs (it came while berth was starting up or reading its
// config) means that nothing is started: berth exits 128+N (startError).
// Until reg.Exec returns, a sandbox may be being created or pulled, or the command may
// have just started while its session is recorded. A signal then is kept: when the
// call succeeds it is forwarded to the command (earlySignals), as one a moment later
// would be; when the call is still busy startGrace later (or at a second signal) the
// call is cancelled, and berth exits 128+N leaving nothing half made.
func startExec(ctx context.Context, cancel context.CancelFunc, reg api, session string, recreate bool, req backend.ExecRequest, sigs <-chan os.Signal) (backend.Process, *registry.Lease, bool, earlySignals, error) {
	var early earlySignals
	if s := pendingSignal(sigs, &early); s != nil {
		early.signals = append(early.signals, s)
		return nil, nil, false, early, errBeforeStart
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
					early.resized = true
					continue
				}
				early.signals = append(early.signals, s)
				if len(early.signals) > 1 {
					cancel()
					return
				}
				grace = time.After(startGrace)
			}
		}
	}()
	recreated, err := recreateFirst(ctx, reg, session, recreate)
	var p backend.Process
	var lease *registry.Lease
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
func (fw *signalForwarder) replay(early earlySignals) {
	if early.resized {
		fw.handle(syscall.SIGWINCH)
	}
	for _, s := range early.signals {
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
func (o *execOutput) finish(f *execFlags, lease *registry.Lease, res backend.ExecResult, err error) error {
	if o.restore != nil {
		o.restore()
	}
	for _, w := range []*outWriter{o.stdout, o.stderr} {
		if w.err != nil {
			return failure(fmt.Errorf("writing the command's %s: %v; the command was stopped", w.name, w.err))
		}
	}
	if err != nil {
		return failure(err)
	}
	if f.json {
		out := execJSON{
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
			return failure(err)
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
		return exitCode(exitTimeout)
	case res.Canceled && res.ExitCode == 0:
		return exitCode(128 + int(syscall.SIGINT))
	case res.ExitCode != 0:
		return exitCode(res.ExitCode)
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

// processWriter adapts a Process's stdin to io.Writer.
type processWriter struct{ p backend.Process }

func (w processWriter) Write(b []byte) (int, error) { return w.p.Write(b) }

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

// startGrace is how long a signal that came while berth was still getting the
// sandbox and starting the command waits for the command to start before it cancels
// the call: long enough for the session record written after the start, far shorter
// than a sandbox create or an image pull.
const startGrace = time.Second

// recreateReason is the recreated_reason of a call made with --recreate (the
// API's recreate field says apiv1.RecreateReason).
const recreateReason = "recreated as asked (--recreate)"

// recreateFirst removes session's sandbox when on (--recreate) and reports whether
// there was one.
func recreateFirst(ctx context.Context, reg api, session string, on bool) (bool, error) {
	if !on {
		return false, nil
	}
	return reg.Recreate(ctx, session)
}

// reportLease says on stderr, in one line, when session's sandbox is new (the files
// of the old one are gone, never silently) or when the session is back in an earlier
// sandbox (the one it leaves keeps running until prune); nothing otherwise.
func reportLease(session string, lease *registry.Lease) {
	switch {
	case lease.Recreated:
		fmt.Fprintf(os.Stderr, "berth: session %s: %s\n", session, lease.RecreatedReason)
	case lease.Moved:
		fmt.Fprintf(os.Stderr, "berth: session %s: %s\n", session, lease.MovedReason)
	}
}

// checkEnvFlags checks -e values: each must be KEY=VALUE with a non-empty KEY.
func checkEnvFlags(env []string) error {
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return usageError("-e %q: want KEY=VALUE", kv)
		}
	}
	return nil
}

// durationValue is a duration flag that takes what config durations take: Go's units
// and d for 24 hours ("90s", "36h", "7d"; config.ParseDuration).
type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil || *v.d == 0 {
		return "0" // pflag shows no default for "0"
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	d, err := config.ParseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func (v durationValue) Type() string { return "duration" }
