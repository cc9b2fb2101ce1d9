package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

// DefaultStopGrace is how long Stop gives processes between SIGTERM and SIGKILL when
// the caller passes 0.
const DefaultStopGrace = time.Second

// hostRootLinks are the top-level host paths that Debian's merged /usr makes
// symbolic links into /usr; they are recreated in the sandbox as links (or
// mounted read-only where the host has real directories).
var hostRootLinks = []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// bwrapArgs builds the bwrap command line of sandbox m: new user, mount, PID, IPC
// and UTS namespaces (and network unless the spec asks for "host"), every capability
// dropped, the host's /usr read-only, private writable home and /tmp, a small
// private /etc, the agent directory read-only and the socket directory, and the
// agent as PID 1 (--as-pid-1, so it reaps every process of the sandbox).
// The agent reports ready on fd 3. There is no --die-with-parent: the
// sandbox outlives the plugin process that started it.
func (d *Driver) bwrapArgs(dir string, m *meta) []string {
	d.mu.Lock()
	roBinds := append([]string(nil), d.roBinds...)
	d.mu.Unlock()
	spec := m.Spec
	args := []string{
		// A user namespace (mapping the sandbox's uid to the caller's, root to
		// root) is what makes --cap-drop ALL empty the bounding set too: without
		// it, bwrap run by root drops the effective, permitted, inheritable and
		// ambient sets but leaves the bounding set full.
		"--unshare-user",
		"--unshare-pid", "--unshare-ipc", "--unshare-uts",
		"--hostname", hostname(m.Name),
		"--cap-drop", "ALL",
		"--as-pid-1",
	}
	if spec.Network != "host" {
		args = append(args, "--unshare-net")
	}
	args = append(args, "--ro-bind", "/usr", "/usr")
	for _, p := range hostRootLinks {
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(p); err == nil {
				args = append(args, "--symlink", target, p)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", p, p)
		}
	}
	args = append(args,
		"--proc", "/proc",
		"--dev", "/dev",
		"--ro-bind", filepath.Join(dir, "etc"), "/etc",
		"--bind", filepath.Join(dir, "home"), HomeDir,
		"--bind", filepath.Join(dir, "tmp"), "/tmp",
	)
	for _, p := range roBinds {
		args = append(args, "--ro-bind", p, p)
	}
	for _, mnt := range spec.Mounts {
		flag := "--bind"
		if mnt.ReadOnly {
			flag = "--ro-bind"
		}
		args = append(args, flag, mnt.Source, mnt.Target)
	}
	// Last, so no mount from the rule can cover them.
	args = append(args,
		"--ro-bind", m.Agent.Dir, backend.AgentMountDir,
		"--bind", m.Agent.SocketDir, backend.SocketMountDir,
	)
	cwd := spec.Workdir
	if cwd == "" {
		cwd = HomeDir
	}
	args = append(args, "--chdir", cwd, "--")
	return append(args, agent.SandboxCommand("--ready-fd", "3")...)
}

// env is the environment of the agent and so of every exec: PATH, HOME, LANG and
// TERM, then the spec's env.
func env(spec backend.SandboxSpec) []string {
	e := []string{"PATH=" + defaultPath, "HOME=" + HomeDir, "LANG=C.UTF-8", "TERM=xterm"}
	return append(e, spec.Env...)
}

// start starts the sandbox's bwrap detached from this plugin (its own session,
// not killed with the plugin: a sandbox outlives the call that created it), waits
// for the agent to report ready, and records the pids in meta.
func (d *Driver) start(ctx context.Context, dir string, m *meta) error {
	d.mu.Lock()
	bw := d.bwrap
	d.mu.Unlock()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	// The host network's resolver; with network none there is nothing to resolve.
	resolv := []byte{}
	if m.Spec.Network == "host" {
		resolv, _ = os.ReadFile("/etc/resolv.conf")
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "resolv.conf"), resolv, 0o644); err != nil {
		return fmt.Errorf("bwrap sandbox %s: %w", m.Name, err)
	}
	logPath := filepath.Join(dir, "bwrap.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("bwrap sandbox %s: %w", m.Name, err)
	}
	defer logf.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	// The agent's token goes in its environment (bwrap passes its own on), never
	// in a file of the sandbox nor on a command line; first, as the agent takes the
	// first of two entries.
	tok, err := agent.TokenEnvEntry(m.Agent.Dir)
	if err != nil {
		return backend.Errorf(backend.ErrUnavailable, "bwrap sandbox %s: %v", m.Name, err)
	}
	argv := append([]string{"bwrap"}, d.bwrapArgs(dir, m)...)
	p, err := os.StartProcess(bw, argv, &os.ProcAttr{
		Dir:   "/",
		Env:   append([]string{tok}, env(m.Spec)...),
		Files: []*os.File{devnull, logf, logf, readyW},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	readyW.Close()
	if err != nil {
		return backend.Errorf(backend.ErrUnavailable, "bwrap sandbox %s: starting %s: %v", m.Name, bw, err)
	}
	go p.Wait() // reap it if it ends while this plugin lives; it is detached otherwise

	// "ready" comes once the agent listens; EOF first means bwrap or the agent
	// died (bwrap holds the pipe too, and exits with its child).
	deadline := time.Now().Add(startTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	readyR.SetReadDeadline(deadline)
	buf := make([]byte, 16)
	n, rerr := readyR.Read(buf)
	// The sandbox's PID 1 is bwrap's only child.
	initPID := onlyChild(p.Pid)
	fail := func(what string) error {
		if initPID > 0 {
			syscall.Kill(initPID, syscall.SIGKILL)
		}
		p.Kill()
		return backend.Errorf(backend.ErrUnavailable, "bwrap sandbox %s: %s%s (bwrap %s; see %s)", m.Name, what, logTail(logPath), bw, logPath)
	}
	if rerr != nil || !bytes.HasPrefix(buf[:n], []byte("ready")) {
		return fail(fmt.Sprintf("the agent did not start (%v)", rerr))
	}
	if initPID <= 0 {
		return fail("bwrap has no child process")
	}
	bt, err1 := startTicks(p.Pid)
	it, err2 := startTicks(initPID)
	if err1 != nil || err2 != nil {
		return fail(fmt.Sprintf("the sandbox ended right after it started (%v %v)", err1, err2))
	}
	m.BwrapPID, m.BwrapTicks, m.InitPID, m.InitTicks = p.Pid, bt, initPID, it
	if err := writeMeta(dir, m); err != nil {
		fail("recording it")
		return fmt.Errorf("bwrap sandbox %s: %w", m.Name, err)
	}
	return nil
}

// onlyChild returns the pid of pid's one child (from /proc), or 0.
func onlyChild(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		return 0
	}
	c, _ := strconv.Atoi(f[0])
	return c
}

// stop ends the sandbox through its agent, then by killing its PID 1 (which ends
// the PID namespace) and the bwrap process, and waits until both are gone.
func (d *Driver) stop(ctx context.Context, m *meta, grace time.Duration) error {
	if grace <= 0 {
		grace = DefaultStopGrace
	}
	if !alive(m.InitPID, m.InitTicks) && !alive(m.BwrapPID, m.BwrapTicks) {
		return nil
	}
	initFD := pidfd(m.InitPID, m.InitTicks)
	bwrapFD := pidfd(m.BwrapPID, m.BwrapTicks)
	defer closeFD(initFD)
	defer closeFD(bwrapFD)
	if initFD >= 0 {
		err := agent.Shutdown(ctx, m.Agent, grace)
		if err == nil {
			waitExit(initFD, grace+2*time.Second)
		}
		if alive(m.InitPID, m.InitTicks) {
			unix.PidfdSendSignal(initFD, unix.SIGKILL, nil, 0)
			waitExit(initFD, 5*time.Second)
		}
	}
	if bwrapFD >= 0 {
		// bwrap exits with its child; it is killed only when something went wrong.
		if !waitExit(bwrapFD, 2*time.Second) {
			unix.PidfdSendSignal(bwrapFD, unix.SIGKILL, nil, 0)
			waitExit(bwrapFD, 5*time.Second)
		}
	}
	if alive(m.InitPID, m.InitTicks) {
		return backend.Errorf(backend.ErrUnavailable, "bwrap sandbox %s: its PID 1 (host pid %d) survived SIGKILL", m.Name, m.InitPID)
	}
	return nil
}

// pidfd opens a pidfd of pid if it still is the process that started at ticks, or
// returns -1.
func pidfd(pid int, ticks uint64) int {
	if pid <= 0 {
		return -1
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1
	}
	if !alive(pid, ticks) { // checked after opening: the fd is now of the right process or of a dead one
		unix.Close(fd)
		return -1
	}
	return fd
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// waitExit waits up to d for the process of a pidfd to exit and reports whether it
// did (a pidfd becomes readable when its process exits).
func waitExit(fd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return n > 0
	}
}

// alive reports whether pid runs and started at ticks (not a zombie).
func alive(pid int, ticks uint64) bool {
	if pid <= 0 {
		return false
	}
	t, err := startTicks(pid)
	return err == nil && t == ticks
}

// startTicks returns field 22 of /proc/PID/stat (start time in clock ticks since
// boot), which with the pid identifies a process across pid reuse. A zombie is an
// error.
func startTicks(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// logTail returns ": " and the last 512 bytes of the log at path, or "".
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	if len(b) > 512 {
		b = b[len(b)-512:]
	}
	return ": " + strings.TrimSpace(string(b))
}
