package backends

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testproc"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// ctxT is a test's context; its deadline is only a safety net.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	t.Cleanup(cancel)
	return ctx
}

func TestInfoThroughPlugin(t *testing.T) {
	c, logs := launch(t)
	info, err := c.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "test" || info.Version != "0.0.1" {
		t.Errorf("Info = %+v", info)
	}
	if info.Protocol != 2 {
		t.Errorf("negotiated protocol %d, want 2", info.Protocol)
	}
	if len(info.ProtocolVersions) != 1 || info.ProtocolVersions[0] != 2 {
		t.Errorf("ProtocolVersions = %v, want [2] (filled in by Serve)", info.ProtocolVersions)
	}
	want := backend.Capabilities{FSIsolation: backend.FSIsolationNone, NetworkModes: []string{"none"}, StopStart: true, Config: true}
	if fmt.Sprint(info.Capabilities) != fmt.Sprint(want) {
		t.Errorf("Capabilities = %+v, want %+v", info.Capabilities, want)
	}
	// The plugin's hclog line reaches the host logger, with its level, and so
	// does a line it printed to stdout after the handshake.
	if !testwait.For(t.Context(), 0, func() bool {
		return strings.Contains(logs.String(), "test-driver-info") && strings.Contains(logs.String(), "stray stdout line")
	}) {
		t.Fatalf("plugin log line not in host log:\n%s", logs.String())
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "test-driver-info") && !strings.Contains(line, "[INFO]") {
			t.Errorf("plugin log line lost its level: %q", line)
		}
	}
}

func TestPluginProcessSetup(t *testing.T) {
	c, _ := launch(t)
	pid := c.Pid()
	fd0, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", pid))
	if err != nil {
		t.Fatal(err)
	}
	if fd0 != os.DevNull {
		t.Errorf("plugin stdin is %s, want /dev/null", fd0)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	if pgrp, _ := strconv.Atoi(f[2]); pgrp != pid {
		t.Errorf("plugin process group %d, want its own (%d)", pgrp, pid)
	}
	if pgrp := syscall.Getpgrp(); pgrp == pid {
		t.Errorf("test shares the plugin's process group")
	}
	// The handshake variables do not reach the processes the driver starts.
	out := &bytes.Buffer{}
	res := run(t, c, backend.ExecRequest{Argv: []string{"env"}, Stdout: out})
	if res.ExitCode != 0 {
		t.Fatalf("env: %+v", res)
	}
	for _, k := range []string{Handshake.MagicCookieKey, envHostPID, "PLUGIN_PROTOCOL_VERSIONS"} {
		if strings.Contains(out.String(), k+"=") {
			t.Errorf("exec environment contains %s", k)
		}
	}
}

func run(t *testing.T, c *Client, req backend.ExecRequest) backend.ExecResult {
	t.Helper()
	p, err := c.Exec(ctxT(t), "sb", req)
	if err != nil {
		t.Fatalf("Exec %v: %v", req.Argv, err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatalf("Wait %v: %v", req.Argv, err)
	}
	return res
}

func TestExecExitCodesAndStreams(t *testing.T) {
	c, _ := launch(t)
	for _, code := range []int{0, 1, 43} {
		res := run(t, c, backend.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("exit %d", code)}})
		if res.ExitCode != code || res.Signal != 0 {
			t.Errorf("exit %d: got %+v", code, res)
		}
		if res.Duration <= 0 {
			t.Errorf("exit %d: duration %v", code, res.Duration)
		}
	}
	var stdout, stderr bytes.Buffer
	res := run(t, c, backend.ExecRequest{
		Argv:   []string{"sh", "-c", "echo out; echo err >&2; printf '\\377\\000x'; echo more-err >&2"},
		Stdout: &stdout, Stderr: &stderr,
	})
	if res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
	if got := stdout.String(); got != "out\n\xff\x00x" {
		t.Errorf("stdout %q", got)
	}
	if got := stderr.String(); got != "err\nmore-err\n" {
		t.Errorf("stderr %q", got)
	}
	var nf bytes.Buffer
	res = run(t, c, backend.ExecRequest{Argv: []string{"no-such-command-xyz"}, Stderr: &nf})
	if res.ExitCode != 127 || !strings.Contains(nf.String(), "no-such-command-xyz") {
		t.Errorf("missing command: %+v, stderr %q", res, nf.String())
	}
	res = run(t, c, backend.ExecRequest{Argv: []string{"sh", "-c", "kill -9 $$"}})
	if res.ExitCode != 137 || res.Signal != 9 {
		t.Errorf("SIGKILL: %+v", res)
	}
	res = run(t, c, backend.ExecRequest{Argv: []string{"sh", "-c", "echo $FOO"}, Env: []string{"FOO=bar"}, Stdout: &stdout})
	if !strings.HasSuffix(stdout.String(), "bar\n") {
		t.Errorf("env: stdout %q", stdout.String())
	}
}

func TestExecStdinStreaming(t *testing.T) {
	c, _ := launch(t)
	out := newLineWriter()
	p, err := c.Exec(ctxT(t), "sb", backend.ExecRequest{Argv: []string{"cat"}, Stdin: true, Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	// Streaming: the first line comes back before stdin is closed.
	if _, err := p.Write([]byte("first line\n")); err != nil {
		t.Fatal(err)
	}
	if l := nextLine(t, out.lines); l != "first line" {
		t.Errorf("echoed %q", l)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB, many chunks
	if n, err := p.Write(big); err != nil || n != len(big) {
		t.Fatalf("Write big: %d, %v", n, err)
	}
	if err := p.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Write([]byte("late")); err == nil {
		t.Error("Write after CloseStdin succeeded")
	}
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Wait: %+v, %v", res, err)
	}
	if got := out.String(); got != "first line\n"+string(big) {
		t.Errorf("cat returned %d bytes, want %d", len(got), len("first line\n")+len(big))
	}

	// Without Stdin, the process reads EOF at once and Write is refused.
	var empty bytes.Buffer
	p, err = c.Exec(ctxT(t), "sb", backend.ExecRequest{Argv: []string{"cat"}, Stdout: &empty})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Write([]byte("x")); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Write without Stdin: %v, want ErrInvalid", err)
	}
	if res, err := p.Wait(); err != nil || res.ExitCode != 0 || empty.Len() != 0 {
		t.Errorf("cat without stdin: %+v %v %q", res, err, empty.String())
	}
	if err := p.Resize(backend.WindowSize{Rows: 1, Cols: 1}); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Resize without TTY: %v, want ErrInvalid", err)
	}
}

func TestExecSignal(t *testing.T) {
	c, _ := launch(t)
	out := newLineWriter()
	p, err := c.Exec(ctxT(t), "sb", backend.ExecRequest{Argv: []string{"sh", "-c", "echo ready; exec sleep 30"}, Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	nextLine(t, out.lines)
	if err := p.Signal(int(syscall.SIGTERM)); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	// Exit 143 and signal 15 say that the signal ended it (the sleep's own end
	// would be exit 0): no clock needed.
	if res.ExitCode != 143 || res.Signal != 15 {
		t.Errorf("after SIGTERM: %+v", res)
	}
	// A Signal after the end fails with io.ErrClosedPipe: locally, without waiting
	// for the plugin (blocking would hang here until the safety net).
	if err := p.Signal(int(syscall.SIGTERM)); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("Signal after the end: %v, want io.ErrClosedPipe", err)
	}
}

func TestExecContextCancel(t *testing.T) {
	c, _ := launch(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	out := newLineWriter()
	p, err := c.Exec(ctx, "sb", backend.ExecRequest{Argv: []string{"sh", "-c", "echo pid $$; exec sleep 300"}, Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(nextLine(t, out.lines), "pid "))
	if err != nil || !alive(pid) {
		t.Fatalf("sleep pid %d: %v", pid, err)
	}
	cancel()
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	// Canceled and SIGKILL: the cancel ended it, not the sleep's 300 s.
	if !res.Canceled || res.Signal != 9 {
		t.Errorf("result %+v, want Canceled and killed", res)
	}
	// The result comes after the tree is gone.
	if alive(pid) {
		t.Errorf("sleep %d alive after Wait returned", pid)
	}

	// A context that is already done fails Exec.
	if _, err := c.Exec(ctx, "sb", backend.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, context.Canceled) {
		t.Errorf("Exec with done ctx: %v", err)
	}
	// ExecRequest.Timeout crosses the wire.
	res = run(t, c, backend.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: 200 * time.Millisecond})
	if !res.TimedOut || res.Canceled {
		t.Errorf("timeout result %+v", res)
	}
}

func TestErrorKindsSurvive(t *testing.T) {
	c, _ := launch(t)
	ctx := ctxT(t)
	for _, kind := range backend.Kinds {
		name := "err-" + strings.ReplaceAll(kind.Error(), " ", "-")
		_, err := c.Inspect(ctx, name)
		if !errors.Is(err, kind) {
			t.Errorf("Inspect %s: %v, want errors.Is %v", name, err, kind)
			continue
		}
		if want := fmt.Sprintf("inspect %s: the test driver says %s", name, kind); err.Error() != want {
			t.Errorf("message %q, want %q", err.Error(), want)
		}
		for _, other := range backend.Kinds {
			if other != kind && errors.Is(err, other) {
				t.Errorf("%v also is %v", err, other)
			}
		}
	}
	_, err := c.Inspect(ctx, "err-other")
	if err == nil || backend.KindOf(err) != nil || err.Error() != "inspect err-other: an error without a kind" {
		t.Errorf("kindless error: %v", err)
	}
	if _, err := c.Inspect(ctx, "missing"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Inspect missing: %v", err)
	}
	if _, err := c.Exec(ctx, "missing", backend.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Exec in missing sandbox: %v", err)
	}
	if _, err := c.Exec(ctx, "sb", backend.ExecRequest{}); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Exec with empty argv: %v", err)
	}
	if _, err := c.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: "taken1"}}); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("Create taken: %v", err)
	}
	// Optional interfaces the driver lacks: ErrUnsupported.
	if err := c.CopyIn(ctx, "sb", "/", strings.NewReader("x")); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("CopyIn: %v", err)
	}
	if err := c.CopyOut(ctx, "sb", "/", io.Discard); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("CopyOut: %v", err)
	}
	if err := c.PullImage(ctx, "busybox", backend.PullMissing, nil); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("PullImage: %v", err)
	}
	if _, err := c.ImportImage(ctx, strings.NewReader("x")); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("ImportImage: %v", err)
	}
	// Configurer is forwarded.
	fields, err := c.ConfigSchema(ctx)
	if err != nil || len(fields) != 1 || fields[0] != (backend.ConfigField{Name: "root", Type: "string", Required: true, Description: "where sandboxes live"}) {
		t.Errorf("ConfigSchema: %+v, %v", fields, err)
	}
	if err := c.Configure(ctx, backend.DriverSetup{StateDir: "/tmp/x", Owner: "o", Config: []byte(`{"bad":true}`)}); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "attribute bad") {
		t.Errorf("Configure bad: %v", err)
	}
	if err := c.Configure(ctx, backend.DriverSetup{StateDir: "/tmp/x", Owner: "o", Config: []byte(`{}`)}); err != nil {
		t.Errorf("Configure: %v", err)
	}
}

func TestLifecycleThroughPlugin(t *testing.T) {
	c, _ := launch(t)
	ctx := ctxT(t)
	labels := map[string]string{backend.LabelOwner: "me", "x": "y"}
	sb, err := c.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: "life", Labels: labels}})
	if err != nil || sb.Name != "life" || sb.State != backend.StateRunning || sb.Adopted || sb.CreatedAt.IsZero() {
		t.Fatalf("Create: %+v, %v", sb, err)
	}
	again, err := c.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: "life", Labels: labels}})
	if err != nil || !again.Adopted || !again.CreatedAt.Equal(sb.CreatedAt) {
		t.Errorf("second Create: %+v, %v", again, err)
	}
	list, err := c.List(ctx, map[string]string{"x": "y"})
	if err != nil || len(list) != 1 || list[0].Name != "life" || list[0].Labels["x"] != "y" {
		t.Errorf("List: %+v, %v", list, err)
	}
	if err := c.Stop(ctx, "life", time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Inspect(ctx, "life"); got.State != backend.StateStopped {
		t.Errorf("after Stop: %+v", got)
	}
	if _, err := c.Exec(ctx, "life", backend.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("Exec in stopped sandbox: %v", err)
	}
	if err := c.Remove(ctx, "life"); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, "life"); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if _, err := c.Inspect(ctx, "life"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Inspect removed: %v", err)
	}
}

func TestPluginCrashMidCall(t *testing.T) {
	c, _ := launch(t)
	_, err := c.Inspect(ctxT(t), "crash") // the test driver exits 7
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "crashed") || !strings.Contains(err.Error(), pluginBin) {
		t.Errorf("Inspect that crashes the plugin: %v", err)
	}
	t.Log(err)
	if !strings.Contains(err.Error(), "exit status 7") {
		t.Errorf("crash error without exit status: %v", err)
	}
	if !c.Exited() {
		t.Error("Exited() false after the crash")
	}

	// Killed from outside during an exec.
	c2, _ := launch(t)
	out := newLineWriter()
	p, err := c2.Exec(ctxT(t), "sb", backend.ExecRequest{Argv: []string{"sh", "-c", "echo pid $$; exec sleep 300"}, Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimPrefix(nextLine(t, out.lines), "pid "))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // the driver did not get to kill it
	if err := syscall.Kill(c2.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, err = p.Wait()
	t.Log(err)
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "crashed") || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Wait after the plugin was killed: %v", err)
	}
	if _, err := c2.Info(ctxT(t)); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("Info after the crash: %v", err)
	}
}

func readPids(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("pid file: %v", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

func TestLaunchGarbageOnStdout(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	_, err := Launch(ctxT(t), LaunchOptions{Path: pluginBin, StartTimeout: testwait.Limit, Env: []string{"BERTH_TESTPLUGIN_MODE=garbage", "BERTH_TESTPLUGIN_PIDFILE=" + pidfile}})
	if err == nil {
		t.Fatal("Launch succeeded")
	}
	t.Log(err)
	msg := err.Error()
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(msg, pluginBin) || !strings.Contains(msg, "hello, I am not a plugin") || !strings.Contains(msg, "never write to stdout") {
		t.Errorf("error: %v", err)
	}
	if strings.Count(msg, pluginBin) != 1 || strings.Contains(msg, "\n") {
		t.Errorf("want one clear line naming the file once: %q", msg)
	}
	pids := readPids(t, pidfile)
	if len(pids) != 1 {
		t.Errorf("plugin pids %v, want one", pids)
	}
	waitGone(t, pids...)
}

// TestLaunchExitsAtOnce: a plugin that exits before the handshake is reported as
// such (its exit status and stderr), not as a start timeout: the start timeout is
// an hour, so only noticing the exit makes Launch return.
func TestLaunchExitsAtOnce(t *testing.T) {
	_, err := Launch(ctxT(t), LaunchOptions{Path: pluginBin, StartTimeout: time.Hour, Env: []string{"BERTH_TESTPLUGIN_MODE=exit"}})
	if err == nil {
		t.Fatal("Launch succeeded")
	}
	t.Log(err)
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), pluginBin) ||
		!strings.Contains(err.Error(), "exited before the plugin handshake") || !strings.Contains(err.Error(), "exit status 3") ||
		!strings.Contains(err.Error(), "frobnicator missing") {
		t.Errorf("error: %v", err)
	}
}

// TestLaunchHangsPastStartTimeout: a plugin that never completes the handshake is
// killed with its process group when StartTimeout passes, and the error says so.
// The case needs the plugin to have started its child before the timeout: a
// timeout that a loaded machine's slow start beats is retried with twice the
// timeout, so no outcome depends on how fast the plugin starts.
func TestLaunchHangsPastStartTimeout(t *testing.T) {
	for timeout := 500 * time.Millisecond; ; timeout *= 2 {
		pidfile := filepath.Join(t.TempDir(), "pids")
		_, err := Launch(ctxT(t), LaunchOptions{
			Path: pluginBin, StartTimeout: timeout,
			Env: []string{"BERTH_TESTPLUGIN_MODE=hang", "BERTH_TESTPLUGIN_PIDFILE=" + pidfile},
		})
		if err == nil {
			t.Fatal("Launch succeeded")
		}
		t.Log(err)
		if want := fmt.Sprintf("within %s", timeout); !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), pluginBin) || !strings.Contains(err.Error(), want) {
			t.Errorf("error: %v, want ErrUnavailable naming the plugin and %q", err, want)
		}
		var pids []int
		if _, err := os.Stat(pidfile); err == nil {
			pids = readPids(t, pidfile)
		}
		waitGone(t, pids...)
		if len(pids) == 2 {
			return // both killed
		}
		if timeout >= testwait.Limit {
			t.Fatalf("pids %v after a start timeout of %v: the plugin never started its child in time", pids, timeout)
		}
		t.Logf("the plugin had started %d of its 2 processes when the %v timeout passed; again with %v", len(pids), timeout, 2*timeout)
	}
}

// TestLaunchBuiltinHangs: an executable named as the berth binary (a built-in
// driver's `BINARY driver serve NAME`) that never completes the handshake is, most
// likely, a Go program holding a registry that started itself: the error says how
// to register the driver in the program or name a berth-cli instead.
func TestLaunchBuiltinHangs(t *testing.T) {
	_, err := Launch(ctxT(t), LaunchOptions{
		Path: pluginBin, Args: []string{"driver", "serve", "local"}, StartTimeout: 200 * time.Millisecond,
		Env: []string{"BERTH_TESTPLUGIN_MODE=hang", "BERTH_TESTPLUGIN_PIDFILE=" + filepath.Join(t.TempDir(), "pids")},
	})
	if err == nil || !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "is not a berth binary") ||
		!strings.Contains(err.Error(), "registry.WithDriver") || !strings.Contains(err.Error(), "registry.WithBerthBinary") {
		t.Errorf("Launch: %v, want ErrUnavailable saying to register the driver with registry.WithDriver or name a berth-cli", err)
	}
}

func TestLaunchContextCancel(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	ctx, cancel := context.WithCancel(ctxT(t))
	errCh := make(chan error, 1)
	go func() {
		_, err := Launch(ctx, LaunchOptions{Path: pluginBin, StartTimeout: testwait.Limit, Env: []string{"BERTH_TESTPLUGIN_MODE=hang", "BERTH_TESTPLUGIN_PIDFILE=" + pidfile}})
		errCh <- err
	}()
	testwait.Until(t, "the hanging plugin to start its child", func() bool {
		b, _ := os.ReadFile(pidfile)
		return len(strings.Fields(string(b))) == 2
	})
	cancel()
	err := <-errCh
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Launch: %v, want context.Canceled", err)
	}
	waitGone(t, readPids(t, pidfile)...)
}

// TestLaunchKilledBeforeHandshake: a plugin that something else kills (SIGKILL)
// before the handshake is reported as killed, naming the signal, and a built-in
// driver's plugin by its driver name: not as a plugin that does not call
// backends.Serve.
func TestLaunchKilledBeforeHandshake(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	errCh := make(chan error, 1)
	go func() {
		_, err := Launch(ctxT(t), LaunchOptions{Path: pluginBin, Args: []string{"driver", "serve", "local"},
			Env: []string{"BERTH_TESTPLUGIN_MODE=hang", "BERTH_TESTPLUGIN_PIDFILE=" + pidfile}})
		errCh <- err
	}()
	var pids []string
	testwait.Until(t, "the hanging plugin and its child to write their pids", func() bool {
		b, _ := os.ReadFile(pidfile)
		pids = strings.Fields(string(b))
		return len(pids) == 2 // the plugin runs (its child too): it is waiting before the handshake
	})
	pid, _ := strconv.Atoi(pids[0])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-errCh
	if err == nil {
		t.Fatal("Launch succeeded")
	}
	msg := err.Error()
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(msg, "was killed by signal 9 (SIGKILL) before the plugin handshake") ||
		!strings.Contains(msg, `"local"`) || strings.Contains(msg, "backends.Serve") {
		t.Errorf("error %q, want ErrUnavailable saying the plugin of driver \"local\" was killed by SIGKILL, without the backends.Serve hint", msg)
	}
}

func TestLaunchBadPath(t *testing.T) {
	ctx := ctxT(t)
	missing := filepath.Join(t.TempDir(), "berth-driver-nope")
	if _, err := Launch(ctx, LaunchOptions{Path: missing}); !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing: %v", err)
	}
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Launch(ctx, LaunchOptions{Path: plain}); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "chmod +x") {
		t.Errorf("not executable: %v", err)
	}
	if _, err := Launch(ctx, LaunchOptions{Path: t.TempDir()}); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("directory: %v", err)
	}
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, []byte("\x00\x01not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Launch(ctx, LaunchOptions{Path: junk})
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), junk) {
		t.Errorf("not a program: %v", err)
	}
	t.Log(err)
}

// startTestHost starts this test binary as a host process (envTestHost) that
// launches the test plugin and runs `sleep 300` through it, and returns it with the
// plugin's and the sleep's pids, read from its stdout.
func startTestHost(t *testing.T) (host *exec.Cmd, plugin, sleep int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host = exec.Command(self, "-test.run=^$")
	host.Env = append(os.Environ(), envTestHost+"="+pluginBin)
	host.Stderr = os.Stderr
	stdout, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Process.Kill(); _ = host.Wait() })
	pids := readPidLines(t, bufio.NewScanner(stdout), 2)
	plugin, sleep = pids["plugin"], pids["sleep"]
	return host, plugin, sleep
}

// TestHostDeath kills -9 a host process that launched the plugin and runs
// `sleep 300` through it: the plugin must notice, have the exec's tree killed,
// and exit.
func TestHostDeath(t *testing.T) {
	host, plugin, sleep := startTestHost(t)
	if !alive(plugin) || !alive(sleep) {
		t.Fatalf("plugin %d or sleep %d not running", plugin, sleep)
	}
	t.Cleanup(func() { _ = syscall.Kill(sleep, syscall.SIGKILL); _ = syscall.Kill(plugin, syscall.SIGKILL) })

	killed := time.Now()
	if err := host.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = host.Wait()
	waitGone(t, sleep, plugin)
	t.Logf("plugin and sleep gone %v after the host was killed", time.Since(killed))
}

// When the host and its plugin are both killed (neither can remove the plugin's
// socket dir), PruneSocketDirs removes the dir once it is past the grace period:
// nothing holds it any more.
func TestSocketDirOfKilledHost(t *testing.T) {
	host, plugin, sleep := startTestHost(t)
	t.Cleanup(func() { _ = syscall.Kill(sleep, syscall.SIGKILL); _ = syscall.Kill(plugin, syscall.SIGKILL) })
	socketDir := pluginSocketDir(t, plugin)
	// Stopped first, the plugin cannot see its host go and clean up after itself.
	if err := syscall.Kill(plugin, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := host.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = host.Wait()
	if err := syscall.Kill(plugin, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, plugin)
	_ = syscall.Kill(sleep, syscall.SIGKILL)
	if _, err := os.Stat(socketDir); err != nil {
		t.Fatalf("the killed pair's socket dir: %v", err)
	}
	if stale, err := PruneSocketDirs(time.Hour, false); err != nil || slices.ContainsFunc(stale, func(s StaleSocketDir) bool { return s.Path == socketDir }) {
		t.Errorf("PruneSocketDirs took a dir younger than its grace: %+v, %v", stale, err)
	}
	past := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(socketDir, past, past); err != nil {
		t.Fatal(err)
	}
	stale, err := PruneSocketDirs(time.Hour, false)
	if err != nil || !slices.ContainsFunc(stale, func(s StaleSocketDir) bool { return s.Path == socketDir && s.Removed }) {
		t.Errorf("PruneSocketDirs did not remove the killed host's %s: %+v, %v", socketDir, stale, err)
	}
	if _, err := os.Stat(socketDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there: %v", socketDir, err)
	}
}

// pluginSocketDir returns the socket dir go-plugin gave the running plugin pid, and
// checks it lies in PluginSocketBase.
func pluginSocketDir(t *testing.T, pid int) string {
	t.Helper()
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Split(string(env), "\x00") {
		if dir, ok := strings.CutPrefix(kv, "PLUGIN_UNIX_SOCKET_DIR="); ok {
			base, err := PluginSocketBase()
			if err != nil || filepath.Dir(dir) != base {
				t.Errorf("plugin socket dir %s is not in %s (%v)", dir, base, err)
			}
			return dir
		}
	}
	t.Fatalf("plugin %d has no PLUGIN_UNIX_SOCKET_DIR", pid)
	return ""
}

// A running plugin's socket dir is in the short per-user base, no prune takes it
// however old it is, and Kill removes it.
func TestPluginSocketDirHeld(t *testing.T) {
	t.Parallel()
	c, _ := launch(t)
	dir := pluginSocketDir(t, c.Pid())
	if fi, err := os.Stat(filepath.Dir(dir)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket base: %v, %v; want a 0700 dir", fi, err)
	}
	past := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(dir, past, past); err != nil {
		t.Fatal(err)
	}
	stale, err := PruneSocketDirs(0, false)
	if err != nil || slices.ContainsFunc(stale, func(s StaleSocketDir) bool { return s.Path == dir }) {
		t.Errorf("PruneSocketDirs took a running plugin's dir: %+v, %v", stale, err)
	}
	if _, err := c.Info(ctxT(t)); err != nil {
		t.Errorf("plugin after prune: %v", err)
	}
	c.Kill()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Kill left %s: %v", dir, err)
	}
}

// A socket base that someone else made (here: a symlink) is refused, naming it.
func TestPluginSocketBaseRefused(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	base := filepath.Join(tmp, fmt.Sprintf("berth-%d", os.Getuid()))
	if err := os.Symlink(t.TempDir(), base); err != nil {
		t.Fatal(err)
	}
	_, err := Launch(ctxT(t), LaunchOptions{Path: pluginBin})
	if err == nil || !strings.Contains(err.Error(), base+" is a symlink, not a directory") || !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("Launch with a symlinked socket base: %v", err)
	}
	if err := os.Remove(base); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := PluginSocketBase(); err != nil || got != base {
		t.Fatalf("PluginSocketBase = %s, %v", got, err)
	}
	if fi, err := os.Stat(base); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("a base of ours with mode 0755 is not made 0700: %v, %v", fi, err)
	}
}

// gateWriter takes the first free bytes at full speed (so gRPC would have
// grown a dynamic window by then), then blocks every Write until open is
// closed; it hashes and counts everything.
type gateWriter struct {
	free    int64
	open    chan struct{}
	blocked chan int64 // receives total once, when the first Write blocks
	hash    func([]byte)
	total   int64
}

func (w *gateWriter) Write(p []byte) (int, error) {
	if w.total >= w.free && w.blocked != nil {
		w.blocked <- w.total
		w.blocked = nil
		<-w.open
	}
	w.hash(p)
	w.total += int64(len(p))
	return len(p), nil
}

func TestFlowControl(t *testing.T) {
	const size = 20 << 20
	c, _ := launch(t)
	progress := filepath.Join(t.TempDir(), "progress")
	h := sha256.New()
	blocked := make(chan int64, 1)
	w := &gateWriter{free: 8 << 20, open: make(chan struct{}), blocked: blocked, hash: func(b []byte) { h.Write(b) }}
	p, err := c.Exec(ctxT(t), "sb", backend.ExecRequest{
		Argv:   []string{pluginBin, "write", strconv.Itoa(size), progress},
		Stdout: w,
	})
	if err != nil {
		t.Fatal(err)
	}
	var consumed int64
	select {
	case consumed = <-blocked:
	case <-time.After(testwait.Limit):
		t.Fatal("the reader never got 8 MiB")
	}
	// Wait until the writer is stuck: blocked in write(2) on its stdout, with the
	// same count at three checks in a row (not "quiet for a while", which a
	// loaded machine fakes).
	argv := []string{pluginBin, "write", strconv.Itoa(size), progress}
	var last int64 = -1
	same := 0
	testwait.Until(t, "the writer to block in write(2) with its progress settled", func() bool {
		b, _ := os.ReadFile(progress)
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		pids := testproc.WithArgs(argv...)
		if len(pids) == 1 && blockedInWrite(pids[0], 1) && n == last {
			same++
		} else {
			same = 0
		}
		last = n
		return same >= 3
	})
	// What the test driver holds itself: the 64 KiB pipe, os/exec's 32 KiB copy
	// buffer, and the writer's 4 KiB write in progress.
	const driverBuffers = 64<<10 + 32<<10 + 4<<10
	ahead := last - consumed
	t.Logf("reader blocked after %d bytes; writer stalled %d bytes (%.0f KiB) ahead; bridge bound %d KiB + test driver %d KiB",
		consumed, ahead, float64(ahead)/1024, MaxBufferedBytes>>10, driverBuffers>>10)
	if ahead > MaxBufferedBytes+driverBuffers {
		t.Errorf("writer got %d bytes ahead of a blocked reader, bound is %d", ahead, MaxBufferedBytes+driverBuffers)
	}
	if last >= size {
		t.Fatal("writer finished while the reader was blocked")
	}

	close(w.open)
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Wait: %+v, %v", res, err)
	}
	if w.total != size {
		t.Fatalf("got %d bytes, want %d", w.total, size)
	}
	want := sha256.New()
	buf := make([]byte, 0, size)
	for i := int64(0); i < size; i++ {
		buf = append(buf, byte(i%251))
	}
	want.Write(buf)
	if !bytes.Equal(h.Sum(nil), want.Sum(nil)) {
		t.Error("output differs from the pattern written")
	}
}

func TestOptionalCallsForwarded(t *testing.T) {
	c, _ := launch(t, "BERTH_TESTPLUGIN_MODE=full")
	ctx := ctxT(t)
	data := bytes.Repeat([]byte("tar-ish bytes "), 100_000) // ~1.4 MiB, many chunks
	if err := c.CopyIn(ctx, "sb", "/dst", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if err := c.CopyOut(ctx, "sb", "/dst", &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Bytes(), data) {
		t.Errorf("CopyOut returned %d bytes, want %d", back.Len(), len(data))
	}
	// The driver wraps a *fs.PathError (%w) into ErrNotFound: across the plugin the
	// kind survives and the text names the cause.
	if err := c.CopyOut(ctx, "sb", "/nope", io.Discard); !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), "copy out of sandbox sb: open /nope: no such file or directory") {
		t.Errorf("CopyOut missing: %v, want ErrNotFound naming the cause", err)
	}
	readErr := errors.New("tape jammed")
	if err := c.CopyIn(ctx, "sb", "/x", io.MultiReader(strings.NewReader("abc"), &failReader{readErr})); !errors.Is(err, readErr) {
		t.Errorf("CopyIn with failing reader: %v", err)
	}
	var events []backend.PullProgress
	if err := c.PullImage(ctx, "busybox", backend.PullMissing, func(p backend.PullProgress) { events = append(events, p) }); err != nil {
		t.Fatal(err)
	}
	if len(events) != 3 || events[2] != (backend.PullProgress{Layer: "l1", Status: "Downloading", Current: 30, Total: 30}) {
		t.Errorf("progress events %+v", events)
	}
	if err := c.PullImage(ctx, "busybox", backend.PullNever, nil); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("PullImage never: %v", err)
	}
	refs, err := c.ImportImage(ctx, bytes.NewReader(data))
	if err != nil || len(refs) != 1 || refs[0] != fmt.Sprintf("imported:%d", len(data)) {
		t.Errorf("ImportImage: %v, %v", refs, err)
	}
}

// DialAgent through the plugin carries bytes both ways (more than the stream's
// windows, so flow control is exercised), ends the host's half on CloseWrite, and
// passes the driver's error kinds on.
func TestDialAgentThroughPlugin(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "echo.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }() // echo until EOF, then close
		}
	}()
	c, _ := launch(t, "BERTH_TESTPLUGIN_MODE=full", "BERTH_TESTPLUGIN_DIAL="+sock)
	ctx := ctxT(t)
	conn, err := c.DialAgent(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("agent bytes "), 300_000) // 3.6 MB
	werr := make(chan error, 1)
	go func() {
		_, err := conn.Write(data)
		if err == nil {
			err = conn.(interface{ CloseWrite() error }).CloseWrite()
		}
		werr <- err
	}()
	back, err := io.ReadAll(conn)
	if err != nil || !bytes.Equal(back, data) {
		t.Errorf("echo through DialAgent: %d bytes back (want %d), %v", len(back), len(data), err)
	}
	if err := <-werr; err != nil {
		t.Errorf("write: %v", err)
	}
	conn.Close()
	// Closing a connection whose Read waits ends that Read with net.ErrClosed: the
	// stream's cancellation is not mistaken for a crashed plugin (which a call waits
	// for, up to crashGrace, before it says so).
	conn, err = c.DialAgent(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	rerr := make(chan error, 1)
	go func() { _, err := conn.Read(make([]byte, 1)); rerr <- err }()
	conn.Close()
	if err := <-rerr; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read of a closed DialAgent connection: %v, want net.ErrClosed", err)
	}
	if _, err := conn.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write to a closed DialAgent connection: %v, want net.ErrClosed", err)
	}
	conn, err = c.DialAgent(ctx, "stopped")
	if err == nil {
		_, err = conn.Read(make([]byte, 1))
	}
	if !errors.Is(err, backend.ErrConflict) {
		t.Errorf("DialAgent of a stopped sandbox: %v, want ErrConflict", err)
	}
	// A caller that writes first (berth's handshake does) gets the kind too, from
	// the Write that finds the stream ended: a Send can succeed before the plugin
	// has ended it, never after.
	conn, err = c.DialAgent(ctx, "stopped")
	for err == nil {
		_, err = conn.Write([]byte("BERTH-AGENT 2 token 3\n"))
	}
	if !errors.Is(err, backend.ErrConflict) {
		t.Errorf("Write to a DialAgent connection of a stopped sandbox: %v, want ErrConflict", err)
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("Read after that Write: %v, want ErrConflict", err)
	}
	if err := c.Validate(ctx, backend.SandboxSpec{Name: "x"}); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Validate: %v, want ErrInvalid", err)
	}
}

type failReader struct{ err error }

func (r *failReader) Read([]byte) (int, error) { return 0, r.err }

// TestPluginStopsWithExecInFlight: SIGTERM to the plugin, and Kill from the
// host, both end an in-flight exec's tree before the plugin exits.
func TestPluginStopsWithExecInFlight(t *testing.T) {
	for _, how := range []string{"SIGTERM", "Kill"} {
		t.Run(how, func(t *testing.T) {
			c, _ := launch(t)
			out := newLineWriter()
			p, err := c.Exec(ctxT(t), "sb", backend.ExecRequest{Argv: []string{"sh", "-c", "echo pid $$; exec sleep 300"}, Stdout: out})
			if err != nil {
				t.Fatal(err)
			}
			pid, _ := strconv.Atoi(strings.TrimPrefix(nextLine(t, out.lines), "pid "))
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
			if how == "SIGTERM" {
				if err := syscall.Kill(c.Pid(), syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			} else {
				c.Kill()
			}
			res, err := p.Wait()
			t.Logf("Wait: %+v, %v", res, err)
			if err == nil && !res.Canceled {
				t.Errorf("Wait: %+v, want an error or Canceled", res)
			}
			if err != nil && !errors.Is(err, backend.ErrUnavailable) {
				t.Errorf("Wait error %v, want ErrUnavailable", err)
			}
			waitGone(t, pid, c.Pid())
		})
	}
}

// TestWrapperScript: a plugin started by a shell script that does not exec it
// has the script, not the host, as its parent; it must still serve.
func TestWrapperScript(t *testing.T) {
	wrapper := filepath.Join(t.TempDir(), "berth-driver-wrapped")
	script := "#!/bin/sh\n" + pluginBin + "\necho wrapper done >&2\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	logs := &testwait.Buffer{}
	logger := hclog.New(&hclog.LoggerOptions{Name: "host", Output: logs, Level: hclog.Trace})
	c, err := Launch(ctxT(t), LaunchOptions{Path: wrapper, Logger: logger, StartTimeout: testwait.Limit})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill()
	// Past three of the plugin's host checks (its trace lines: the first at start,
	// then one per poll interval) the plugin is still there.
	testwait.Until(t, "three host checks in the plugin's log", func() bool {
		return strings.Count(logs.String(), "host check: parent alive") >= 3
	})
	if _, err := c.Info(ctxT(t)); err != nil {
		t.Fatalf("Info: %v", err)
	}
	c.Kill()
	if !c.Exited() {
		t.Error("wrapper still running after Kill")
	}
}

// TestExecCancelWhileStdinBlocked: a Write that blocks because the process
// never reads stdin does not hold up a cancel.
func TestExecCancelWhileStdinBlocked(t *testing.T) {
	c, _ := launch(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	out := newLineWriter()
	p, err := c.Exec(ctx, "sb", backend.ExecRequest{Argv: []string{"sh", "-c", "echo pid $$; exec sleep 300"}, Stdin: true, Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimPrefix(nextLine(t, out.lines), "pid "))
	writeErr := make(chan error, 1)
	go func() {
		_, err := p.Write(make([]byte, 8<<20)) // far more than pipe and windows hold
		writeErr <- err
	}()
	// Wait until the write is stuck: the sleep's stdin pipe is full.
	testwait.Until(t, "the sleep's stdin pipe to fill", func() bool { return pipeBytes(pid) >= 64<<10 })
	cancel()
	// Held up by the stuck Write, Wait would not return at all.
	res, err := waitFor(t, p)
	if err != nil || !res.Canceled {
		t.Errorf("Wait: %+v, %v; want Canceled", res, err)
	}
	if err := <-writeErr; err == nil {
		t.Error("the stuck Write returned no error")
	}
	waitGone(t, pid)
}

// blockedInWrite reports whether a thread of pid sleeps in write(2) on fd.
func blockedInWrite(pid, fd int) bool {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, _ := os.ReadDir(dir)
	for _, task := range tasks {
		sc, err := os.ReadFile(filepath.Join(dir, task.Name(), "syscall"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(sc))
		if len(f) < 2 || f[0] != strconv.Itoa(unix.SYS_WRITE) || f[1] != fmt.Sprintf("0x%x", fd) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat")); err == nil {
			if i := bytes.LastIndexByte(st, ')'); i >= 0 && i+2 < len(st) && st[i+2] == 'S' {
				return true
			}
		}
	}
	return false
}

// waitFor returns p's Wait, failing the test when it does not return within
// testwait.Limit.
func waitFor(t *testing.T, p backend.Process) (backend.ExecResult, error) {
	t.Helper()
	type waited struct {
		res backend.ExecResult
		err error
	}
	ch := make(chan waited, 1)
	go func() {
		res, err := p.Wait()
		ch <- waited{res, err}
	}()
	select {
	case w := <-ch:
		return w.res, w.err
	case <-time.After(testwait.Limit):
		t.Fatalf("Wait did not return within %v", testwait.Limit)
		return backend.ExecResult{}, nil
	}
}

// pipeBytes returns how many bytes wait in pid's stdin pipe (FIONREAD, which
// is TIOCINQ on Linux).
func pipeBytes(pid int) int {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/0", pid), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ)
	if err != nil {
		return 0
	}
	return n
}

// A plugin whose host died just before it started, and is still a zombie (not yet
// reaped by its own parent, so kill(pid, 0) still succeeds), exits at once instead of
// taking its new parent for a wrapper script and living on.
func TestHostZombieBeforeStart(t *testing.T) {
	zombie := exec.Command("sleep", "1000")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	zpid := zombie.Process.Pid
	if err := zombie.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped until the test ends: a zombie, as the host is before its parent waits.
	t.Cleanup(func() { zombie.Wait() })
	for alive(zpid) {
		runtime.Gosched() // the kernel makes it a zombie promptly; alive says Z is not alive
	}
	if err := syscall.Kill(zpid, 0); err != nil {
		t.Fatalf("kill(%d, 0) on the zombie: %v; the case needs a zombie", zpid, err)
	}
	plug := exec.Command(pluginBin)
	plug.Env = append(os.Environ(), Handshake.MagicCookieKey+"="+Handshake.MagicCookieValue, envHostPID+"="+strconv.Itoa(zpid))
	if err := plug.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { plug.Wait(); close(done) }()
	t.Cleanup(func() { plug.Process.Kill(); <-done })
	select {
	case <-done:
	case <-time.After(testwait.Limit):
		t.Fatalf("the plugin of a dead (zombie) host still runs after %v", testwait.Limit)
	}
}
