package conformance

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/registry"
)

func recoveryCases() []Case {
	g := "recovery"
	return []Case{
		{Group: g, Name: "host-sigkill", Requires: "a registry (Options.OpenRegistry) and the berth binary (Options.AgentBinary)", Run: caseHostSIGKILL},
		{Group: g, Name: "plugin-sigkill", Requires: "a registry whose driver runs as a plugin", Run: casePluginSIGKILL},
		{Group: g, Name: "runtime-restart", Requires: "a registry, and a way to restart the runtime (Options.RestartRuntime, berth conformance --restart-hook)", Serial: true, Run: caseRuntimeRestart},
	}
}

// alive reports whether the process whose pid the sandbox file pidFile holds is
// still running, asked in the sandbox through the registry.
func alive(t T, r *registry.Registry, session, pidFile string) bool {
	t.Helper()
	out, _ := regExec(t, r, session, `if kill -0 "$(cat "$1")" 2>/dev/null; then echo alive; else echo gone; fi`, pidFile)
	return strings.TrimSpace(out) == "alive"
}

// hostAlive reports whether pid runs on this host (a zombie counts as gone).
func hostAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	ps := parseStat(string(b))
	return len(ps) == 1 && ps[0].live()
}

// children returns the pids of this host's processes whose parent is pid.
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		for _, p := range parseStat(string(b)) {
			if p.PPID == pid && p.live() {
				out = append(out, p.PID)
			}
		}
	}
	return out
}

// berthEnv is the environment of a berth process that shares r's state and config.
func (h *Harness) berthEnv(r *registry.Registry) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BERTH_") {
			env = append(env, kv)
		}
	}
	env = append(env, config.EnvStateDir+"="+r.StateDir(), config.EnvConfig+"="+r.Config().Path)
	return append(env, h.Options.BerthEnv...)
}

// kill -9 of a berth process during an exec: no plugin process of it survives, the
// exec's foreground tree ends (how soon is logged: it depends on the machine's load),
// a background process that the session
// started earlier lives on, and the next call finds the session in the same sandbox.
func caseHostSIGKILL(t T, h *Harness) {
	if h.Options.AgentBinary == "" {
		t.Skip("needs the berth binary (Options.AgentBinary) to run a berth process to kill")
	}
	id := randHex(4)
	r, _ := h.retentionRegistry(t, id)
	s := "conf-keep-" + id + ":host"
	lease := startSession(t, r, s)
	// A background process that an earlier exec of the session left running.
	regExec(t, r, s, `sleep 600 > /dev/null 2>&1 & echo $! > bg.pid`)
	cmd := exec.Command(h.Options.AgentBinary, "exec", "-s", s, "--", "sh", "-c",
		`echo $$ > fg.pid; echo started; exec sleep 600`)
	cmd.Env = h.berthEnv(r)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testwait.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s exec: %v", h.Options.AgentBinary, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	started := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ok := sc.Scan() && sc.Text() == "started"
		started <- ok
		for sc.Scan() {
		}
	}()
	select {
	case ok := <-started:
		if !ok {
			cmd.Wait()
			t.Fatalf("berth exec did not start the command; stderr %q", stderr.String())
		}
	case <-time.After(testwait.Limit):
		t.Fatalf("berth exec did not start the command within %v; stderr %q", testwait.Limit, stderr.String())
	}
	plugins := children(cmd.Process.Pid)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed := time.Now()
	if !testwait.For(t.Context(), 0, func() bool { return !alive(t, r, s, "fg.pid") }) {
		t.Errorf("the foreground exec of a berth killed with SIGKILL still runs %s later", time.Since(killed).Round(time.Millisecond))
	} else {
		t.Logf("the foreground exec ended %s after berth was killed", time.Since(killed).Round(time.Millisecond))
	}
	if !testwait.For(t.Context(), 0, func() bool {
		for _, p := range plugins {
			if hostAlive(p) {
				return false
			}
		}
		return true
	}) {
		var left []int
		for _, p := range plugins {
			if hostAlive(p) {
				left = append(left, p)
			}
		}
		t.Errorf("child processes (driver plugins) of the killed berth still run %v later: %v", testwait.Limit, left)
	}
	if !alive(t, r, s, "bg.pid") {
		t.Error("the background process that the killed berth's exec started is gone")
	}
	readBack(t, r, s, lease)
}

// pider is the part of a plugin client that says which process serves it.
type pider interface{ Pid() int }

// kill -9 of the driver's plugin during an exec in a long-lived registry. An exec
// that went to the sandbox's agent directly does not notice: it goes on and ends
// as it would have. An exec through the driver (drivers without agent) returns
// (how soon is logged) with an error saying the driver crashed, and its tree is
// gone. Either way the registry starts the plugin again, and the next exec of the
// session works in the same sandbox.
func casePluginSIGKILL(t T, h *Harness) {
	id := randHex(4)
	r, _ := h.retentionRegistry(t, id)
	s := "conf-keep-" + id + ":plugin"
	lease := startSession(t, r, s)
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	b, err := r.Backend(ctx, h.Info.Name)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := b.(pider)
	if !ok {
		t.Skipf("the registry runs driver %s in process: there is no plugin to kill (run the suite with a plugin registry)", h.Info.Name)
	}
	pid := p.Pid()
	proc, _, err := r.Exec(t.Context(), s, backend.ExecRequest{Argv: []string{"sh", "-c", `echo $$ > fg.pid; exec sleep 600`}})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		res backend.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := proc.Wait()
		done <- result{res, err}
	}()
	// The exec has started once its pid file is there.
	if !testwait.For(t.Context(), 0, func() bool {
		out, _ := regExec(t, r, s, `test -s fg.pid && echo yes || true`)
		return out == "yes\n"
	}) {
		t.Fatalf("the exec did not start within %v", testwait.Limit)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the plugin (pid %d): %v", pid, err)
	}
	killed := time.Now()
	// The registry starts the plugin again once it has seen it exit: wait for the
	// client to see that (its process reaped), or an exec that never needs the
	// plugin can get to the checks below before it has.
	if x, ok := b.(interface{ Exited() bool }); ok && !testwait.For(t.Context(), 0, x.Exited) {
		t.Fatalf("the plugin (pid %d) was killed but its client did not see it exit within %v", pid, testwait.Limit)
	}
	if h.Info.Capabilities.Agent == backend.AgentSocket {
		// The exec never went through the plugin: it still runs, and ends when
		// asked, with its own result.
		if !alive(t, r, s, "fg.pid") {
			t.Fatal("the exec, which went to the agent directly, died with the driver's plugin")
		}
		if err := proc.Signal(int(syscall.SIGKILL)); err != nil {
			t.Fatalf("signalling the exec after the plugin died: %v", err)
		}
		got := <-done
		if got.err != nil || got.res.ExitCode != 137 {
			t.Errorf("Wait after the plugin was killed and the exec then got SIGKILL: %+v, %v; want exit 137 and no error", got.res, got.err)
		}
	} else {
		select {
		case got := <-done:
			if got.err == nil || !errors.Is(got.err, backend.ErrUnavailable) || !strings.Contains(got.err.Error(), "crashed") {
				t.Errorf("Wait after the plugin was killed: %+v, %v; want an ErrUnavailable saying the driver crashed", got.res, got.err)
			}
			t.Logf("Wait returned %s after the plugin was killed", time.Since(killed).Round(time.Millisecond))
		case <-time.After(testwait.Limit):
			t.Fatalf("Wait did not return within %v of the plugin being killed", testwait.Limit)
		}
	}
	if !testwait.For(t.Context(), 0, func() bool { return !alive(t, r, s, "fg.pid") }) {
		t.Errorf("the exec's process still runs %v after it ended", testwait.Limit)
	}
	readBack(t, r, s, lease)
	b2, err := r.Backend(ctx, h.Info.Name)
	if err != nil {
		t.Fatal(err)
	}
	if p2, ok := b2.(pider); !ok || p2.Pid() == pid {
		t.Errorf("the registry did not start the plugin again (pid %d before and after)", pid)
	}
}

// After the runtime restarts, sessions come back: the next exec starts the sandbox
// if it is stopped, and its files are there where the driver keeps them.
func caseRuntimeRestart(t T, h *Harness) {
	if h.Options.RestartRuntime == nil {
		t.Skip("no way to restart the runtime was given (Options.RestartRuntime, berth conformance --restart-hook); restarting a shared daemon is never done without one")
	}
	id := randHex(4)
	r, _ := h.retentionRegistry(t, id)
	s := "conf-keep-" + id + ":restart"
	lease := startSession(t, r, s)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if err := h.Options.RestartRuntime(ctx); err != nil {
		t.Fatalf("restarting the runtime: %v", err)
	}
	t.Logf("after the runtime restart the sandbox is %s", sandboxState(t, driverOf(t, r, lease), lease.Sandbox))
	if h.Info.Capabilities.StopStart {
		readBack(t, r, s, lease)
		return
	}
	out, again := regExec(t, r, s, "echo back")
	if out != "back\n" || again.Sandbox != lease.Sandbox {
		t.Errorf("exec after the runtime restart: %q in %s, want it in %s", out, again.Sandbox, lease.Sandbox)
	}
	t.Logf("the driver does not keep files across a stop (StopStart false); checked only that the session works (recreated: %v)", again.Recreated)
}
