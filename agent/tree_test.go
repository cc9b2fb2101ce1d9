package agent

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// The kill of an exec at its timeout takes a setsid descendant whose parent is still
// there (the case: `setsid sleep & sleep`) and one whose parent has gone
// (reparented to the agent, found by its marker only).
func TestTimeoutKillsSetsidDescendants(t *testing.T) {
	a := startAgent(t)
	// $! is printed after the fork: the child, with the exec's marker, exists by then.
	script := `setsid sleep 7781 & echo $!; sh -c 'setsid sleep 7782 & echo $!'; sleep 99`
	out, _, res := run(t, a.c, backend.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 2 * time.Second})
	if !res.TimedOut {
		t.Fatalf("result %+v, want timed out", res)
	}
	pids := strings.Fields(out)
	if len(pids) != 2 {
		t.Fatalf("output %q: the timeout passed before the script started both children", out)
	}
	// The result comes only after the tree is gone: no waiting here.
	for _, args := range [][]string{{"sleep", "7781"}, {"sleep", "7782"}} {
		if p := procsWithArgs(args...); len(p) != 0 {
			t.Errorf("%s still runs after the exec's timeout: %v", strings.Join(args, " "), p)
		}
	}
	for _, s := range pids {
		pid, _ := strconv.Atoi(s)
		if descendant(pid, os.Getpid()) {
			t.Errorf("pid %d, started by the exec, outlived its timeout", pid)
		}
	}
}

// Cancel takes the exec's setsid descendants, an orphaned one and one that dropped
// its environment while its parent is still there, and nothing of another exec
// running beside it nor what an earlier exec left in the background.
func TestCancelKillsSetsidDescendantsOnly(t *testing.T) {
	a := startAgent(t)
	// An earlier exec's background process, in a session of its own: it outlives
	// its exec's normal end and the later kill.
	if out, _, res := run(t, a.c, sh("setsid sleep 7783 & echo bg")); out != "bg\n" || res.ExitCode != 0 {
		t.Fatalf("background exec: %q %+v", out, res)
	}
	testwait.Until(t, "the earlier exec's background sleep", func() bool { return len(procsWithArgs("sleep", "7783")) == 1 })

	// Another exec beside the one cancelled, with its own setsid descendant.
	otherCtx, otherCancel := context.WithCancel(testCtx(t))
	defer otherCancel()
	otherOut := &testwait.Buffer{}
	other, err := a.c.Exec(otherCtx, backend.ExecRequest{Argv: []string{"sh", "-c", "setsid sleep 7784 & echo ready; sleep 98"}, Stdout: otherOut})
	if err != nil {
		t.Fatal(err)
	}
	otherOut.WaitFor(t, "ready")

	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	buf := &testwait.Buffer{}
	script := `sh -c 'setsid sleep 7785 &'; env -i setsid sleep 7786 & echo ready; sleep 97`
	p, err := a.c.Exec(ctx, backend.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: buf})
	if err != nil {
		t.Fatal(err)
	}
	buf.WaitFor(t, "ready")
	testwait.Until(t, "every sleep to run", func() bool {
		for _, n := range []string{"7784", "7785", "7786"} {
			if len(procsWithArgs("sleep", n)) != 1 {
				return false
			}
		}
		return true
	})
	cancel()
	if res, err := p.Wait(); err != nil || !res.Canceled {
		t.Fatalf("cancel: %+v %v", res, err)
	}
	for _, n := range []string{"7785", "7786"} {
		if pids := procsWithArgs("sleep", n); len(pids) != 0 {
			t.Errorf("sleep %s, started by the cancelled exec, still runs: %v", n, pids)
		}
	}
	if len(procsWithArgs("sleep", "7784")) != 1 {
		t.Error("the cancel killed a process of another exec")
	}
	if len(procsWithArgs("sleep", "7783")) != 1 {
		t.Error("the cancel killed a process that an earlier exec left in the background")
	}
	otherCancel()
	if res, err := other.Wait(); err != nil || !res.Canceled {
		t.Fatalf("cancel of the other exec: %+v %v", res, err)
	}
	if pids := procsWithArgs("sleep", "7784"); len(pids) != 0 {
		t.Errorf("sleep 7784 outlived its exec's cancel: %v", pids)
	}
}

// A shell-mode call does not pass its marker on to the session's next call (the
// recorded state would restore it over the next call's own).
func TestShellStateKeepsNoMarker(t *testing.T) {
	a := startAgent(t)
	first, _, _ := shellDo(t, a.c, "m", "", `echo "$`+execMarkerVar+`"; export KEEP=1`)
	second, _, _ := shellDo(t, a.c, "m", "", `echo "$`+execMarkerVar+`$KEEP"`)
	m1, m2 := strings.TrimSpace(first), strings.TrimSuffix(strings.TrimSpace(second), "1")
	if m1 == "" || m2 == "" || m1 == m2 || !strings.HasSuffix(second, "1\n") {
		t.Errorf("markers of two calls: %q then %q; want two different ones (and KEEP=1 kept)", first, second)
	}
}

// environHas finds a marker anywhere in the first maxEnvironScan bytes of an
// environment, across its read chunks, and nothing beyond.
func TestEnvironHas(t *testing.T) {
	want := []byte("\x00BERTH_EXEC=abc.7\x00")
	for _, tc := range []struct {
		name string
		env  []string
		has  bool
	}{
		{"first", []string{"BERTH_EXEC=abc.7", "A=1"}, true},
		{"last", []string{"A=1", "BERTH_EXEC=abc.7"}, true},
		// The first read ends 9 bytes into the marker.
		{"across a chunk", []string{"A=" + strings.Repeat("x", 32<<10+5), "BERTH_EXEC=abc.7"}, true},
		{"prefix of another", []string{"BERTH_EXEC=abc.70", "XBERTH_EXEC=abc.7"}, false},
		{"past the bound", []string{"A=" + strings.Repeat("x", 100<<10), "B=" + strings.Repeat("x", 100<<10), "C=" + strings.Repeat("x", 100<<10), "BERTH_EXEC=abc.7"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "3600")
			cmd.Env = tc.env
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			// The child's environment is its own once it runs sleep (before that,
			// /proc shows the test's).
			testwait.Until(t, "the child to run sleep", func() bool {
				b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline")
				return string(b) == "sleep\x003600\x00"
			})
			if got, sure := environHas(cmd.Process.Pid, want); got != tc.has || !sure {
				t.Errorf("environHas = %v (sure %v), want %v, sure", got, sure, tc.has)
			}
		})
	}
}

// A process whose environment cannot be read yet (or any more) is not declared
// unmarked for good: environHas says it is not sure, so a kill reads it again.
func TestEnvironHasNotSureOfNothing(t *testing.T) {
	if has, sure := environHas(1<<30, []byte("\x00A=B\x00")); has || sure {
		t.Errorf("environHas of no process = %v, sure %v; want false, not sure", has, sure)
	}
	// A zombie's environment reads empty, as a process between fork and execve does.
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	testwait.Until(t, "the child to be a zombie", func() bool {
		p, ok := readStat(cmd.Process.Pid)
		return ok && p.state == 'Z'
	})
	if has, sure := environHas(cmd.Process.Pid, []byte("\x00A=B\x00")); has || sure {
		t.Errorf("environHas of a zombie = %v, sure %v; want false, not sure", has, sure)
	}
}
