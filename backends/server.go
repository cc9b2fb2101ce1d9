package backends

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/berth-sh/berth/backend"
	pb "github.com/berth-sh/berth/backends/internal/driverpb"
	"github.com/berth-sh/berth/internal/rpcerr"
)

// DrainTimeout bounds how long Serve waits, when its host has gone or asked it
// to stop, for in-flight calls to return after their contexts were cancelled
// (time for a driver to kill its execs' process trees), before it exits. It is
// below go-plugin's own 2 s grace after which a host kills the plugin.
const DrainTimeout = 1500 * time.Millisecond

// hostPollInterval is how often Serve checks getppid, the backup for the
// parent-death signal (which Linux ties to the host thread that forked us).
const hostPollInterval = 200 * time.Millisecond

// deathSignal is the parent-death signal Serve asks for. It is not SIGTERM so
// that a spurious one (the forking host thread exited while the host lives on)
// can be told apart and ignored.
const deathSignal = unix.SIGUSR2

// Serve runs the calling process as a berth driver plugin that serves driver
// over go-plugin: protocol ProtocolVersion via VersionedPlugins, gRPC only,
// flow-control windows of WindowSize. Call it from main, first; it returns when
// the host has closed the plugin (Client.Kill), has died, or the process got
// SIGTERM, after cancelling every in-flight call, waiting up to DrainTimeout
// for them and closing driver. The caller should then exit.
//
// logger receives the plugin's logs; it should write go-hclog JSON to
// os.Stderr (the host parses the level from it). nil gives exactly that, at the
// level the host asked for (BERTH_DRIVER_LOG_LEVEL, default info). The process
// must never write to stdout: go-plugin reads the handshake there, and after it
// Serve points os.Stdout and os.Stderr at the host's log. Serve makes fd 0
// /dev/null. Run without a host (no handshake cookie in the environment),
// go-plugin prints a hint to stderr and exits with status 1.
//
// Host death: Serve sets PR_SET_PDEATHSIG and also polls getppid against the
// host pid that Launch passes in the environment (a pdeathsig follows the
// forking thread, not the process, and a host can die before Serve runs).
func Serve(driver backend.TerminalBackend, logger hclog.Logger) {
	if logger == nil {
		level := hclog.LevelFromString(os.Getenv(envLogLevel))
		if level == hclog.NoLevel {
			level = hclog.Info
		}
		logger = hclog.New(&hclog.LoggerOptions{
			Name:       "driver",
			Output:     os.Stderr,
			JSONFormat: true,
			Level:      level,
		})
	}
	stdinFromDevNull(logger)

	s := newServer(driver, logger)
	socketDir := os.Getenv(plugin.EnvUnixSocketDir)
	// Read here, not in watchHost's goroutine: go-plugin's start unsets the
	// variable (registered), and a goroutine that a loaded machine runs late
	// would find it gone, or find the host already dead and us reparented.
	parent := os.Getppid()
	host, _ := strconv.Atoi(os.Getenv(envHostPID))
	go s.watchHost(parent, host)

	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: pluginSets(s),
		GRPCServer:       s.newGRPCServer,
		Logger:           logger,
	})
	s.shutdown("the host closed the connection")
	if s.selfStop.Load() && socketDir != "" {
		// The host cannot remove go-plugin's socket directory any more; it is
		// empty now that the listener has removed its socket.
		_ = os.Remove(socketDir)
	}

	closed := make(chan error, 1)
	go func() { closed <- driver.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			logger.Warn("closing the driver", "error", err)
		}
	case <-time.After(DrainTimeout):
		logger.Warn("closing the driver did not finish in time", "timeout", DrainTimeout)
	}
}

// stdinFromDevNull makes fd 0 /dev/null, whatever the host gave us.
func stdinFromDevNull(logger hclog.Logger) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		logger.Warn("opening /dev/null for stdin", "error", err)
		return
	}
	if err := unix.Dup3(int(f.Fd()), 0, 0); err != nil {
		logger.Warn("replacing stdin with /dev/null", "error", err)
	}
	_ = f.Close()
	// os.Stdin stays: it is fd 0, which now is /dev/null.
}

// server implements pb.DriverServer over a backend.TerminalBackend.
type server struct {
	pb.UnimplementedDriverServer

	driver backend.TerminalBackend
	logger hclog.Logger

	// base is cancelled when the plugin shuts down; every call's context is
	// cancelled with it.
	base       context.Context
	cancelBase context.CancelFunc

	// calls counts in-flight RPCs; idle, when set, is closed once it is zero.
	// (Not a WaitGroup: calls may still start while shutdown waits.)
	callsMu sync.Mutex
	calls   int
	idle    chan struct{}

	mu       sync.Mutex
	grpc     *grpc.Server
	stopping bool
	stopOnce sync.Once
	selfStop atomic.Bool // stopping because the host died or SIGTERM, not by the host's request
}

func newServer(driver backend.TerminalBackend, logger hclog.Logger) *server {
	base, cancel := context.WithCancel(context.Background())
	return &server{driver: driver, logger: logger, base: base, cancelBase: cancel}
}

// newGRPCServer is go-plugin's GRPCServer factory: explicit windows.
func (s *server) newGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	opts = append(opts,
		grpc.InitialWindowSize(WindowSize),
		grpc.InitialConnWindowSize(WindowSize),
	)
	opts = append(opts, rpcerr.ServerOptions()...)
	g := grpc.NewServer(opts...)
	s.mu.Lock()
	s.grpc = g
	stopping := s.stopping
	s.mu.Unlock()
	if stopping {
		go g.Stop()
	}
	return g
}

// registered runs once go-plugin has read its environment: the handshake
// variables are not passed on to the processes the driver starts.
func (s *server) registered() {
	for _, k := range []string{Handshake.MagicCookieKey, "PLUGIN_MIN_PORT", "PLUGIN_MAX_PORT", "PLUGIN_PROTOCOL_VERSIONS", envHostPID, envLogLevel} {
		_ = os.Unsetenv(k)
	}
}

// watchHost notices the host's death (parent-death signal, getppid poll) and
// SIGTERM, and shuts the plugin down. hostPID is the parent Serve started with;
// v is the host's pid that Launch passed (0 when none).
func (s *server) watchHost(hostPID, v int) {
	// The parent-death signal is an attribute of the thread that sets it; keep
	// that thread for as long as we watch.
	runtime.LockOSThread()
	if v > 0 && v != hostPID {
		if !liveAncestor(v) {
			// Gone, a zombie not yet reaped (kill(v, 0) still succeeds then), or a
			// reused pid: our parent is then init or a subreaper, not a wrapper of v.
			s.hostGone("the host process exited before the plugin started")
			return
		}
		// Something (a wrapper script) sits between host and plugin: watch
		// our own parent, which is what the parent-death signal follows too.
		s.logger.Debug("parent is not the host; watching the parent", "host_pid", v, "parent_pid", hostPID)
	}
	// SIGPIPE is caught too: once the host is gone, a log line written to the
	// broken stderr pipe would otherwise kill the plugin (Go exits on EPIPE for
	// fds 1 and 2 unless SIGPIPE is notified) before it has cancelled its execs.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, deathSignal, syscall.SIGTERM, syscall.SIGPIPE)
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(deathSignal), 0, 0, 0); err != nil {
		s.logger.Warn("setting the parent-death signal", "error", err)
	}
	tick := time.NewTicker(hostPollInterval)
	defer tick.Stop()
	for {
		if os.Getppid() != hostPID {
			s.hostGone("the host process exited")
			return
		}
		s.logger.Trace("host check: parent alive", "parent_pid", hostPID)
		select {
		case sig := <-sigs:
			if sig == syscall.SIGTERM {
				s.hostGone("got SIGTERM")
				return
			}
			// deathSignal and SIGPIPE: checked against getppid at the top of the
			// loop; a deathSignal while the host lives is the forking thread's
			// exit, a SIGPIPE then is some other broken pipe.
		case <-tick.C:
		case <-s.base.Done():
			return
		}
	}
}

// maxAncestry bounds the walk up the process tree in liveAncestor: the host, a
// wrapper script or two, and their shells.
const maxAncestry = 8

// liveAncestor reports whether pid is a running (not zombie) ancestor of this
// process, read from /proc/PID/stat.
func liveAncestor(pid int) bool {
	p := os.Getppid()
	for i := 0; i < maxAncestry && p > 1; i++ {
		state, parent, ok := procStat(p)
		if !ok {
			return false
		}
		if p == pid {
			return state != 'Z' && state != 'X'
		}
		p = parent
	}
	return false
}

// procStat returns the state and parent pid of process pid from /proc/PID/stat.
func procStat(pid int) (state byte, ppid int, ok bool) {
	f := statFields(pid)
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err := strconv.Atoi(string(f[1]))
	return f[0][0], ppid, err == nil
}

// hostGone shuts down and stops the gRPC server, which makes plugin.Serve, and
// so Serve, return.
func (s *server) hostGone(reason string) {
	s.selfStop.Store(true)
	s.shutdown(reason)
	s.mu.Lock()
	s.stopping = true
	g := s.grpc
	s.mu.Unlock()
	if g != nil {
		g.Stop()
	}
}

// shutdown cancels every in-flight call and waits up to DrainTimeout for them.
func (s *server) shutdown(reason string) {
	s.stopOnce.Do(func() {
		s.logger.Info("driver plugin stopping; cancelling in-flight calls", "reason", reason)
		s.cancelBase()
		s.callsMu.Lock()
		done := make(chan struct{})
		if s.calls == 0 {
			close(done)
		} else {
			s.idle = done
		}
		s.callsMu.Unlock()
		select {
		case <-done:
		case <-time.After(DrainTimeout):
			s.logger.Warn("in-flight calls did not finish in time", "timeout", DrainTimeout)
		}
	})
}

// call tracks one RPC and returns its context, cancelled also when the plugin
// shuts down. end must be called when the RPC returns.
func (s *server) call(ctx context.Context) (context.Context, func()) {
	s.callsMu.Lock()
	s.calls++
	s.callsMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.base, cancel)
	return ctx, func() {
		stop()
		cancel()
		s.callsMu.Lock()
		s.calls--
		if s.calls == 0 && s.idle != nil {
			close(s.idle)
			s.idle = nil
		}
		s.callsMu.Unlock()
	}
}

func unsupported(what string) error {
	return backend.Errorf(backend.ErrUnsupported, "driver does not implement %s", what)
}

// Info implements pb.DriverServer.
func (s *server) Info(ctx context.Context, _ *pb.InfoRequest) (*pb.InfoResponse, error) {
	ctx, end := s.call(ctx)
	defer end()
	info, err := backend.InfoOf(ctx, s.driver)
	if err != nil {
		return nil, err
	}
	if len(info.ProtocolVersions) == 0 {
		info.ProtocolVersions = []int{ProtocolVersion}
	}
	return &pb.InfoResponse{Info: infoToPB(info)}, nil
}

// ConfigSchema implements pb.DriverServer.
func (s *server) ConfigSchema(ctx context.Context, _ *pb.ConfigSchemaRequest) (*pb.ConfigSchemaResponse, error) {
	ctx, end := s.call(ctx)
	defer end()
	c, ok := s.driver.(backend.Configurer)
	if !ok {
		return nil, unsupported("ConfigSchema (backend.Configurer)")
	}
	fields, err := c.ConfigSchema(ctx)
	if err != nil {
		return nil, err
	}
	return &pb.ConfigSchemaResponse{Fields: configFieldsToPB(fields)}, nil
}

// Configure implements pb.DriverServer.
func (s *server) Configure(ctx context.Context, req *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	ctx, end := s.call(ctx)
	defer end()
	c, ok := s.driver.(backend.Configurer)
	if !ok {
		return nil, unsupported("Configure (backend.Configurer)")
	}
	if err := c.Configure(ctx, setupFromPB(req.GetSetup())); err != nil {
		return nil, err
	}
	return &pb.ConfigureResponse{}, nil
}

// Create implements pb.DriverServer.
func (s *server) Create(ctx context.Context, req *pb.CreateRequest) (*pb.CreateResponse, error) {
	ctx, end := s.call(ctx)
	defer end()
	sb, err := s.driver.Create(ctx, createFromPB(req))
	if err != nil {
		return nil, err
	}
	return &pb.CreateResponse{Sandbox: sandboxToPB(sb)}, nil
}

// Inspect implements pb.DriverServer.
func (s *server) Inspect(ctx context.Context, req *pb.InspectRequest) (*pb.InspectResponse, error) {
	ctx, end := s.call(ctx)
	defer end()
	sb, err := s.driver.Inspect(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return &pb.InspectResponse{Sandbox: sandboxToPB(sb)}, nil
}

// List implements pb.DriverServer.
func (s *server) List(ctx context.Context, req *pb.ListRequest) (*pb.ListResponse, error) {
	ctx, end := s.call(ctx)
	defer end()
	sbs, err := s.driver.List(ctx, req.GetFilter())
	if err != nil {
		return nil, err
	}
	return &pb.ListResponse{Sandboxes: sandboxesToPB(sbs)}, nil
}

// Stop implements pb.DriverServer.
func (s *server) Stop(ctx context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	ctx, end := s.call(ctx)
	defer end()
	if err := s.driver.Stop(ctx, req.GetName(), time.Duration(req.GetGraceNs())); err != nil {
		return nil, err
	}
	return &pb.StopResponse{}, nil
}

// Remove implements pb.DriverServer.
func (s *server) Remove(ctx context.Context, req *pb.RemoveRequest) (*pb.RemoveResponse, error) {
	ctx, end := s.call(ctx)
	defer end()
	if err := s.driver.Remove(ctx, req.GetName()); err != nil {
		return nil, err
	}
	return &pb.RemoveResponse{}, nil
}

// Exec implements pb.DriverServer for drivers that implement backend.Execer: see
// driver.proto.
func (s *server) Exec(stream pb.Driver_ExecServer) error {
	ctx, end := s.call(stream.Context())
	defer end()
	ex, ok := s.driver.(backend.Execer)
	if !ok {
		return unsupported("Exec (backend.Execer; its sandboxes run berth's agent, which the host reaches itself)")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	setup := first.GetSetup()
	if setup == nil {
		return backend.Errorf(backend.ErrInvalid, "exec stream: the first message must be setup")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	out := &execOut{stream: stream}
	name, req := execSetupFromPB(setup)
	req.Stdout = &execWriter{out: out, stderr: false}
	req.Stderr = &execWriter{out: out, stderr: true}

	started := make(chan backend.Process, 1)
	go s.execInput(ctx, cancel, stream, started)

	proc, err := ex.Exec(ctx, name, req)
	if err != nil {
		close(started)
		return err
	}
	started <- proc
	if err := out.send(&pb.ExecOut{Msg: &pb.ExecOut_Started{Started: &pb.ExecStarted{}}}); err != nil {
		cancel()
		_, _ = proc.Wait()
		return err
	}
	res, err := proc.Wait()
	if err != nil {
		out.finish(nil)
		return err
	}
	return out.finish(&pb.ExecOut{Msg: &pb.ExecOut_Result{Result: resultToPB(res)}})
}

// execInput applies the host's messages to the process in order. A cancel
// message, or the stream breaking (host gone), cancels the exec's context.
func (s *server) execInput(ctx context.Context, cancel context.CancelFunc, stream pb.Driver_ExecServer, started <-chan backend.Process) {
	var proc backend.Process
	for {
		m, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				cancel()
			}
			return
		}
		if m.GetCancel() {
			cancel()
			continue
		}
		if proc == nil {
			select {
			case p, ok := <-started:
				if !ok {
					return
				}
				proc = p
			case <-ctx.Done():
				return
			}
		}
		var aerr error
		switch msg := m.GetMsg().(type) {
		case *pb.ExecIn_Stdin:
			_, aerr = proc.Write(msg.Stdin)
		case *pb.ExecIn_CloseStdin:
			aerr = proc.CloseStdin()
		case *pb.ExecIn_Resize:
			aerr = proc.Resize(sizeFromPB(msg.Resize))
		case *pb.ExecIn_Signal:
			aerr = proc.Signal(int(msg.Signal))
		default:
			aerr = fmt.Errorf("unexpected exec message %T", msg)
		}
		if aerr != nil {
			s.logger.Debug("exec input", "error", aerr)
		}
	}
}

// execOut serialises sends on an exec stream; after finish, output is dropped.
type execOut struct {
	stream pb.Driver_ExecServer
	mu     sync.Mutex
	done   bool
}

func (o *execOut) send(m *pb.ExecOut) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return nil
	}
	return o.stream.Send(m)
}

// finish sends the last message (if any) and drops everything written later.
func (o *execOut) finish(m *pb.ExecOut) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = true
	if m == nil {
		return nil
	}
	return o.stream.Send(m)
}

// execWriter is ExecRequest.Stdout or Stderr in the plugin: each Write is sent
// in ChunkSize messages and blocks while the stream's window is full.
type execWriter struct {
	out    *execOut
	stderr bool
}

func (w *execWriter) Write(p []byte) (int, error) {
	w.out.mu.Lock()
	defer w.out.mu.Unlock()
	if w.out.done {
		return len(p), nil
	}
	n := 0
	for n < len(p) {
		c := p[n:min(len(p), n+ChunkSize)]
		m := &pb.ExecOut{}
		if w.stderr {
			m.Msg = &pb.ExecOut_Stderr{Stderr: c}
		} else {
			m.Msg = &pb.ExecOut_Stdout{Stdout: c}
		}
		if err := w.out.stream.Send(m); err != nil {
			return n, err
		}
		n += len(c)
	}
	return n, nil
}

// DialAgent implements pb.DriverServer for drivers that implement
// backend.AgentDialer: it dials the sandbox's agent and forwards bytes both ways
// until the agent's side ends (then the call ends) or the host's side does (then
// the connection's write side is closed, or the connection). The stream's gRPC
// windows bound what is buffered, as for exec output.
func (s *server) DialAgent(stream pb.Driver_DialAgentServer) error {
	ctx, end := s.call(stream.Context())
	defer end()
	d, ok := s.driver.(backend.AgentDialer)
	if !ok {
		return unsupported("DialAgent (backend.AgentDialer)")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if first.GetName() == "" {
		return backend.Errorf(backend.ErrInvalid, "dial agent: the first message must name the sandbox")
	}
	conn, err := d.DialAgent(ctx, first.GetName())
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	go func() {
		data := first.GetData()
		for {
			if len(data) > 0 {
				if _, err := conn.Write(data); err != nil {
					conn.Close()
					return
				}
			}
			m, err := stream.Recv()
			if err != nil {
				if cw, ok := conn.(interface{ CloseWrite() error }); ok && errors.Is(err, io.EOF) {
					cw.CloseWrite()
				} else {
					conn.Close()
				}
				return
			}
			data = m.GetData()
		}
	}()
	buf := make([]byte, ChunkSize)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if serr := stream.Send(&pb.AgentData{Data: append([]byte(nil), buf[:n]...)}); serr != nil {
				return serr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return backend.Errorf(backend.ErrUnavailable, "dial agent of sandbox %s: %w", first.GetName(), err)
		}
	}
}

// Validate implements pb.DriverServer for drivers that implement backend.Validator.
func (s *server) Validate(ctx context.Context, req *pb.ValidateRequest) (*pb.ValidateResponse, error) {
	ctx, end := s.call(ctx)
	defer end()
	v, ok := s.driver.(backend.Validator)
	if !ok {
		return nil, unsupported("Validate (backend.Validator)")
	}
	if err := v.Validate(ctx, specFromPB(req.GetSpec())); err != nil {
		return nil, err
	}
	return &pb.ValidateResponse{}, nil
}

// CopyIn implements pb.DriverServer.
func (s *server) CopyIn(stream pb.Driver_CopyInServer) error {
	ctx, end := s.call(stream.Context())
	defer end()
	cp, ok := s.driver.(backend.Copier)
	if !ok {
		return unsupported("CopyIn (backend.Copier)")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	r := recvReader(stream.Recv, first.GetData(), func(m *pb.CopyInRequest) []byte { return m.GetData() })
	err = cp.CopyIn(ctx, first.GetName(), first.GetDir(), r)
	r.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return err
	}
	return stream.SendAndClose(&pb.CopyInResponse{})
}

// CopyOut implements pb.DriverServer.
func (s *server) CopyOut(req *pb.CopyOutRequest, stream pb.Driver_CopyOutServer) error {
	ctx, end := s.call(stream.Context())
	defer end()
	cp, ok := s.driver.(backend.Copier)
	if !ok {
		return unsupported("CopyOut (backend.Copier)")
	}
	w := chunkWriter(func(b []byte) error { return stream.Send(&pb.CopyOutChunk{Data: b}) })
	if err := cp.CopyOut(ctx, req.GetName(), req.GetPath(), w); err != nil {
		return err
	}
	return nil
}

// PullImage implements pb.DriverServer.
func (s *server) PullImage(req *pb.PullImageRequest, stream pb.Driver_PullImageServer) error {
	ctx, end := s.call(stream.Context())
	defer end()
	pp, ok := s.driver.(backend.ImagePuller)
	if !ok {
		return unsupported("PullImage (backend.ImagePuller)")
	}
	var mu sync.Mutex
	progress := func(p backend.PullProgress) {
		mu.Lock()
		defer mu.Unlock()
		_ = stream.Send(progressToPB(p))
	}
	if err := pp.PullImage(ctx, req.GetRef(), backend.PullPolicy(req.GetPolicy()), progress); err != nil {
		return err
	}
	return nil
}

// ImportImage implements pb.DriverServer.
func (s *server) ImportImage(stream pb.Driver_ImportImageServer) error {
	ctx, end := s.call(stream.Context())
	defer end()
	im, ok := s.driver.(backend.ImageImporter)
	if !ok {
		return unsupported("ImportImage (backend.ImageImporter)")
	}
	r := recvReader(stream.Recv, nil, func(m *pb.ImportImageRequest) []byte { return m.GetData() })
	refs, err := im.ImportImage(ctx, r)
	r.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return err
	}
	return stream.SendAndClose(&pb.ImportImageResponse{Refs: refs})
}

// recvReader turns a client stream of data messages into a reader: first, then
// every later message's data, then EOF when the client closes its side.
func recvReader[M any](recv func() (M, error), first []byte, data func(M) []byte) *io.PipeReader {
	pr, pw := io.Pipe()
	go func() {
		if len(first) > 0 {
			if _, err := pw.Write(first); err != nil {
				return
			}
		}
		for {
			m, err := recv()
			if errors.Is(err, io.EOF) {
				_ = pw.Close()
				return
			}
			if err != nil {
				_ = pw.CloseWithError(err)
				return
			}
			if _, err := pw.Write(data(m)); err != nil {
				return
			}
		}
	}()
	return pr
}

// chunkWriter is an io.Writer that sends in ChunkSize pieces.
type chunkWriter func([]byte) error

func (f chunkWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := p[n:min(len(p), n+ChunkSize)]
		if err := f(c); err != nil {
			return n, err
		}
		n += len(c)
	}
	return n, nil
}
