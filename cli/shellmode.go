package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/internal/sigstart"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// runShellMode is `berth exec --shell COMMAND`: Registry.Shell, then the capped
// output (or one JSON object) once the call has ended.
func runShellMode(ctx context.Context, g *globals, f *execrun.Flags) error {
	if err := execrun.CheckEnv(f.Env); err != nil {
		return err
	}
	switch {
	case f.Timeout < 0:
		return execrun.Usage("--timeout %v: must not be negative", f.Timeout)
	case f.TTY:
		return execrun.Usage("--shell and -t cannot be combined: shell mode returns captured output; use berth shell for a terminal")
	case strings.TrimSpace(f.Shell) == "":
		return execrun.Usage("--shell: empty command")
	case f.MaxOutput == 0:
		return execrun.Usage("--max-output 0: shell mode needs at least 1 byte per stream")
	}
	command := f.Shell
	if command == "-" {
		// The command text from stdin: a command (a 200 KB heredoc) longer than the
		// kernel's limit of one argument (128 KiB) cannot come through argv.
		if f.Stdin {
			return execrun.Usage("--shell - reads the command from stdin, so stdin cannot also be the command's (-i); put the input in the command (a heredoc)")
		}
		b, err := io.ReadAll(io.LimitReader(os.Stdin, maxShellCommand+1))
		switch {
		case err != nil:
			return execrun.Failure(fmt.Errorf("--shell -: reading the command from stdin: %v", err))
		case len(b) > maxShellCommand:
			return execrun.Usage("--shell -: the command on stdin is longer than %d bytes; run a script file instead (write it with berth cp, then --shell 'sh FILE')", maxShellCommand)
		case strings.TrimSpace(string(b)) == "":
			return execrun.Usage("--shell -: empty command on stdin")
		}
		command = string(b)
	}
	req := registry.ShellRequest{Command: command, Env: f.Env, Dir: f.Workdir, Timeout: f.Timeout, MaxOutput: max(f.MaxOutput, 0)}
	if f.Stdin {
		req.Stdin = os.Stdin
	}
	// SIGINT, SIGTERM and SIGHUP end the call: its process tree is killed and berth
	// exits 128+N. They have been caught since berth started (sigstart): one that
	// came before the call starts means that nothing is started.
	sigs := sigstart.Take()
	defer signal.Stop(sigs)
	g.onPull = newPullDisplay(f.JSON).event
	reg, err := g.api(ctx)
	if err != nil {
		return err
	}
	defer reg.Close()
	var early execrun.EarlySignals
	if s := execrun.PendingSignal(sigs, &early); s != nil {
		early.Signals = append(early.Signals, s)
		return execrun.StartError(f.Session, early, execrun.ErrBeforeStart)
	}
	recreated, err := execrun.RecreateFirst(ctx, reg, f.Session, f.Recreate)
	if err != nil {
		return execrun.Failure(err)
	}

	// A signal while the call is being started (its sandbox created or started) waits
	// for the start, as plain exec's does: the call is cancelled once it runs (so
	// its result says it was interrupted), or execrun.StartGrace later, or at a second
	// signal.
	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan os.Signal, 1)
	started := make(chan struct{})
	var startOnce sync.Once
	req.Started = func() { startOnce.Do(func() { close(started) }) }
	go func() {
		select {
		case s := <-sigs:
			got <- s
		case <-callCtx.Done():
			return
		}
		select {
		case <-started:
		case <-time.After(execrun.StartGrace):
		case <-sigs:
		case <-callCtx.Done():
		}
		cancel()
	}()

	res, err := reg.Shell(callCtx, f.Session, req)
	var interrupted syscall.Signal // the signal that ended the call, or 0
	select {
	case s := <-got:
		interrupted = s.(syscall.Signal)
	default:
	}
	if err != nil {
		if interrupted != 0 { // interrupted before the call ran (waiting for the session)
			return &execrun.ExitError{Code: 128 + int(interrupted), Err: fmt.Errorf("session %s: interrupted before the command ran", f.Session)}
		}
		return execrun.Failure(err)
	}
	if res.Canceled && interrupted != 0 {
		// The agent ended the call's tree with SIGTERM (then SIGKILL); what ended the
		// call is the signal berth got, and its result says so, as berth's exit code
		// does: 128+N.
		res.ExitCode, res.Signal = 128+int(interrupted), int(interrupted)
	}
	if f.JSON {
		out := apiv1.ExecResult{
			ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
			DurationMS: res.Duration.Milliseconds(), Session: res.Session, Driver: res.Driver, Sandbox: res.Sandbox,
			Stdout: res.Stdout, Stderr: res.Stderr,
			StdoutTruncatedBytes: res.StdoutTruncatedBytes, StderrTruncatedBytes: res.StderrTruncatedBytes,
			Cwd: res.Cwd, StdoutFile: res.StdoutFile, StderrFile: res.StderrFile,
			StdoutFileTruncatedBytes: res.StdoutFileTruncatedBytes, StderrFileTruncatedBytes: res.StderrFileTruncatedBytes,
			OutputFilesRemoved: res.OutputFilesRemoved,
			Recreated:          res.Recreated, RecreatedReason: res.RecreatedReason,
			Moved: res.Moved, MovedReason: res.MovedReason, Pooled: res.Pooled, Canceled: res.Canceled,
		}
		if recreated {
			out.Recreated, out.RecreatedReason = true, execrun.RecreateReason
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(out); err != nil {
			return execrun.Failure(err)
		}
	} else {
		if res.Recreated {
			fmt.Fprintf(os.Stderr, "berth: session %s: %s\n", res.Session, res.RecreatedReason)
		} else if res.Moved {
			fmt.Fprintf(os.Stderr, "berth: session %s: %s\n", res.Session, res.MovedReason)
		}
		if _, err := io.WriteString(os.Stdout, res.Stdout); err != nil {
			return execrun.Failure(fmt.Errorf("writing the command's stdout: %v", err))
		}
		io.WriteString(os.Stderr, res.Stderr)
		for _, s := range []struct {
			name           string
			left, fileLeft int64
			file           string
		}{{"stdout", res.StdoutTruncatedBytes, res.StdoutFileTruncatedBytes, res.StdoutFile},
			{"stderr", res.StderrTruncatedBytes, res.StderrFileTruncatedBytes, res.StderrFile}} {
			if s.left > 0 {
				fmt.Fprintf(os.Stderr, "berth: %s: %d bytes left out in the middle%s\n", s.name, s.left, spillNote(s.file, s.fileLeft))
			}
		}
		if res.OutputFilesRemoved > 0 {
			fmt.Fprintf(os.Stderr, "berth: session %s: deleted its %d oldest full-output files to stay within output_max_total\n", res.Session, res.OutputFilesRemoved)
		}
	}
	switch {
	case res.TimedOut:
		return execrun.TimedOut(f)
	case res.Canceled && interrupted != 0:
		return execrun.ExitCode(res.ExitCode)
	case res.Canceled:
		return execrun.ExitCode(128 + int(syscall.SIGINT))
	case res.ExitCode != 0:
		return execrun.ExitCode(res.ExitCode)
	}
	return nil
}

// maxShellCommand is the longest shell-mode command that --shell - reads, in
// bytes (3 MiB: the agent takes a call of up to 4 MiB).
const maxShellCommand = 3 << 20

// spillNote says where a capped stream's bytes are: the whole stream in file, or,
// when the file was cut too (left bytes past registry.DefaultFullOutputMax), its head.
func spillNote(file string, left int64) string {
	switch {
	case file == "":
		return ""
	case left > 0:
		return fmt.Sprintf("; its first %d bytes are in %s (%d more were not kept)", registry.DefaultFullOutputMax, file, left)
	}
	return "; the whole stream is in " + file
}
