package backends

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
	pb "github.com/berth-sh/berth/backends/internal/driverpb"
	"github.com/berth-sh/berth/internal/rpcerr"
)

// DefaultStartTimeout is how long Launch waits for a plugin's handshake when
// LaunchOptions.StartTimeout is zero.
const DefaultStartTimeout = 10 * time.Second

// crashGrace is how long a call that lost its connection waits to see the
// plugin process exit before it reports the error as something else (a
// transport error of a plugin that lives on). A crashed plugin is seen at once
// (the host waits for its exit in a blocked waitid); the bound only matters on
// a loaded machine, where noticing takes longer, and when the plugin lives: it
// was 500 ms, which a busy 2-core machine missed, reporting a crash as a bare
// transport error.
const crashGrace = 5 * time.Second

// LaunchOptions says which plugin to start and how.
type LaunchOptions struct {
	// Path is the plugin executable (for a built-in driver what
	// catalog.BuiltinDriver.Command returns: the berth binary for local, berth-driver-NAME
	// for docker and containerd). It is run as it is, not looked up in PATH.
	Path string
	// Args are the arguments after the program name.
	Args []string
	// Env is KEY=VALUE pairs added to the host's environment for the plugin.
	Env []string
	// Logger receives the host side's messages and every log line the plugin
	// writes to its stderr (go-hclog JSON is parsed for its level, other lines are
	// logged at debug), under the name of Path's base. nil discards them. Nothing
	// of the plugin's reaches the host's stdout or stderr.
	Logger hclog.Logger
	// StartTimeout bounds the wait for the handshake; zero means
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// SHA256, when set, is the pinned hex SHA-256 of the file at Path (the
	// driver block's sha256 key): Launch hashes the file first and refuses to
	// start it when the sums differ (catalog.VerifySHA256).
	SHA256 string
	// HashCacheDir, when set with SHA256, is a directory (created if missing)
	// where the file's sum is cached under its device, inode, size, mtime and
	// ctime, so an unchanged plugin is hashed once instead of at every start
	// (see catalog.CachedFileSHA256).
	HashCacheDir string
}

// Client is a host's connection to one driver plugin process. It implements
// backend.TerminalBackend, backend.Configurer, backend.Execer, backend.Copier,
// backend.AgentDialer, backend.Validator, backend.ImagePuller and
// backend.ImageImporter by forwarding each call; an
// optional call the driver lacks returns an error wrapping
// backend.ErrUnsupported (as its Capabilities say). Errors keep their kind
// across the process boundary (errors.Is works). When the plugin process dies
// during a call, the call returns an error wrapping backend.ErrUnavailable that
// says the driver crashed. A Client is safe for concurrent use.
type Client struct {
	path   string
	args   []string // LaunchOptions.Args
	env    []string // LaunchOptions.Env
	logger hclog.Logger
	pc     *plugin.Client
	runner *procRunner
	api    pb.DriverClient
	killed atomic.Bool
	stderr *tailRecorder
	// socketDir is go-plugin's private directory for the plugin's socket, in
	// PluginSocketBase; dirLock holds it (holdSocketDir) until the plugin is killed.
	socketDir string
	dirLock   atomic.Pointer[os.File]
}

// ForwardsDriver implements backend.Forwarder: Info reports the flags derived
// where the driver runs (the plugin's side), not the methods of Client.
func (c *Client) ForwardsDriver() {}

var (
	_ backend.Forwarder       = (*Client)(nil)
	_ backend.TerminalBackend = (*Client)(nil)
	_ backend.Configurer      = (*Client)(nil)
	_ backend.Copier          = (*Client)(nil)
	_ backend.Execer          = (*Client)(nil)
	_ backend.AgentDialer     = (*Client)(nil)
	_ backend.Validator       = (*Client)(nil)
	_ backend.ImagePuller     = (*Client)(nil)
	_ backend.ImageImporter   = (*Client)(nil)
)

// Launch starts the plugin opts.Path, completes the go-plugin handshake
// (protocol ProtocolVersion, gRPC only, windows of WindowSize) and returns a
// connected Client. The plugin runs in its own process group (a terminal's
// SIGINT does not reach it) with stdin from /dev/null and its stdout and stderr
// read by the host; it learns the host's pid and log level from the
// environment (see Serve).
//
// Errors name the file and say what to do: a missing file wraps
// backend.ErrNotFound, a directory or a file without execute permission
// backend.ErrInvalid; a plugin that writes something other than the handshake
// to stdout, exits before the handshake, does not finish it within
// StartTimeout, or speaks no common protocol version wraps
// backend.ErrUnavailable. After an error no process of the plugin's is left.
// Cancelling ctx while the plugin starts kills it and returns ctx's error.
func Launch(ctx context.Context, opts LaunchOptions) (*Client, error) {
	if opts.Path == "" {
		return nil, backend.Errorf(backend.ErrInvalid, "driver plugin: no executable path given")
	}
	if err := checkExecutable(opts.Path); err != nil {
		return nil, err
	}
	if opts.SHA256 != "" {
		if err := catalog.VerifySHA256(opts.Path, opts.SHA256, opts.HashCacheDir); err != nil {
			return nil, err
		}
	}
	logger := opts.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = DefaultStartTimeout
	}

	env := append(os.Environ(), opts.Env...)
	env = append(env, envHostPID+"="+strconv.Itoa(os.Getpid()))
	if lvl := logger.GetLevel(); lvl != hclog.NoLevel && lvl != hclog.Off {
		env = append(env, envLogLevel+"="+lvl.String())
	}

	base, err := PluginSocketBase()
	if err != nil {
		return nil, backend.Errorf(backend.ErrUnavailable, "driver plugin %s: %w", opts.Path, err)
	}

	c := &Client{path: opts.Path, args: opts.Args, env: opts.Env, logger: logger, stderr: &tailRecorder{max: 2048}}
	var runnerErr error
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: pluginSets(nil),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		// RunnerFunc instead of Cmd: go-plugin sets cmd.Stdin = os.Stdin on the
		// command it builds; our runner starts a fresh command from it.
		RunnerFunc: func(l hclog.Logger, cmd *exec.Cmd, socketDir string) (runner.Runner, error) {
			c.socketDir = socketDir
			lock, err := holdSocketDir(socketDir)
			if err != nil {
				runnerErr = err
				return nil, err
			}
			c.dirLock.Store(lock)
			// cmd.Env holds go-plugin's variables (cookie, protocol versions,
			// socket dir) since SkipHostEnv is set; they come last so nothing
			// overrides them.
			r, err := newProcRunner(ctx, l, opts.Path, opts.Args, append(env, cmd.Env...))
			if err != nil {
				runnerErr = err
				return nil, err
			}
			c.runner = r
			return r, nil
		},
		SkipHostEnv: true,
		// A short per-user base (not the state dir, which may be too deep for a
		// socket path); PruneSocketDirs collects dirs whose berth was killed.
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: base},
		StartTimeout:     timeout,
		Stderr:           c.stderr,
		SyncStdout:       logger.Named("stdout").StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true}),
		SyncStderr:       logger.Named("stderr").StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true}),
		Logger:           logger,
		GRPCDialOptions: []grpc.DialOption{
			grpc.WithInitialWindowSize(WindowSize),
			grpc.WithInitialConnWindowSize(WindowSize),
		},
	}
	c.pc = plugin.NewClient(cfg)

	type started struct {
		raw any
		err error
	}
	startCh := make(chan started, 1)
	began := time.Now()
	go func() {
		rpc, err := c.pc.Client()
		if err != nil {
			startCh <- started{err: err}
			return
		}
		raw, err := rpc.Dispense(PluginName)
		startCh <- started{raw: raw, err: err}
	}()
	res := <-startCh
	if res.err == nil && c.runner != nil && !c.runner.stopWatch() {
		res.err = ctx.Err() // ctx ended just as the start succeeded
	}
	if res.err != nil && ctx.Err() != nil {
		c.killProcess()
		return nil, &wrapError{msg: fmt.Sprintf("driver plugin %s: start abandoned: %v", opts.Path, ctx.Err()), err: ctx.Err()}
	}
	if res.err != nil {
		if c.runner == nil || c.runner.pid == 0 {
			// go-plugin's Kill skips a process that never started, and with it
			// the removal of its socket directory.
			if c.socketDir != "" {
				_ = os.RemoveAll(c.socketDir)
			}
		}
		c.killProcess()
		if runnerErr != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "driver plugin %s: cannot start it: %w", opts.Path, runnerErr)
		}
		return nil, c.startError(ctx, res.err, time.Since(began), timeout)
	}
	d, ok := res.raw.(*dispensed)
	if !ok {
		c.killProcess()
		return nil, backend.Errorf(backend.ErrUnavailable, "driver plugin %s: unexpected plugin type %T", opts.Path, res.raw)
	}
	c.api = d.api
	return c, nil
}

// checkExecutable gives the clear errors for a path that cannot be a plugin.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return backend.Errorf(backend.ErrNotFound, "driver plugin %s: no such file; check the path (plugin_dirs, $BERTH_PLUGIN_PATH) or install the driver", path)
	case err != nil:
		return backend.Errorf(backend.ErrInvalid, "driver plugin %s: %w", path, err)
	case fi.IsDir():
		return backend.Errorf(backend.ErrInvalid, "driver plugin %s: is a directory, not an executable", path)
	case fi.Mode().Perm()&0o111 == 0:
		return backend.Errorf(backend.ErrInvalid, "driver plugin %s: not executable; run chmod +x %s", path, path)
	}
	return nil
}

var handshakeLine = regexp.MustCompile(`^\d+\|\d+\|`)

// startError explains a failed start. The process is gone when it runs.
func (c *Client) startError(ctx context.Context, err error, elapsed, timeout time.Duration) error {
	r := c.runner
	head := ""
	if r != nil {
		head = r.head.String()
	}
	firstLine, _, _ := strings.Cut(head, "\n")
	firstLine = strings.TrimSpace(firstLine)
	stderr := strings.TrimSpace(c.stderr.String())
	stderrNote := ""
	if stderr != "" {
		stderrNote = "; its stderr ended with: " + lastLines(stderr, 5)
	}
	switch {
	case r != nil && r.pid == 0:
		return backend.Errorf(backend.ErrUnavailable,
			"driver plugin %s: cannot run it: %w; check that it is an executable for this machine", c.path, err)
	case head != "" && handshakeLine.MatchString(firstLine) && strings.Contains(err.Error(), "incompatible API version"):
		// The plugin answered with a version we do not speak; go-plugin names
		// only the one it picked, describe lists them all.
		versions := []int{}
		if v, perr := strconv.Atoi(strings.Split(firstLine, "|")[1]); perr == nil {
			versions = []int{v}
		}
		if desc, derr := describe(ctx, c.path, c.env); derr == nil {
			if _, common := CommonVersion(HostProtocolVersions(), desc.ProtocolVersions); !common {
				versions = desc.ProtocolVersions
			}
		}
		return versionError(c.path, versions)
	case head != "" && !handshakeLine.MatchString(firstLine):
		return backend.Errorf(backend.ErrUnavailable,
			"driver plugin %s wrote %q to stdout instead of the plugin handshake and was stopped; a driver plugin must call backends.Serve before anything else and never write to stdout (log to stderr with go-hclog)%s",
			c.path, clip(firstLine, 120), stderrNote)
	case r != nil && head == "" && r.selfExited() && r.killedBy() != 0:
		// Something else killed it (a kill, the OOM killer): the plugin is not to blame.
		sig := r.killedBy()
		return backend.Errorf(backend.ErrUnavailable,
			"driver plugin %s was killed by signal %d (%s) before the plugin handshake, not by berth (a kill, the OOM killer?)%s; the next call starts it again",
			c.command(), int(sig), unix.SignalName(sig), stderrNote)
	case r != nil && head == "" && r.selfExited() && c.builtin():
		status := r.exitText()
		if status == "" {
			status = "no exit status"
		}
		return backend.Errorf(backend.ErrUnavailable,
			"built-in driver plugin %s exited before the plugin handshake (%s)%s; %s",
			c.command(), status, stderrNote, seeLog)
	case r != nil && head == "" && r.selfExited():
		status := r.exitText()
		if status == "" {
			status = "no exit status"
		}
		return backend.Errorf(backend.ErrUnavailable,
			"driver plugin %s exited before the plugin handshake (%s)%s; check that it is a berth driver built with backends.Serve and that it can start: %s",
			c.path, status, stderrNote, seeLog)
	case head == "" && elapsed >= timeout && c.builtin():
		return backend.Errorf(backend.ErrUnavailable,
			"built-in driver plugin %s did not complete the plugin handshake within %s and was killed: %s is not a berth binary (berth-cli) that serves built-in drivers%s; a Go program that holds a registry starts its own executable here unless told otherwise: run the driver in the program (import its package and pass registry.WithLinkedDrivers, or registry.WithDriver), or name a berth-cli with registry.WithBerthBinary",
			c.command(), timeout, c.path, stderrNote)
	case head == "" && elapsed >= timeout:
		return backend.Errorf(backend.ErrUnavailable,
			"driver plugin %s did not complete the plugin handshake within %s and was killed; it must call backends.Serve at start%s",
			c.path, timeout, stderrNote)
	}
	return backend.Errorf(backend.ErrUnavailable, "driver plugin %s: %s%s", c.path, oneLine(err.Error()), stderrNote)
}

// seeLog says where a plugin's stderr went: the log of the process that launched it.
const seeLog = "its output is in berth's log (the CLI's STATE/berth.log, berth serve's log, or the logger of registry.WithLogger)"

// builtin reports whether the plugin is a built-in driver served by the berth binary
// (BuiltinCommand: `BERTH driver serve NAME`).
func (c *Client) builtin() bool {
	return len(c.args) == 3 && c.args[0] == "driver" && c.args[1] == "serve"
}

// command names the plugin for errors: its path, and for a built-in driver the
// command that serves it.
func (c *Client) command() string {
	if c.builtin() {
		return fmt.Sprintf("%q (%s %s)", c.args[2], c.path, strings.Join(c.args, " "))
	}
	return c.path
}

// oneLine joins the lines of s with "; ", so that an error stays one line.
func oneLine(s string) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, strings.TrimSuffix(l, ":"))
		}
	}
	return strings.Join(parts, "; ")
}

func (r *procRunner) selfExited() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.selfExit
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return clip(strings.Join(lines, " | "), 600)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Path returns the plugin executable's path.
func (c *Client) Path() string { return c.path }

// Pid returns the plugin process's pid.
func (c *Client) Pid() int { return c.runner.pid }

// Kill stops the plugin: go-plugin asks it to shut down (Serve then cancels
// in-flight calls, so drivers kill their execs' trees), waits up to 2 s, and
// kills its process group. It blocks until the process is gone and may be
// called more than once. In-flight calls return errors wrapping
// backend.ErrUnavailable.
func (c *Client) Kill() {
	// A plugin that has exited already was not stopped by the host: its calls'
	// errors say that it crashed (callErr), even when a supervisor kills it after
	// noticing the crash.
	if !c.runner.hasExited(0) {
		c.killed.Store(true)
	}
	c.killProcess()
}

// killProcess kills the plugin (go-plugin's Kill, which also removes its socket
// directory) and then lets go of the directory's lock.
func (c *Client) killProcess() {
	c.pc.Kill()
	if f := c.dirLock.Swap(nil); f != nil {
		f.Close()
	}
}

// Exited reports whether the plugin process has exited.
func (c *Client) Exited() bool {
	return c.runner.hasExited(0)
}

// Done returns a channel that is closed once the plugin process has exited, by
// Kill or otherwise (see Killed): a supervising host waits on it to restart a
// crashed plugin at once instead of at the next call.
func (c *Client) Done() <-chan struct{} { return c.runner.exited }

// Killed reports whether the host stopped the plugin (Kill or Close, while it
// ran), as opposed to the plugin exiting on its own or being killed from outside.
func (c *Client) Killed() bool { return c.killed.Load() }

// Close implements backend.TerminalBackend: it kills the plugin (see Kill).
// Sandboxes are not touched. It returns nil.
func (c *Client) Close() error {
	c.Kill()
	return nil
}

// callErr turns an RPC error into the error the caller sees.
func (c *Client) callErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if rpcerr.FromPeer(err) {
		return rpcerr.FromStatus(err)
	}
	if cerr := ctx.Err(); cerr != nil {
		return &wrapError{msg: fmt.Sprintf("driver plugin %s: %s: %v", c.path, op, cerr), err: cerr}
	}
	if c.runner.hasExited(crashGrace) {
		if c.killed.Load() {
			return backend.Errorf(backend.ErrUnavailable, "driver plugin %s was stopped during %s", c.path, op)
		}
		how := c.runner.exitText()
		if how != "" {
			how = " (" + how + ")"
		}
		return &crashError{msg: fmt.Sprintf("driver plugin %s crashed during %s%s: %v; its last log lines are in berth's log", c.path, op, how, rpcerr.FromStatus(err))}
	}
	return rpcerr.FromStatus(err)
}

// Info implements backend.TerminalBackend. Protocol is the negotiated version.
func (c *Client) Info(ctx context.Context) (backend.Info, error) {
	resp, err := c.api.Info(ctx, &pb.InfoRequest{})
	if err != nil {
		return backend.Info{}, c.callErr(ctx, "Info", err)
	}
	info := infoFromPB(resp.GetInfo())
	info.Protocol = c.pc.NegotiatedVersion()
	return info, nil
}

// ConfigSchema implements backend.Configurer.
func (c *Client) ConfigSchema(ctx context.Context) ([]backend.ConfigField, error) {
	resp, err := c.api.ConfigSchema(ctx, &pb.ConfigSchemaRequest{})
	if err != nil {
		return nil, c.callErr(ctx, "ConfigSchema", err)
	}
	return configFieldsFromPB(resp.GetFields()), nil
}

// Configure implements backend.Configurer.
func (c *Client) Configure(ctx context.Context, setup backend.DriverSetup) error {
	_, err := c.api.Configure(ctx, &pb.ConfigureRequest{Setup: setupToPB(setup)})
	return c.callErr(ctx, "Configure", err)
}

// Create implements backend.TerminalBackend.
func (c *Client) Create(ctx context.Context, req backend.CreateRequest) (backend.Sandbox, error) {
	resp, err := c.api.Create(ctx, createToPB(req))
	if err != nil {
		return backend.Sandbox{}, c.callErr(ctx, "Create", err)
	}
	return sandboxFromPB(resp.GetSandbox()), nil
}

// Inspect implements backend.TerminalBackend.
func (c *Client) Inspect(ctx context.Context, name string) (backend.Sandbox, error) {
	resp, err := c.api.Inspect(ctx, &pb.InspectRequest{Name: name})
	if err != nil {
		return backend.Sandbox{}, c.callErr(ctx, "Inspect", err)
	}
	return sandboxFromPB(resp.GetSandbox()), nil
}

// List implements backend.TerminalBackend.
func (c *Client) List(ctx context.Context, filter map[string]string) ([]backend.Sandbox, error) {
	resp, err := c.api.List(ctx, &pb.ListRequest{Filter: filter})
	if err != nil {
		return nil, c.callErr(ctx, "List", err)
	}
	return sandboxesFromPB(resp.GetSandboxes()), nil
}

// Stop implements backend.TerminalBackend.
func (c *Client) Stop(ctx context.Context, name string, grace time.Duration) error {
	_, err := c.api.Stop(ctx, &pb.StopRequest{Name: name, GraceNs: int64(grace)})
	return c.callErr(ctx, "Stop", err)
}

// Remove implements backend.TerminalBackend.
func (c *Client) Remove(ctx context.Context, name string) error {
	_, err := c.api.Remove(ctx, &pb.RemoveRequest{Name: name})
	return c.callErr(ctx, "Remove", err)
}

// Validate implements backend.Validator.
func (c *Client) Validate(ctx context.Context, spec backend.SandboxSpec) error {
	_, err := c.api.Validate(ctx, &pb.ValidateRequest{Spec: specToPB(spec)})
	return c.callErr(ctx, "Validate", err)
}

// DialAgent implements backend.AgentDialer: the plugin dials the sandbox's agent
// and forwards the bytes of the returned connection through a DialAgent stream.
// Closing the connection ends the stream (and the plugin's connection); CloseWrite
// ends the host's half only. Deadlines are not supported (SetDeadline and friends
// return an error); cancel ctx, or close the connection, to end a blocked call.
func (c *Client) DialAgent(ctx context.Context, name string) (net.Conn, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := c.api.DialAgent(sctx)
	if err != nil {
		cancel()
		return nil, c.callErr(ctx, "DialAgent", err)
	}
	if err := stream.Send(&pb.AgentData{Name: name}); err != nil {
		if errors.Is(err, io.EOF) {
			_, err = stream.Recv()
		}
		cancel()
		return nil, c.callErr(ctx, "DialAgent", err)
	}
	// An error of the plugin's dial ends the stream: the first Read returns it,
	// with its kind.
	return &streamConn{stream: stream, ctx: sctx, cancel: cancel, name: name, c: c}, nil
}

// streamConn is a net.Conn over a DialAgent stream.
type streamConn struct {
	stream pb.Driver_DialAgentClient
	ctx    context.Context // the stream's; done once Close has run
	cancel context.CancelFunc
	name   string
	c      *Client

	// rmu is held by whoever receives from the stream: Read, or Write when it
	// learns how the stream ended (endStatus).
	rmu sync.Mutex
	buf []byte
	end error // how the stream ended (io.EOF or its status), once received

	wmu       sync.Mutex
	closeOnce sync.Once
}

func (s *streamConn) Read(p []byte) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for len(s.buf) == 0 {
		if s.end != nil {
			return 0, s.streamErr(s.end, io.EOF)
		}
		m, err := s.stream.Recv()
		if err != nil {
			s.end = err
			return 0, s.streamErr(err, io.EOF)
		}
		s.buf = m.GetData()
	}
	n := copy(p, s.buf)
	s.buf = s.buf[n:]
	return n, nil
}

func (s *streamConn) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	n := 0
	for n < len(p) {
		end := min(n+ChunkSize, len(p))
		if err := s.stream.Send(&pb.AgentData{Data: append([]byte(nil), p[n:end]...)}); err != nil {
			if errors.Is(err, io.EOF) {
				err = s.endStatus()
			}
			return n, s.streamErr(err, io.ErrClosedPipe)
		}
		n = end
	}
	return n, nil
}

// endStatus is called when Send says the stream has ended (io.EOF): gRPC gives the
// status it ended with (the plugin's dial that failed, with its kind: a sandbox
// removed, not running) only to Recv. Unless a Read is receiving (it returns that
// status itself), it receives to the end, keeping the data on the way for Read,
// and returns the status; io.EOF for a stream that ended cleanly or while a Read
// receives. Without it a write that came first (berth's handshake) lost the
// dial's kind to a race: "read/write on closed pipe", unavailable, instead of not
// found.
func (s *streamConn) endStatus() error {
	if !s.rmu.TryLock() {
		return io.EOF
	}
	defer s.rmu.Unlock()
	for s.end == nil {
		m, err := s.stream.Recv()
		if err != nil {
			s.end = err
			break
		}
		s.buf = append(s.buf, m.GetData()...)
	}
	return s.end
}

// streamErr is what Read and Write return for the stream's err: net.ErrClosed once
// Close has run (the stream's cancellation, not a crash: no wait for the plugin to
// exit), eof for the stream's end, otherwise the call's error (callErr: a crashed plugin is
// said so).
func (s *streamConn) streamErr(err, eof error) error {
	switch {
	case s.ctx.Err() != nil:
		return net.ErrClosed
	case errors.Is(err, io.EOF):
		return eof
	}
	return s.c.callErr(context.Background(), "DialAgent", err)
}

// CloseWrite ends the host's half of the stream.
func (s *streamConn) CloseWrite() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.stream.CloseSend()
}

func (s *streamConn) Close() error {
	s.closeOnce.Do(s.cancel)
	return nil
}

type streamAddr string

func (a streamAddr) Network() string { return "berth-dial-agent" }
func (a streamAddr) String() string  { return string(a) }

func (s *streamConn) LocalAddr() net.Addr  { return streamAddr("host") }
func (s *streamConn) RemoteAddr() net.Addr { return streamAddr("agent of " + s.name) }

var errNoDeadline = errors.New("a DialAgent stream has no deadlines; cancel or close it instead")

func (s *streamConn) SetDeadline(time.Time) error      { return errNoDeadline }
func (s *streamConn) SetReadDeadline(time.Time) error  { return errNoDeadline }
func (s *streamConn) SetWriteDeadline(time.Time) error { return errNoDeadline }

// CopyIn implements backend.Copier: r is sent in ChunkSize messages as the
// plugin consumes it. A read error from r abandons the copy and is returned.
func (c *Client) CopyIn(ctx context.Context, name, dir string, r io.Reader) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.api.CopyIn(sctx)
	if err != nil {
		return c.callErr(ctx, "CopyIn", err)
	}
	if err := stream.Send(&pb.CopyInRequest{Name: name, Dir: dir}); err != nil && !errors.Is(err, io.EOF) {
		return c.callErr(ctx, "CopyIn", err)
	}
	if err := sendAll(r, func(b []byte) error { return stream.Send(&pb.CopyInRequest{Data: b}) }); err != nil {
		var rerr readError
		if errors.As(err, &rerr) {
			return fmt.Errorf("copy into sandbox %s: reading the tar stream: %w", name, rerr.err)
		}
	}
	_, err = stream.CloseAndRecv()
	return c.callErr(ctx, "CopyIn", err)
}

// CopyOut implements backend.Copier: the tar stream is written to w as it
// comes; a w that blocks holds the plugin back.
func (c *Client) CopyOut(ctx context.Context, name, path string, w io.Writer) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.api.CopyOut(sctx, &pb.CopyOutRequest{Name: name, Path: path})
	if err != nil {
		return c.callErr(ctx, "CopyOut", err)
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return c.callErr(ctx, "CopyOut", err)
		}
		if _, err := w.Write(m.GetData()); err != nil {
			return fmt.Errorf("copy out of sandbox %s: writing the tar stream: %w", name, err)
		}
	}
}

// PullImage implements backend.ImagePuller: progress is called for each event,
// from the calling goroutine.
func (c *Client) PullImage(ctx context.Context, ref string, policy backend.PullPolicy, progress func(backend.PullProgress)) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.api.PullImage(sctx, &pb.PullImageRequest{Ref: ref, Policy: string(policy)})
	if err != nil {
		return c.callErr(ctx, "PullImage", err)
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return c.callErr(ctx, "PullImage", err)
		}
		if progress != nil {
			progress(progressFromPB(m))
		}
	}
}

// ImportImage implements backend.ImageImporter: r is sent in ChunkSize
// messages.
func (c *Client) ImportImage(ctx context.Context, r io.Reader) ([]string, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.api.ImportImage(sctx)
	if err != nil {
		return nil, c.callErr(ctx, "ImportImage", err)
	}
	if err := sendAll(r, func(b []byte) error { return stream.Send(&pb.ImportImageRequest{Data: b}) }); err != nil {
		var rerr readError
		if errors.As(err, &rerr) {
			return nil, fmt.Errorf("import image: reading the archive: %w", rerr.err)
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, c.callErr(ctx, "ImportImage", err)
	}
	return nilIfEmpty(resp.GetRefs()), nil
}

// readError marks an error of the reader in sendAll.
type readError struct{ err error }

func (e readError) Error() string { return e.err.Error() }

// sendAll sends r in ChunkSize pieces. A send error (the server ended the
// stream; its status comes from CloseAndRecv) stops it quietly; a read error is
// returned as readError.
func sendAll(r io.Reader, send func([]byte) error) error {
	buf := make([]byte, ChunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := send(buf[:n]); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return readError{err}
		}
	}
}

// CancelGrace is how long, after an exec's context is cancelled, the host waits
// for the plugin to report the result (Canceled set, sent once the driver has
// killed the tree) before it drops the stream and returns a Canceled result
// without that confirmation.
const CancelGrace = 5 * time.Second

// cancelSendWait is how long a cancelled exec waits for a Write in progress
// before it drops the stream instead of sending the cancel message.
const cancelSendWait = 100 * time.Millisecond

// Exec implements backend.TerminalBackend over one bidirectional stream (see
// driver.proto). It returns once the plugin reports the process started.
// Output is written to req.Stdout and req.Stderr by one goroutine, in order;
// while a writer blocks, nothing more is read from the stream, so the process
// stops after at most MaxBufferedBytes of this bridge's buffering plus the
// driver's. Cancelling ctx asks the plugin to cancel the exec; Wait then
// returns the driver's result with Canceled set (or, after CancelGrace without
// one, a Canceled result of its own).
func (c *Client) Exec(ctx context.Context, name string, req backend.ExecRequest) (backend.Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The stream outlives ctx on purpose: a cancel is sent as a message, so the
	// result still arrives after the driver has killed the tree.
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := c.api.Exec(sctx)
	if err != nil {
		scancel()
		return nil, c.callErr(ctx, "Exec", err)
	}
	stopEarly := context.AfterFunc(ctx, scancel)
	fail := func(err error) (backend.Process, error) {
		stopEarly()
		scancel()
		if cerr := ctx.Err(); cerr != nil {
			return nil, &wrapError{msg: fmt.Sprintf("exec in sandbox %s: %v", name, cerr), err: cerr}
		}
		return nil, c.callErr(ctx, "Exec", err)
	}
	if err := stream.Send(&pb.ExecIn{Msg: &pb.ExecIn_Setup{Setup: execSetupToPB(name, req)}}); err != nil {
		if errors.Is(err, io.EOF) {
			_, err = stream.Recv() // the status that ended the stream
		}
		return fail(err)
	}
	p := &process{
		c:       c,
		name:    name,
		req:     req,
		stream:  stream,
		ctx:     ctx,
		scancel: scancel,
		stdout:  req.Stdout,
		stderr:  req.Stderr,
		sendSem: make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	if p.stdout == nil {
		p.stdout = io.Discard
	}
	if p.stderr == nil {
		p.stderr = io.Discard
	}
	// A driver may write output before its Exec returns (the reason for a 127,
	// say); it comes before started and is written here, in order.
	for {
		m, err := stream.Recv()
		if err != nil {
			return fail(err)
		}
		if m.GetStarted() != nil {
			break
		}
		if !p.output(m) {
			return fail(backend.Errorf(backend.ErrUnavailable, "driver plugin %s: exec stream sent %T before started", c.path, m.GetMsg()))
		}
	}
	if !stopEarly() {
		// ctx ended while starting: the stream is cancelled, so the plugin
		// cancels the exec; there is no result to report.
		scancel()
		return nil, &wrapError{msg: fmt.Sprintf("exec in sandbox %s: %v", name, ctx.Err()), err: ctx.Err()}
	}

	p.stopCancel = context.AfterFunc(ctx, p.cancel)
	go p.receive()
	return p, nil
}

// process is the host's backend.Process for one exec stream.
type process struct {
	c       *Client
	name    string
	req     backend.ExecRequest
	stream  pb.Driver_ExecClient
	ctx     context.Context
	scancel context.CancelFunc

	// sendSem (capacity 1) serialises sends; a channel so that cancel can give
	// up waiting for it.
	sendSem     chan struct{}
	stdinClosed bool
	stopCancel  func() bool
	dropped     atomic.Bool // cancel dropped the stream: Wait reports Canceled

	// stdout and stderr are written only by Exec and then by receive.
	stdout, stderr io.Writer

	done   chan struct{}
	result backend.ExecResult
	err    error
}

// send sends one message; sends are applied in call order. Once the exec has
// ended, it fails at once.
func (p *process) send(m *pb.ExecIn) error {
	select {
	case <-p.done:
		return p.endedErr()
	default:
	}
	err := p.stream.Send(m)
	if err == nil {
		return nil
	}
	// The stream has ended; receive says how, unless it is stuck in a writer.
	select {
	case <-p.done:
		return p.endedErr()
	case <-time.After(crashGrace):
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("exec in sandbox %s: the process has finished: %w", p.name, io.ErrClosedPipe)
	}
	return p.c.callErr(p.ctx, "Exec", err)
}

// endedErr is the error of a send after the exec ended: Wait's error, or
// io.ErrClosedPipe.
func (p *process) endedErr() error {
	if p.err != nil {
		return p.err
	}
	return fmt.Errorf("exec in sandbox %s: the process has finished: %w", p.name, io.ErrClosedPipe)
}

// Write implements backend.Process: b is sent in ChunkSize messages; it blocks
// while the plugin does not take more (flow control).
func (p *process) Write(b []byte) (int, error) {
	if !p.req.Stdin {
		return 0, backend.Errorf(backend.ErrInvalid, "exec in sandbox %s: no stdin (ExecRequest.Stdin is false)", p.name)
	}
	p.sendSem <- struct{}{}
	defer func() { <-p.sendSem }()
	if p.stdinClosed {
		return 0, fmt.Errorf("exec in sandbox %s: write after CloseStdin: %w", p.name, io.ErrClosedPipe)
	}
	n := 0
	for n < len(b) {
		chunk := b[n:min(len(b), n+ChunkSize)]
		if err := p.send(&pb.ExecIn{Msg: &pb.ExecIn_Stdin{Stdin: chunk}}); err != nil {
			return n, err
		}
		n += len(chunk)
	}
	return n, nil
}

// CloseStdin implements backend.Process.
func (p *process) CloseStdin() error {
	p.sendSem <- struct{}{}
	defer func() { <-p.sendSem }()
	if p.stdinClosed {
		return nil
	}
	p.stdinClosed = true
	if !p.req.Stdin {
		return nil
	}
	return p.send(&pb.ExecIn{Msg: &pb.ExecIn_CloseStdin{CloseStdin: true}})
}

// Resize implements backend.Process.
func (p *process) Resize(size backend.WindowSize) error {
	if !p.req.TTY {
		return backend.Errorf(backend.ErrInvalid, "exec in sandbox %s: resize of an exec without a TTY", p.name)
	}
	p.sendSem <- struct{}{}
	defer func() { <-p.sendSem }()
	return p.send(&pb.ExecIn{Msg: &pb.ExecIn_Resize{Resize: sizeToPB(size)}})
}

// Signal implements backend.Process.
func (p *process) Signal(sig int) error {
	if sig <= 0 || sig > 64 {
		return backend.Errorf(backend.ErrInvalid, "exec in sandbox %s: signal %d is not a Linux signal number", p.name, sig)
	}
	p.sendSem <- struct{}{}
	defer func() { <-p.sendSem }()
	return p.send(&pb.ExecIn{Msg: &pb.ExecIn_Signal{Signal: int32(sig)}})
}

// Wait implements backend.Process.
func (p *process) Wait() (backend.ExecResult, error) {
	<-p.done
	return p.result, p.err
}

// cancel runs when the exec's context ends: it asks the plugin to cancel, and
// drops the stream if no result comes within CancelGrace.
func (p *process) cancel() {
	timer := time.AfterFunc(CancelGrace, func() {
		p.dropped.Store(true)
		p.c.logger.Warn("driver plugin did not confirm a cancelled exec; dropping its stream", "path", p.c.path, "sandbox", p.name, "grace", CancelGrace)
		p.scancel()
	})
	go func() {
		<-p.done
		timer.Stop()
	}()
	select {
	case p.sendSem <- struct{}{}:
		_ = p.stream.Send(&pb.ExecIn{Msg: &pb.ExecIn_Cancel{Cancel: true}})
		<-p.sendSem
	case <-time.After(cancelSendWait):
		// A Write is stuck (the process does not read its stdin, so the
		// plugin does not read the stream): drop the stream instead; the
		// plugin then cancels the exec without being able to report it.
		p.dropped.Store(true)
		p.scancel()
	}
}

// receive is the one goroutine that reads the stream and writes the output.
func (p *process) receive() {
	defer close(p.done)
	defer p.scancel()
	defer p.stopCancel()
	var haveResult bool
	for {
		m, err := p.stream.Recv()
		if err != nil {
			switch {
			case errors.Is(err, io.EOF) && haveResult:
			case errors.Is(err, io.EOF):
				p.err = backend.Errorf(backend.ErrUnavailable, "driver plugin %s ended the exec stream without a result", p.c.path)
			case p.dropped.Load():
				p.result = backend.ExecResult{Canceled: true}
			default:
				p.err = p.c.callErr(context.WithoutCancel(p.ctx), "Exec", err)
			}
			return
		}
		if r := m.GetResult(); r != nil {
			p.result = resultFromPB(r)
			haveResult = true
			continue
		}
		p.output(m)
	}
}

// output writes a stdout or stderr message to its writer and reports whether m
// was one. A writer that fails is replaced by io.Discard, so the exec goes on.
func (p *process) output(m *pb.ExecOut) bool {
	switch msg := m.GetMsg().(type) {
	case *pb.ExecOut_Stdout:
		if _, err := p.stdout.Write(msg.Stdout); err != nil {
			p.c.logger.Debug("exec stdout writer failed; discarding the rest", "sandbox", p.name, "error", err)
			p.stdout = io.Discard
		}
	case *pb.ExecOut_Stderr:
		if _, err := p.stderr.Write(msg.Stderr); err != nil {
			p.c.logger.Debug("exec stderr writer failed; discarding the rest", "sandbox", p.name, "error", err)
			p.stderr = io.Discard
		}
	default:
		return false
	}
	return true
}
