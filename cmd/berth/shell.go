package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/sigstart"
	"github.com/berth-sh/berth/server"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// shellArgv starts the sandbox's best login shell: bash when it has one, sh otherwise
// (the same command as a TTY of berth serve runs by default).
var shellArgv = server.LoginShell

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
	cmd.Flags().StringVarP(&session, "session", "s", defaultSession(), "session name ($BERTH_SESSION sets the default)")
	cmd.Flags().BoolVar(&recreate, "recreate", false, "remove the session's sandbox first and open the shell in a new one made from its rule's current config")
	return takesSignals(cmd)
}

func runShell(ctx context.Context, g *globals, session string, recreate bool) error {
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	if !term.IsTerminal(in) {
		return usageError("berth shell needs a terminal on stdin; use 'berth exec -i -s %s -- sh' to pipe commands", session)
	}
	size, _ := terminalSize(out)
	// SIGINT, SIGTERM and SIGHUP have been caught since berth started (sigstart); in
	// raw mode the terminal sends ^C as a byte, so these only come from elsewhere. One
	// that came before the shell starts means that nothing is started; later ones are
	// forwarded to the shell.
	sigs := sigstart.Take()
	defer signal.Stop(sigs)
	winch := make(chan os.Signal, 4)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	g.onPull = newPullDisplay(false).event
	reg, err := g.open(ctx)
	if err != nil {
		return failure(err)
	}
	defer reg.Close()
	var early earlySignals
	if s := pendingSignal(sigs, &early); s != nil {
		early.signals = append(early.signals, s)
		return startError(session, early, errBeforeStart)
	}
	if _, err := recreateFirst(ctx, embedded{reg}, session, recreate); err != nil {
		return failure(err)
	}

	p, lease, err := reg.Exec(ctx, session, backend.ExecRequest{Argv: shellArgv, TTY: true, Size: size, Stdin: true, Stdout: os.Stdout})
	if err != nil {
		return failure(err)
	}
	reportLease(session, lease)
	state, err := term.MakeRaw(in)
	if err != nil {
		return failure(err)
	}
	defer term.Restore(in, state)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				if size, ok := terminalSize(out); ok {
					p.Resize(size)
				}
			case s := <-sigs:
				p.Signal(int(s.(syscall.Signal)))
			}
		}
	}()
	go func() {
		io.Copy(processWriter{p}, os.Stdin)
		p.CloseStdin()
	}()
	res, err := p.Wait()
	term.Restore(in, state)
	if err != nil {
		return failure(err)
	}
	if res.ExitCode != 0 {
		return exitCode(res.ExitCode)
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

// runShellDaemon is runShell through a running berth serve (its TTY WebSocket), with
// the same terminal handling, output and exit codes.
func runShellDaemon(ctx context.Context, d daemonAPI, session string, recreate bool) error {
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	if !term.IsTerminal(in) {
		return usageError("berth shell needs a terminal on stdin; use 'berth exec -i -s %s -- sh' to pipe commands", session)
	}
	size, _ := terminalSize(out)
	sigs := sigstart.Take()
	defer signal.Stop(sigs)
	winch := make(chan os.Signal, 4)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	var early earlySignals
	if s := pendingSignal(sigs, &early); s != nil {
		early.signals = append(early.signals, s)
		return startError(session, early, errBeforeStart)
	}
	raw := func() (func(), error) {
		state, err := term.MakeRaw(in)
		if err != nil {
			return nil, err
		}
		return func() { term.Restore(in, state) }, nil
	}
	res, err := d.shell(ctx, session, recreate, os.Stdin, os.Stdout, size, func() (backend.WindowSize, bool) { return terminalSize(out) }, winch, sigs, raw)
	if err != nil {
		return failure(err)
	}
	if res.ExitCode != 0 {
		return exitCode(res.ExitCode)
	}
	return nil
}
