package backends

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// raceEnabled is set by race_test.go; the plugin is then built with -race too,
// so the server side is checked as well.
var raceEnabled bool

// pluginBin is the testdata/testplugin binary built by TestMain.
var pluginBin string

const envTestHost = "BERTH_BACKENDS_TEST_HOST"

func TestMain(m *testing.M) {
	if p := os.Getenv(envTestHost); p != "" {
		os.Exit(hostMain(p))
	}
	// A -race plugin otherwise sleeps 1 s at exit.
	if os.Getenv("GORACE") == "" {
		_ = os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	dir, err := os.MkdirTemp("", "berth-backends-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pluginBin = filepath.Join(dir, "testplugin")
	args := []string{"build", "-o", pluginBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./testdata/testplugin")
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the test plugin:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// hostMain is the helper host of TestHostDeath: it launches the plugin, starts
// `sleep 300` through it, prints both pids and waits to be killed.
func hostMain(plugin string) int {
	ctx := context.Background()
	c, err := Launch(ctx, LaunchOptions{Path: plugin, StartTimeout: testwait.Limit})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := c.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: "hostdeath"}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("plugin %d\n", c.Pid())
	p, err := c.Exec(ctx, "hostdeath", backend.ExecRequest{
		Argv:   []string{"sh", "-c", "echo sleep $$; exec sleep 300"},
		Stdout: os.Stdout,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, _ = p.Wait()
	return 0
}

// launch starts the test plugin for one test with a log buffer, creates the
// sandbox "sb", and kills the plugin at the end, checking it is gone.
func launch(t *testing.T, env ...string) (*Client, *testwait.Buffer) {
	t.Helper()
	logs := &testwait.Buffer{}
	logger := hclog.New(&hclog.LoggerOptions{Name: "host", Output: logs, Level: hclog.Debug})
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	c, err := Launch(ctx, LaunchOptions{Path: pluginBin, Env: env, Logger: logger, StartTimeout: testwait.Limit})
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	pid := c.Pid()
	t.Cleanup(func() {
		c.Kill()
		if !c.Exited() {
			t.Errorf("plugin pid %d: Exited() false after Kill", pid)
		}
		waitGone(t, pid)
		if t.Failed() {
			t.Logf("host log:\n%s", logs.String())
		}
	})
	if _, err := c.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: "sb"}}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return c, logs
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}

// waitGone waits until every pid is gone (testwait.Limit is the safety net).
func waitGone(t *testing.T, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		testwait.Until(t, fmt.Sprintf("process %d to be gone", pid), func() bool { return !alive(pid) })
	}
}

// lineWriter collects output and sends each complete line on a channel.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	part  []byte
	lines chan string
}

func newLineWriter() *lineWriter { return &lineWriter{lines: make(chan string, 100)} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		select {
		case w.lines <- string(w.part[:i]):
		default:
		}
		w.part = w.part[i+1:]
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func nextLine(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(testwait.Limit):
		t.Fatalf("no line within %v", testwait.Limit)
		return ""
	}
}

// readPidLines reads "word pid" lines from r until it has n of them.
func readPidLines(t *testing.T, sc *bufio.Scanner, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for len(out) < n && sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			if pid, err := strconv.Atoi(f[1]); err == nil {
				out[f[0]] = pid
			}
		}
	}
	if len(out) < n {
		t.Fatalf("helper host printed %v, want %d pids (%v)", out, n, sc.Err())
	}
	return out
}
