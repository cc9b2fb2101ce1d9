package cli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// ptyTerm is a berth command running on a new pseudo-terminal (creack/pty), as a
// user's terminal runs it: berth is the session leader with the terminal as its
// controlling terminal, so a window size change sends it SIGWINCH. The test types
// into it (type_), resizes it, reads what it showed (output) and waits for its
// exit (wait).
type ptyTerm struct {
	t    *testing.T
	ptmx *os.File // the terminal's side the user has
	tty  *os.File // berth's side, kept open to read its modes after berth exits
	cmd  *exec.Cmd
	mu   sync.Mutex
	once sync.Once
	out  bytes.Buffer
	read chan struct{} // closed when the reader has stopped
	done chan struct{} // closed when berth has exited
	code int
	// restored: when berth had exited, its terminal was back in its usual
	// (canonical, echoing) mode, as before berth's raw mode.
	restored bool
}

// startPTY starts berth with args in e on a new terminal of rows×cols.
func startPTY(t *testing.T, e *env, rows, cols uint16, args ...string) *ptyTerm {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		t.Fatal(err)
	}
	cmd := e.command(args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &ptyTerm{t: t, ptmx: ptmx, tty: tty, cmd: cmd, read: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.read)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() {
		defer close(p.done)
		cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
		ptmx.Close()
		tty.Close()
	})
	return p
}

// output is what the terminal has shown so far.
func (p *ptyTerm) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitFor waits until the terminal has shown s n times.
func (p *ptyTerm) waitFor(s string, n int) {
	p.t.Helper()
	testwait.Until(p.t, "the terminal to show "+strings.Repeat(s+" ", n), func() bool {
		select {
		case <-p.done:
			return true // berth exited: checked below
		default:
		}
		return strings.Count(p.output(), s) >= n
	})
	if strings.Count(p.output(), s) < n {
		code := p.wait()
		if strings.Count(p.output(), s) < n {
			p.t.Fatalf("berth exited %d before the terminal showed %q %d times; it showed %q", code, s, n, p.output())
		}
	}
}

// type_ types s on the terminal.
func (p *ptyTerm) type_(s string) {
	p.t.Helper()
	if _, err := p.ptmx.WriteString(s); err != nil {
		p.t.Fatal(err)
	}
}

// resize changes the terminal's size (the kernel sends berth SIGWINCH).
func (p *ptyTerm) resize(rows, cols uint16) {
	p.t.Helper()
	if err := pty.Setsize(p.ptmx, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		p.t.Fatal(err)
	}
}

// wait waits for berth's exit (within testwait.Limit) and for the rest of what it
// showed, and returns its exit code; p.restored is set then.
func (p *ptyTerm) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(testwait.Limit):
		p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("berth did not exit within %v; the terminal showed %q", testwait.Limit, p.output())
	}
	p.once.Do(func() {
		tio, err := unix.IoctlGetTermios(int(p.tty.Fd()), unix.TCGETS)
		p.restored = err == nil && tio.Lflag&unix.ICANON != 0 && tio.Lflag&unix.ECHO != 0
		// With berth's side closed, the reader gets what is left, then EIO.
		p.tty.Close()
		<-p.read
	})
	return p.code
}

// runShellPTY runs `berth shell -s session` on a new pseudo-terminal, types input, and
// returns what the terminal showed and the exit code.
func runShellPTY(t *testing.T, e *env, session, input string) (string, int) {
	t.Helper()
	p := startPTY(t, e, 24, 80, "shell", "-s", session)
	p.type_(input)
	code := p.wait()
	return p.output(), code
}

// ptyRun runs `berth ARGS...` with environ on a new 24×80 pseudo-terminal, drains
// what it shows, and returns an error unless it exits 0.
func ptyRun(environ []string, args ...string) error {
	cmd := cli(environ, args...)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		return err
	}
	defer ptmx.Close()
	var out bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		out.ReadFrom(ptmx) // ends with EIO once berth, the terminal's last user, exits
	}()
	err = cmd.Wait()
	<-read
	if err != nil {
		return fmt.Errorf("berth %v: %v; the terminal showed %q", args, err, out.String())
	}
	return nil
}

// BenchmarkExecTTY compares `berth exec -t -- true` on a pseudo-terminal, the whole
// CLI, embedded and through berth serve's TTY WebSocket, with the daemon's plain
// `berth exec -- true`, in a warm local session (interleaved rounds, p50/p95).
//
//	go test ./cli -run '^$' -bench ExecTTY -benchtime 30x
func BenchmarkExecTTY(b *testing.B) {
	environ, _, _ := benchServe(b, "")
	if err := cli(environ, "exec", "-s", "b", "--", "true").Run(); err != nil {
		b.Fatal(err)
	}
	benchutil.Interleave(b, []benchutil.Way{
		{Name: "embedded-tty", Run: func() error { return ptyRun(environ, "--no-daemon", "exec", "-t", "-s", "b", "--", "true") }},
		{Name: "daemon-tty", Run: func() error { return ptyRun(environ, "exec", "-t", "-s", "b", "--", "true") }},
		{Name: "daemon-plain", Run: func() error { return cli(environ, "exec", "-s", "b", "--", "true").Run() }},
	})
}
