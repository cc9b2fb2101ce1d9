package local

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

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"golang.org/x/sys/unix"
)

// agentStartTimeout bounds how long Create waits for a new agent to report ready.
const agentStartTimeout = 10 * time.Second

// agentEnv is the environment the agent (and so every exec) starts from: the allowlisted
// host variables, then HOME, then the spec's env (each overriding what came before),
// and the markers that sweep looks for: BERTH_SANDBOX (the name) and BERTH_SANDBOX_DIR
// (the sandbox's directory, HOME's parent, which tells apart the sandboxes of one name
// that two drivers built on this package make in their own state dirs).
func (d *Driver) agentEnv(m *meta, home string) []string {
	d.mu.Lock()
	names := append(append([]string(nil), d.allowlist...), m.Spec.EnvAllowlist...)
	d.mu.Unlock()
	var env []string
	seen := map[string]bool{}
	for _, k := range names {
		if seen[k] {
			continue
		}
		seen[k] = true
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	if !seen["PATH"] || os.Getenv("PATH") == "" {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	env = append(env, "HOME="+home)
	env = append(env, m.Spec.Env...)
	// Last, so the spec cannot remove the markers that Stop's sweep looks for.
	return dedupEnv(append(env, "BERTH_SANDBOX="+m.Name, dirMarker+filepath.Dir(home)))
}

// dedupEnv keeps the last KEY=VALUE of each key, so the spec's env overrides the
// host's (as exec.Cmd does for its Env).
func dedupEnv(env []string) []string {
	last := make(map[string]int, len(env))
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		last[k] = i
	}
	out := env[:0:0]
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if last[k] == i {
			out = append(out, kv)
		}
	}
	return out
}

// startAgent starts the sandbox's agent detached (own session, subreaper), waits for it
// to listen, and records its pid in meta.
func (d *Driver) startAgent(ctx context.Context, dir string, m *meta) error {
	home := homeDir(dir)
	cwd := m.Spec.Workdir
	if cwd == "" {
		cwd = home
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	argv := []string{backend.AgentBinaryName, "serve", "--socket-dir", m.Agent.SocketDir,
		"--ready-fd", "3", "--subreaper", "--log", filepath.Join(dir, "agent.log"),
		"--state-dir", filepath.Join(dir, "agent-state")}
	attr := &os.ProcAttr{
		Dir:   cwd,
		Env:   d.agentEnv(m, home),
		Files: []*os.File{devnull, devnull, devnull, w},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	var p *os.Process
	// The agent binary may have been copied a moment ago by another goroutine whose
	// write descriptor a concurrent fork still holds: retry ETXTBSY briefly.
	for i := 0; ; i++ {
		p, err = os.StartProcess(m.Agent.Binary, argv, attr)
		if err == nil || !errors.Is(err, syscall.ETXTBSY) || i == 50 {
			break
		}
		time.Sleep(time.Duration(i+1) * time.Millisecond)
	}
	w.Close()
	if err != nil {
		return backend.Errorf(backend.ErrUnavailable, "local sandbox %s: starting agent %s: %w", m.Name, m.Agent.Binary, err)
	}
	go p.Wait() // reap it if it ends while this process lives; it is detached otherwise

	deadline := time.Now().Add(agentStartTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	r.SetReadDeadline(deadline)
	buf := make([]byte, 16)
	n, rerr := r.Read(buf)
	if rerr != nil || !bytes.HasPrefix(buf[:n], []byte("ready")) {
		p.Kill()
		tail := logTail(filepath.Join(dir, "agent.log"))
		return backend.Errorf(backend.ErrUnavailable, "local sandbox %s: agent %s did not start (%w)%s", m.Name, m.Agent.Binary, rerr, tail)
	}
	ticks, err := startTicks(p.Pid)
	if err != nil {
		p.Kill()
		return fmt.Errorf("local sandbox %s: agent: %w", m.Name, err)
	}
	m.AgentPID, m.AgentTick = p.Pid, ticks
	if err := writeMeta(dir, m); err != nil {
		p.Kill()
		return fmt.Errorf("local sandbox %s: %w", m.Name, err)
	}
	return nil
}

func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 512 {
		b = b[len(b)-512:]
	}
	return ": " + strings.TrimSpace(string(b))
}

// startTicks returns field 22 of /proc/PID/stat (start time in clock ticks since boot),
// which with the pid identifies a process across pid reuse.
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

// alive reports whether the sandbox's recorded agent process still runs.
func (d *Driver) alive(m *meta) bool {
	if m.AgentPID <= 0 {
		return false
	}
	t, err := startTicks(m.AgentPID)
	return err == nil && t == m.AgentTick
}

// stop ends the agent of the sandbox in dir and everything under it: first through the
// agent's Shutdown, then, if the agent does not exit in time, by killing it and
// sweeping the processes that carry the sandbox's markers.
func (d *Driver) stop(ctx context.Context, dir string, m *meta, grace time.Duration) error {
	if grace <= 0 {
		grace = DefaultStopGrace
	}
	if d.alive(m) {
		pidfd, perr := unix.PidfdOpen(m.AgentPID, 0)
		if perr == nil {
			defer unix.Close(pidfd)
		}
		// An agent that cannot be asked is killed below.
		agent.Shutdown(ctx, m.Agent, grace)
		if perr == nil && d.alive(m) {
			// Wait for the agent to exit: its pidfd becomes readable.
			fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
			for {
				_, perr := unix.Poll(fds, int((grace + 2*time.Second).Milliseconds()))
				if perr != unix.EINTR {
					break
				}
			}
		}
		if d.alive(m) {
			syscall.Kill(m.AgentPID, syscall.SIGKILL)
		}
	}
	sweep(m.Name, dir)
	return nil
}

// dirMarker starts the environment entry that names a sandbox's directory.
const dirMarker = "BERTH_SANDBOX_DIR="

// sweep kills every process of this user whose environment carries
// BERTH_SANDBOX=name and BERTH_SANDBOX_DIR=dir, the sandbox's directory: what is left
// of a sandbox whose agent died. A process with BERTH_SANDBOX=name but no
// BERTH_SANDBOX_DIR at all was started by an earlier version, which set only the
// name, and is swept too; one whose BERTH_SANDBOX_DIR names another directory belongs
// to another driver's sandbox of the same name and is left alone.
func sweep(name, dir string) {
	marker := []byte("\x00BERTH_SANDBOX=" + name + "\x00")
	dirEntry := []byte("\x00" + dirMarker + dir + "\x00")
	anyDir := []byte("\x00" + dirMarker)
	// Killing is asynchronous: look again until no marked process is left, then wait
	// for each killed one to have exited. A dying process's environment goes with its
	// memory, before its files are closed: an old agent whose environ reads empty may
	// still hold its socket and accept connections, so only its pidfd turning
	// readable (at exit, after the files) says it is gone.
	deadline := time.Now().Add(5 * time.Second)
	var pidfds []int
	defer func() {
		for _, fd := range pidfds {
			unix.Close(fd)
		}
	}()
	killed := map[int]bool{}
	for {
		found := false
		ents, err := os.ReadDir("/proc")
		if err != nil {
			break
		}
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
			if err != nil {
				continue
			}
			env = append([]byte{0}, env...)
			if !bytes.Contains(env, marker) || (bytes.Contains(env, anyDir) && !bytes.Contains(env, dirEntry)) {
				continue
			}
			if !killed[pid] {
				// The pidfd names this process, not a later one given its pid.
				if fd, err := unix.PidfdOpen(pid, 0); err == nil {
					pidfds = append(pidfds, fd)
				}
				killed[pid] = true
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				found = true
			}
		}
		if !found || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond) // let the kills land before looking again
	}
	for _, fd := range pidfds {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			left := time.Until(deadline)
			if left <= 0 {
				return
			}
			if _, err := unix.Poll(fds, int(left.Milliseconds())+1); err != unix.EINTR {
				break
			}
		}
	}
}
