package backends

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// pipeDrainTimeout bounds how long, after the plugin process has exited, the
// host waits for its stdout and stderr to reach EOF (a descendant outside its
// process group may hold them) before closing its ends.
const pipeDrainTimeout = time.Second

// procRunner is the go-plugin runner.Runner that Launch uses instead of
// go-plugin's own, which hands the host's stdin to the plugin
// (cmd.Stdin = os.Stdin in plugin.Client.Start). It starts the plugin with
// stdin from /dev/null in its own process group, records the first bytes of
// stdout and how the process ended, and kills the whole group when the process
// exits or is killed, so nothing the plugin left in its group survives it.
type procRunner struct {
	logger hclog.Logger
	// launchCtx is Launch's context: ending it kills the plugin until
	// stopWatch is called (once the start has succeeded).
	launchCtx context.Context
	stopWatch func() bool
	path      string
	cmd       *exec.Cmd
	stdout    io.ReadCloser
	stderr    io.ReadCloser
	head      *headRecorder

	pid    int
	exited chan struct{} // closed once the process has exited (not yet reaped)
	// stdoutEOF is closed when the plugin's stdout reaches EOF: a plugin that closes
	// it before the handshake is exiting, and Kill gives it a moment to do so.
	stdoutEOF chan struct{}

	mu       sync.Mutex
	killSent bool           // Kill signalled the group before the process exited
	selfExit bool           // the process exited before any Kill
	reaping  bool           // Wait has started reaping; the pid may no longer be ours
	exitDesc string         // how it ended, read from /proc while it was a zombie
	exitSig  syscall.Signal // the signal that ended it (from /proc), or 0
	state    *os.ProcessState
}

func newProcRunner(ctx context.Context, logger hclog.Logger, path string, args, env []string) (*procRunner, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdin = nil // /dev/null
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	r := &procRunner{
		logger:    logger,
		launchCtx: ctx,
		stopWatch: func() bool { return true },
		path:      path,
		cmd:       cmd,
		stderr:    stderr,
		head:      &headRecorder{max: 512},
		exited:    make(chan struct{}),
		stdoutEOF: make(chan struct{}),
	}
	var eofOnce sync.Once
	r.stdout = &teeReadCloser{r: stdout, w: r.head, onEOF: func() { eofOnce.Do(func() { close(r.stdoutEOF) }) }}
	return r, nil
}

// Start implements runner.Runner.
func (r *procRunner) Start(context.Context) error {
	if err := r.launchCtx.Err(); err != nil {
		return err
	}
	if err := r.cmd.Start(); err != nil {
		return err
	}
	r.pid = r.cmd.Process.Pid
	r.stopWatch = context.AfterFunc(r.launchCtx, func() { _ = r.Kill(context.Background()) })
	r.logger.Debug("driver plugin started", "path", r.path, "pid", r.pid)
	go r.watch()
	return nil
}

// watch waits for the exit without reaping, kills what is left of the process
// group while the pid cannot be reused, and bounds the pipes' drain.
func (r *procRunner) watch() {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, r.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	desc, sig := zombieStatus(r.pid)
	r.mu.Lock()
	r.selfExit = !r.killSent
	r.exitDesc, r.exitSig = desc, sig
	r.mu.Unlock()
	_ = unix.Kill(-r.pid, unix.SIGKILL)
	close(r.exited)
	time.AfterFunc(pipeDrainTimeout, func() {
		_ = r.stdout.Close()
		_ = r.stderr.Close()
	})
}

// Wait implements runner.Runner: it reaps the process after watch is done.
func (r *procRunner) Wait(context.Context) error {
	<-r.exited
	r.mu.Lock()
	r.reaping = true
	r.mu.Unlock()
	err := r.cmd.Wait()
	r.mu.Lock()
	r.state = r.cmd.ProcessState
	r.mu.Unlock()
	return err
}

// Kill implements runner.Runner: SIGKILL to the plugin's process group. When the
// plugin has closed its stdout it is exiting already: it gets up to crashGrace to
// do so first, so that its own exit status (and not our kill) says how it ended.
func (r *procRunner) Kill(context.Context) error {
	select {
	case <-r.stdoutEOF:
		r.hasExited(crashGrace)
	default:
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pid == 0 || r.reaping {
		return nil
	}
	select {
	case <-r.exited:
	default:
		// Not "sent" when the process is already a zombie that watch has not
		// seen yet: it exited by itself.
		if !isZombie(r.pid) {
			r.killSent = true
		}
	}
	_ = unix.Kill(-r.pid, unix.SIGKILL)
	return nil
}

// isZombie reports whether pid has exited but is not reaped.
func isZombie(pid int) bool {
	f := statFields(pid)
	return len(f) > 0 && f[0][0] == 'Z'
}

// statFields returns the fields of /proc/PID/stat after "pid (comm)" (state, ppid,
// pgrp, ...; comm may hold spaces and parentheses), or nil when the process is gone.
func statFields(pid int) [][]byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	f := bytes.Fields(b[i+1:])
	if len(f) == 0 || len(f[0]) != 1 {
		return nil
	}
	return f
}

// Diagnose implements runner.Runner; Launch writes its own diagnosis.
func (r *procRunner) Diagnose(context.Context) string { return "" }

// Stdout implements runner.Runner.
func (r *procRunner) Stdout() io.ReadCloser { return r.stdout }

// Stderr implements runner.Runner.
func (r *procRunner) Stderr() io.ReadCloser { return r.stderr }

// Name implements runner.Runner.
func (r *procRunner) Name() string { return r.path }

// ID implements runner.Runner: the pid, "" before Start.
func (r *procRunner) ID() string {
	if r.pid == 0 {
		return ""
	}
	return strconv.Itoa(r.pid)
}

// PluginToHost implements runner.AddrTranslator (same host: identity).
func (r *procRunner) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

// HostToPlugin implements runner.AddrTranslator (same host: identity).
func (r *procRunner) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}

// hasExited reports whether the process has exited, waiting up to grace.
func (r *procRunner) hasExited(grace time.Duration) bool {
	if r.pid == 0 {
		return false
	}
	select {
	case <-r.exited:
		return true
	default:
	}
	if grace <= 0 {
		return false
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-r.exited:
		return true
	case <-t.C:
		return false
	}
}

// exitText describes how the process ended ("exit status 3", "signal: killed"),
// or "" while it is not reaped.
func (r *procRunner) exitText() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != nil {
		return r.state.String()
	}
	return r.exitDesc
}

// zombieStatus describes how the exited, unreaped pid ended ("exit status 3",
// "signal: killed") from the exit_code field of /proc/PID/stat (Linux 3.5+), with the
// signal that ended it (0 for an exit), or returns "", 0.
func zombieStatus(pid int) (string, syscall.Signal) {
	f := statFields(pid)
	if len(f) < 50 {
		return "", 0
	}
	code, err := strconv.Atoi(string(f[len(f)-1]))
	if err != nil {
		return "", 0
	}
	ws := syscall.WaitStatus(code)
	switch {
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus()), 0
	case ws.Signaled():
		return "signal: " + ws.Signal().String(), ws.Signal()
	}
	return "", 0
}

// killedBy returns the signal that ended the process, or 0 (an exit, or not known).
func (r *procRunner) killedBy() syscall.Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != nil {
		if ws, ok := r.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal()
		}
		return 0
	}
	return r.exitSig
}

// headRecorder keeps the first max bytes written to it.
type headRecorder struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (h *headRecorder) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if room := h.max - len(h.buf); room > 0 {
		h.buf = append(h.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (h *headRecorder) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return string(h.buf)
}

// tailRecorder keeps the last max bytes written to it.
type tailRecorder struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailRecorder) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailRecorder) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// teeReadCloser copies what is read to w and calls onEOF (when set) at io.EOF.
type teeReadCloser struct {
	r     io.ReadCloser
	w     io.Writer
	onEOF func()
}

func (t *teeReadCloser) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		_, _ = t.w.Write(p[:n])
	}
	if err == io.EOF && t.onEOF != nil {
		t.onEOF()
	}
	return n, err
}

func (t *teeReadCloser) Close() error { return t.r.Close() }
