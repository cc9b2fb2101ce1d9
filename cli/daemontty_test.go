package cli

import (
	"strings"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// berth exec -t on a real terminal, embedded and through berth serve's TTY
// WebSocket, with the same results: the command gets a terminal of berth's size
// and every later size (SIGWINCH, which the test's resize sends berth), typed input,
// ^C typed on the terminal (a byte: the sandbox's terminal makes it SIGINT for the
// command), berth's exit code from the command's, and berth's terminal back in its
// usual mode after berth's raw mode.
func TestExecTTY(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// read -t returns now and then, so that bash runs the WINCH trap (a trap on
	// SIGWINCH does not interrupt a plain read).
	script := `trap 'echo "size=$(stty size)"' WINCH; trap 'echo got-INT' INT; echo "start=$(stty size) tty=$(tty >/dev/null && echo yes)"; ` +
		`while :; do read -t 0.2 line && case "$line" in quit) echo "bye $HOME_SET"; exit 3;; esac; done`
	var d *daemon
	for _, mode := range []string{"embedded", "daemon"} {
		t.Run(mode, func(t *testing.T) {
			e := e.with(t)
			args := []string{"exec", "-t", "-s", "tty:" + mode, "-e", "HOME_SET=x", "--", "bash", "-c", script}
			if mode == "embedded" {
				args = append([]string{"--no-daemon"}, args...)
			} else {
				d = e.serve()
			}
			p := startPTY(t, e, 30, 100, args...)
			p.waitFor("start=30 100 tty=yes", 1)
			p.resize(50, 132)
			p.waitFor("size=50 132", 1)
			p.type_("\x03")
			p.waitFor("got-INT", 1)
			p.type_("hello\rquit\r")
			if code := p.wait(); code != 3 {
				t.Errorf("exit %d, want the command's 3; the terminal showed %q", code, p.output())
			}
			if out := p.output(); !strings.Contains(out, "bye x") {
				t.Errorf("the terminal showed %q, want the command's bye x", out)
			}
			if !p.restored {
				t.Errorf("berth left its terminal in raw mode")
			}
			if mode == "daemon" {
				// Logged before the result is sent, but read from berth serve's
				// stderr pipe by another goroutine: wait for it.
				if l := d.waitLog("tty", 1); l["exit_code"] != float64(3) {
					t.Errorf("exec -t through berth serve's TTY: logged %v; want exit_code 3\n%s", l, d.stderr)
				}
			}
		})
	}
}

// A command that cannot run on a terminal says why, embedded and through berth
// serve's TTY WebSocket alike: the agent writes the reason to the exec's stderr, which
// the daemon's TTY used to drop (exit 127 with nothing on the terminal).
func TestExecTTYCannotRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, mode := range []string{"embedded", "daemon"} {
		t.Run(mode, func(t *testing.T) {
			e := e.with(t)
			args := []string{"exec", "-t", "-s", "tty-nf:" + mode, "--", "no-such-command-here"}
			if mode == "embedded" {
				args = append([]string{"--no-daemon"}, args...)
			} else {
				e.serve()
			}
			p := startPTY(t, e, 24, 80, args...)
			if code := p.wait(); code != 127 {
				t.Errorf("exit %d, want 127; the terminal showed %q", code, p.output())
			}
			if out := p.output(); !strings.Contains(out, "no-such-command-here: command not found") {
				t.Errorf("the terminal showed %q, want the reason: command not found", out)
			}
		})
	}
}

// Signals sent to berth exec -t (not typed: from kill) are the embedded ones
// through the daemon too: SIGINT goes to the command's process group, a second one
// kills its tree (berth exits 143, its result's code); --timeout kills it and berth
// exits 124.
func TestExecTTYSignals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	for _, mode := range []string{"embedded", "daemon"} {
		t.Run(mode, func(t *testing.T) {
			e := e.with(t)
			pre := []string{}
			if mode == "embedded" {
				pre = []string{"--no-daemon"}
			}
			mark := newMark()
			args := append(pre, "exec", "-t", "-s", "sig:"+mode, "-e", markEnv(mark), "--", "bash", "-c",
				`trap 'echo got-INT' INT; sleep 300 & echo ready; while :; do wait; done`)
			p := startPTY(t, e, 24, 80, args...)
			p.waitFor("ready", 1)
			testwait.Until(t, "the command and its sleep", func() bool { return len(marked(mark)) >= 2 })
			p.cmd.Process.Signal(syscall.SIGINT)
			p.waitFor("got-INT", 1)
			p.cmd.Process.Signal(syscall.SIGINT)
			if code := p.wait(); code != 143 {
				t.Errorf("exit %d after a second SIGINT, want 143; the terminal showed %q", code, p.output())
			}
			if left := marked(mark); len(left) > 0 {
				t.Errorf("the command's tree outlives the second SIGINT:\n%s", describe(left))
			}
			if !p.restored {
				t.Errorf("berth left its terminal in raw mode")
			}

			p = startPTY(t, e, 24, 80, append(pre, "exec", "-t", "-s", "sig:"+mode, "--timeout", "1s", "--", "sleep", "300")...)
			if code := p.wait(); code != 124 {
				t.Errorf("exec -t --timeout: exit %d, want 124; the terminal showed %q", code, p.output())
			}
		})
	}
	d.waitLog("tty", 2)
	if l := d.logs("tty"); len(l) != 2 {
		t.Errorf("want the daemon's two TTYs in its log, got %v\n%s", l, d.stderr)
	}
}
