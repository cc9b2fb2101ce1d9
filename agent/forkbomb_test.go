package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// pidsCgroup makes a pids cgroup (v1 or v2) limited to max tasks and returns its
// directory, or skips the test when none can be made.
func pidsCgroup(t *testing.T, max int) string {
	t.Helper()
	var parent string
	for _, p := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			if _, err := os.Stat(filepath.Join(p, "pids.max")); err == nil || p == "/sys/fs/cgroup/pids" {
				parent = p
				break
			}
		}
	}
	if parent == "" {
		t.Skip("no pids cgroup controller")
	}
	dir := filepath.Join(parent, fmt.Sprintf("berth-agent-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a pids cgroup: %v", err)
	}
	t.Cleanup(func() {
		// Normally empty by now (Shutdown killed everything); if the agent died, kill
		// what it left in the cgroup, by pid, until nothing is left.
		testwait.For(context.Background(), 0, func() bool {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			pids := strings.Fields(string(b))
			for _, p := range pids {
				if n, err := strconv.Atoi(p); err == nil {
					syscall.Kill(n, syscall.SIGKILL)
				}
			}
			return len(pids) == 0
		})
		os.Remove(dir)
	})
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(max)), 0); err != nil {
		t.Skipf("cannot limit pids: %v", err)
	}
	return dir
}

func cgroupPids(dir string) int {
	b, _ := os.ReadFile(filepath.Join(dir, "pids.current"))
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// Under a fork bomb that exhausts the sandbox's pids limit, the agent stays up: it
// survives SIGTERM, answers, kills the bomb's tree on timeout, and runs execs again.
func TestForkBombPidsExhausted(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	cg := pidsCgroup(t, 64)
	a := startAgent(t)
	// The agent and all its threads and children are limited together.
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(a.pid)), 0); err != nil {
		t.Skipf("cannot move the agent into the cgroup: %v", err)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash (its loop survives failed forks; dash's does not)")
	}
	// The bomb's timeout must pass after the limit is reached: one that a slow
	// machine's bomb outlasts is tried again with twice the time.
	var errb bytes.Buffer
	var p backend.Process
	for timeout := 3 * time.Second; ; timeout *= 2 {
		errb.Reset()
		var err error
		p, err = a.c.Exec(testCtx(t), backend.ExecRequest{
			Argv:    []string{bash, "-c", "while :; do sleep 307 & done 2>/dev/null"},
			Timeout: timeout,
			Stderr:  &errb,
		})
		if err != nil {
			t.Fatal(err)
		}
		ended := make(chan struct{})
		go func() { p.Wait(); close(ended) }()
		reached := false
		testwait.Until(t, "the pids limit to be reached or the bomb to end", func() bool {
			select {
			case <-ended:
				return true
			default:
			}
			reached = cgroupPids(cg) >= 62
			return reached
		})
		if reached {
			break
		}
		if timeout >= testwait.Limit {
			t.Fatalf("the fork bomb never reached the pids limit within its %v timeout", timeout)
		}
		t.Logf("the bomb's %v timeout passed before the pids limit was reached; again with %v", timeout, 2*timeout)
	}
	// Signals from inside and execs that cannot fork do not bring the agent down.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		syscall.Kill(a.pid, sig)
	}
	for i := 0; i < 4; i++ {
		if q, err := a.c.Exec(testCtx(t), backend.ExecRequest{Argv: []string{"true"}}); err == nil {
			q.Wait()
		} else if !errors.Is(err, backend.ErrUnavailable) {
			t.Errorf("exec under pids exhaustion: %v", err)
		}
	}
	res, err := p.Wait()
	if err != nil || !res.TimedOut {
		t.Fatalf("fork bomb: %+v %v; stderr %q", res, err, errb.String())
	}
	// What is left is what the test's own cgroup holds (a search of every process
	// for "sleep 307" would also find another test run's bomb on the same machine):
	// the agent alone.
	b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	if left := strings.Fields(string(b)); len(left) != 1 || left[0] != strconv.Itoa(a.pid) {
		t.Errorf("after the bomb's tree was killed its cgroup holds %v, want the agent (%d) alone", left, a.pid)
	}
	select {
	case <-a.exited:
		log, _ := os.ReadFile(a.logPath)
		t.Fatalf("the agent died; log:\n%s", log)
	default:
	}
	if out, _, _ := run(t, a.c, sh("echo recovered")); out != "recovered\n" {
		t.Errorf("after the bomb: %q", out)
	}
}
