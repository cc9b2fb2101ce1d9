package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testproc"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// agentBin is the static test agent (testdata/agentmain) built by TestMain.
var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-agent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "berth-agent")
	goTool, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintf(os.Stderr, "building the test agent needs the go tool in PATH: %v\n", err)
		os.Exit(1)
	}
	cmd := exec.Command(goTool, "build", "-o", agentBin, "./testdata/agentmain")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the test agent: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// deepDir returns a new directory whose path is at least 150 bytes long.
func deepDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for i := 0; len(d) < 150; i++ {
		d = filepath.Join(d, fmt.Sprintf("deep-%02d-%s", i, strings.Repeat("x", 20)))
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// testAgent is an agent process started from agentBin.
type testAgent struct {
	cmd     *exec.Cmd
	pid     int
	sockDir string
	logPath string
	exited  chan struct{}
	c       *Client

	noSubreaper bool
	stateDir    string
	// extra are more flags for `serve` (--token-file, --exec-user, --oom-counter);
	// opts the client options that reach it (WithToken).
	extra []string
	opts  []ClientOption
}

// testCtx is a test's context; its deadline is only a safety net.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	t.Cleanup(cancel)
	return ctx
}

// startAgent starts an agent (own session, subreaper, socket in a 150-byte deep
// directory) and connects a client to it. Cleanup shuts it down.
func startAgent(t *testing.T, env ...string) *testAgent {
	t.Helper()
	a := &testAgent{sockDir: deepDir(t), logPath: filepath.Join(t.TempDir(), "agent.log"), exited: make(chan struct{})}
	a.start(t, env...)
	c, err := NewClient(testCtx(t), DialSocketDir(a.sockDir))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	a.c = c
	t.Cleanup(func() { c.Close() })
	return a
}

func (a *testAgent) start(t *testing.T, env ...string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	args := []string{"serve", "--socket-dir", a.sockDir, "--ready-fd", "3", "--log", a.logPath}
	if !a.noSubreaper {
		args = append(args, "--subreaper")
	}
	if a.stateDir != "" {
		args = append(args, "--state-dir", a.stateDir)
	}
	args = append(args, a.extra...)
	cmd := exec.Command(agentBin, args...)
	cmd.ExtraFiles = []*os.File{w}
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	a.cmd, a.pid = cmd, cmd.Process.Pid
	go func() {
		cmd.Wait()
		close(a.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-a.exited:
			return
		default:
		}
		if c, err := NewClient(context.Background(), DialSocketDir(a.sockDir), a.opts...); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
			c.Shutdown(ctx, 100*time.Millisecond)
			cancel()
			c.Close()
		}
		select {
		case <-a.exited:
		case <-time.After(testwait.Limit):
			t.Errorf("agent %d did not exit after Shutdown", a.pid)
			cmd.Process.Kill()
			<-a.exited
		}
	})
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || line != "ready\n" {
		log, _ := os.ReadFile(a.logPath)
		t.Fatalf("agent not ready: %q %v\nlog:\n%s", line, err, log)
	}
}

// run executes req and returns its output and result; errors are fatal.
func run(t *testing.T, c *Client, req backend.ExecRequest) (stdout, stderr string, res backend.ExecResult) {
	t.Helper()
	var out, errb bytes.Buffer
	req.Stdout, req.Stderr = &out, &errb
	p, err := c.Exec(testCtx(t), req)
	if err != nil {
		t.Fatalf("Exec %q: %v", req.Argv, err)
	}
	res, err = p.Wait()
	if err != nil {
		t.Fatalf("Wait %q: %v", req.Argv, err)
	}
	return out.String(), errb.String(), res
}

func sh(script string) backend.ExecRequest {
	return backend.ExecRequest{Argv: []string{"sh", "-c", script}}
}

// procsWithArgs lists the live processes whose command line is exactly args.
// Only this test process's descendants count (the agents it starts are its children,
// and their subreaper keeps their trees under them): another run of these tests on
// the same machine starts the same commands.
func procsWithArgs(args ...string) []int {
	var out []int
	for _, pid := range testproc.WithArgs(args...) {
		if descendant(pid, os.Getpid()) {
			out = append(out, pid)
		}
	}
	return out
}

// descendant reports whether pid is a descendant of root (false once pid is gone).
func descendant(pid, root int) bool {
	for i := 0; i < 64 && pid > 1; i++ {
		p, ok := readStat(pid)
		if !ok {
			return false
		}
		if p.ppid == root {
			return true
		}
		pid = p.ppid
	}
	return false
}

// childrenOf lists the children of pid (zombies included).
func childrenOf(pid int) []procInfo {
	var out []procInfo
	testproc.Find(func(n int) bool {
		if p, ok := readStat(n); ok && p.ppid == pid {
			out = append(out, p)
		}
		return false
	})
	return out
}

// newAgentCmd is an agent command line on dir that is not waited for by a cleanup.
func newAgentCmd(dir string) *exec.Cmd {
	return exec.Command(agentBin, "serve", "--socket-dir", dir)
}
