package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/internal/sigstart"
	"github.com/berth-sh/berth/server/apiconv"
	"github.com/berth-sh/berth/server/apiv1"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// shellArgv starts the sandbox's best login shell: bash when it has one, sh otherwise
// (the same command as a TTY of berth serve runs by default).
var shellArgv = apiv1.LoginShell

func newShellCmd(g *globals) *cobra.Command {
	var session string
	var recreate bool
	cmd := &cobra.Command{
		Use:   "shell [-s SESSION] [--recreate]",
		Short: "Open an interactive shell in a session's sandbox",
		Long: `Open an interactive shell with a terminal in the sandbox of SESSION (default "main").
The terminal follows window resizes and is restored on exit; berth exits with the shell's
exit code.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runShell(cmd.Context(), g, session, recreate)
		},
	}
	sessionFlag(cmd.Flags(), &session)
	cmd.Flags().BoolVar(&recreate, "recreate", false, "remove the session's sandbox first and open the shell in a new one made from its rule's current config")
	return takesSignals(cmd)
}

func runShell(ctx context.Context, g *globals, session string, recreate bool) error {
	// Through a running berth serve when one answers (daemon.go): its TTY WebSocket.
	d, err := g.daemon(ctx)
	if err != nil {
		return execrun.Failure(err)
	}
	if d != nil {
		return runShellDaemon(ctx, d, session, recreate)
	}
	tm, err := openShellTerminal(session)
	if err != nil {
		return err
	}
	defer tm.close()
	size, _ := terminalSize(tm.out)
	g.onPull = newPullDisplay(false).event
	reg, err := g.open(ctx)
	if err != nil {
		return execrun.Failure(err)
	}
	defer reg.Close()
	if err := tm.early(session); err != nil {
		return err
	}
	if _, err := execrun.RecreateFirst(ctx, embedded{Registry: reg}, session, recreate); err != nil {
		return execrun.Failure(err)
	}

	p, lease, err := reg.Exec(ctx, session, backend.ExecRequest{Argv: shellArgv, TTY: true, Size: size, Stdin: true, Stdout: os.Stdout})
	if err != nil {
		return execrun.Failure(err)
	}
	execrun.ReportLease(session, apiconv.StartedOf(lease))
	restore, err := tm.raw()
	if err != nil {
		return execrun.Failure(err)
	}
	defer restore()
	done := make(chan struct{})
	defer close(done)
	go tm.forward(done, p.Resize, func(s syscall.Signal) error { return p.Signal(int(s)) })
	go func() {
		io.Copy(execrun.ProcessWriter{P: p}, os.Stdin)
		p.CloseStdin()
	}()
	res, err := p.Wait()
	restore()
	if err != nil {
		return execrun.Failure(err)
	}
	if res.ExitCode != 0 {
		return execrun.ExitCode(res.ExitCode)
	}
	return nil
}

// terminalSize returns the size of the terminal fd, or 24×80 and false when it has
// none.
func terminalSize(fd int) (backend.WindowSize, bool) {
	w, h, err := term.GetSize(fd)
	if err != nil || w <= 0 || h <= 0 {
		return backend.WindowSize{Rows: 24, Cols: 80}, false
	}
	return backend.WindowSize{Rows: uint16(h), Cols: uint16(w)}, true
}

// shellTerminal is berth shell's terminal: stdin and stdout, and the signals it
// forwards. SIGINT, SIGTERM and SIGHUP have been caught since berth started
// (sigstart); in raw mode the terminal sends ^C as a byte, so these only come from
// elsewhere. One that came before the shell starts means that nothing is started;
// later ones are forwarded to the shell, as SIGWINCH is as a resize.
type shellTerminal struct {
	in, out     int
	sigs, winch chan os.Signal
}

// openShellTerminal checks that stdin is a terminal and starts catching the signals;
// close it when the shell has ended.
func openShellTerminal(session string) (*shellTerminal, error) {
	tm := &shellTerminal{in: int(os.Stdin.Fd()), out: int(os.Stdout.Fd())}
	if !term.IsTerminal(tm.in) {
		return nil, execrun.Usage("berth shell needs a terminal on stdin; use 'berth exec -i -s %s -- sh' to pipe commands", session)
	}
	tm.sigs = sigstart.Take()
	tm.winch = make(chan os.Signal, 4)
	signal.Notify(tm.winch, syscall.SIGWINCH)
	return tm, nil
}

// early is startError's exit (128+N) when a signal came before the shell started.
func (tm *shellTerminal) early(session string) error {
	var early execrun.EarlySignals
	if s := execrun.PendingSignal(tm.sigs, &early); s != nil {
		early.Signals = append(early.Signals, s)
		return execrun.StartError(session, early, execrun.ErrBeforeStart)
	}
	return nil
}

// raw puts the terminal in raw mode; restore puts it back (more than once is fine).
func (tm *shellTerminal) raw() (restore func(), err error) {
	state, err := term.MakeRaw(tm.in)
	if err != nil {
		return nil, err
	}
	return func() { term.Restore(tm.in, state) }, nil
}

func (tm *shellTerminal) close() {
	signal.Stop(tm.sigs)
	signal.Stop(tm.winch)
}

// forwardTerminal passes resizes (the terminal's size at each SIGWINCH) and signals
// on until done is closed.
func forwardTerminal(done <-chan struct{}, winch, sigs <-chan os.Signal, size func() (backend.WindowSize, bool), resize func(backend.WindowSize) error, sig func(syscall.Signal) error) {
	for {
		select {
		case <-done:
			return
		case <-winch:
			if sz, ok := size(); ok {
				resize(sz)
			}
		case s := <-sigs:
			sig(s.(syscall.Signal))
		}
	}
}

// forward is forwardTerminal for tm.
func (tm *shellTerminal) forward(done <-chan struct{}, resize func(backend.WindowSize) error, sig func(syscall.Signal) error) {
	forwardTerminal(done, tm.winch, tm.sigs, func() (backend.WindowSize, bool) { return terminalSize(tm.out) }, resize, sig)
}

// runShellDaemon is runShell through a running berth serve (its TTY WebSocket), with
// the same terminal handling, output and exit codes.
func runShellDaemon(ctx context.Context, d *daemonClient, session string, recreate bool) error {
	tm, err := openShellTerminal(session)
	if err != nil {
		return err
	}
	defer tm.close()
	if err := tm.early(session); err != nil {
		return err
	}
	size, _ := terminalSize(tm.out)
	res, err := d.shell(ctx, session, recreate, os.Stdin, os.Stdout, size, func() (backend.WindowSize, bool) { return terminalSize(tm.out) }, tm.winch, tm.sigs, tm.raw)
	if err != nil {
		return execrun.Failure(err)
	}
	if res.ExitCode != 0 {
		return execrun.ExitCode(res.ExitCode)
	}
	return nil
}
