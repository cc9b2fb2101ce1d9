package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/rpcerr"
)

// DialSocketDir returns the dialer of an agent whose socket is in dir (the sandbox's
// socket directory on the host). Every dial opens dir and then the socket with
// O_PATH|O_NOFOLLOW and connects through /proc/self/fd/N: no symbolic link planted
// in the directory is followed, and the path may be longer than the 108 bytes a
// socket address holds. Errors: no directory or no socket, or nothing listening
// (ErrUnavailable: the sandbox is stopped or gone); something other than a socket
// at the socket's name (ErrConflict: the sandbox replaced it, a link or a file, which
// a restart or a new sandbox mends).
func DialSocketDir(dir string) backend.Dialer {
	return func(ctx context.Context) (net.Conn, error) {
		dfd, err := unix.Open(dir, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "agent socket directory %s: %w", dir, err)
		}
		defer unix.Close(dfd)
		sfd, err := unix.Openat(dfd, backend.AgentSocketName, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "agent socket %s/%s: %w", dir, backend.AgentSocketName, err)
		}
		defer unix.Close(sfd)
		var st unix.Stat_t
		if err := unix.Fstat(sfd, &st); err != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "agent socket %s/%s: %w", dir, backend.AgentSocketName, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			what := "a file"
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFLNK:
				what = "a symbolic link"
			case unix.S_IFDIR:
				what = "a directory"
			}
			return nil, backend.Errorf(backend.ErrConflict, "agent socket %s/%s is %s, not a socket: something in the sandbox replaced it", dir, backend.AgentSocketName, what)
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", sfd))
		if err != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "connecting to agent socket %s/%s: %w", dir, backend.AgentSocketName, err)
		}
		return c, nil
	}
}

// DefaultHelloTimeout bounds connecting to an agent: the dial, berth's handshake and
// the Hello call together (see WithHelloTimeout).
const DefaultHelloTimeout = 10 * time.Second

// ClientOption configures NewClient.
type ClientOption func(*clientOptions)

type clientOptions struct {
	token        []byte
	tokenFile    string
	helloTimeout time.Duration
	versions     []int
}

// WithToken makes the client present token (see TokenFileName) in berth's handshake.
// Without a token the client presents none, which only an agent started without
// one accepts.
func WithToken(token []byte) ClientOption {
	return func(o *clientOptions) { o.token = append([]byte(nil), token...) }
}

// WithTokenFrom makes the client read the token of the agent directory dir
// (ReadToken) when it connects.
func WithTokenFrom(dir string) ClientOption { return func(o *clientOptions) { o.tokenFile = dir } }

// WithHelloTimeout bounds the dial, handshake and Hello of NewClient (default
// DefaultHelloTimeout; zero or negative keeps the default). A listener that accepts
// and never answers (a paused container, a process in the sandbox squatting on the
// socket) fails with ErrTimeout once it passes.
func WithHelloTimeout(d time.Duration) ClientOption {
	return func(o *clientOptions) {
		if d > 0 {
			o.helloTimeout = d
		}
	}
}

// withVersions makes the client offer versions instead of clientVersions (tests).
func withVersions(vs ...int) ClientOption { return func(o *clientOptions) { o.versions = vs } }

// Client is a connection to one agent. Its methods are safe for concurrent use.
type Client struct {
	conn     *grpc.ClientConn
	pre      *preDialed
	rpc      agentpb.AgentClient
	protocol int
	instance string
	pid      int
	oomWatch bool
	execUser string
}

// NewClient connects to the agent that dial reaches: the dial and berth's token
// handshake (WithToken, WithTokenFrom), whose answer carries the agent's answer to
// Hello, which negotiates the protocol (this client speaks ProtocolVersion and
// ProtocolVersion-1); an agent of a berth before that answer gets the Hello call.
// All of it within the hello timeout. Errors: the agent cannot be reached
// (ErrUnavailable: nothing listens, no socket), something that is not a socket sits
// at the socket's name or the agent refused the token (ErrConflict), the agent is of
// an older berth, speaks no common version or answers as no berth agent does
// (ErrUnsupported, naming both sides' versions), the agent accepted but did not
// answer in time (ErrTimeout). Close the Client when done.
//
// The connection made here is the one the client's calls use (gRPC's HTTP/2 starts
// on it in the background; a connection that is lost later is made again the same
// way), so a client costs one round trip to the agent before its first call.
func NewClient(ctx context.Context, dial backend.Dialer, opts ...ClientOption) (*Client, error) {
	o := clientOptions{helloTimeout: DefaultHelloTimeout, versions: clientVersions()}
	for _, f := range opts {
		f(&o)
	}
	if dial == nil {
		return nil, backend.Errorf(backend.ErrInvalid, "agent client: no dialer")
	}
	token := o.token
	if o.tokenFile != "" && token == nil {
		t, err := ReadToken(o.tokenFile)
		if err != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "%w", err)
		}
		token = t
	}
	hctx, cancel := context.WithTimeout(ctx, o.helloTimeout)
	defer cancel()
	first, hello, err := connect(hctx, dial, token, o.versions)
	if err != nil {
		if ctx.Err() == nil && errors.Is(hctx.Err(), context.DeadlineExceeded) {
			return nil, helloTimeout(o)
		}
		return nil, err
	}
	pre := &preDialed{conn: first, at: time.Now()}
	conn, err := grpc.NewClient("passthrough:///berth-agent",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if c := pre.take(); c != nil {
				return c, nil
			}
			c, _, err := connect(ctx, dial, token, o.versions)
			return c, err
		}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: o.helloTimeout}),
		grpc.WithInitialWindowSize(StreamWindow),
		grpc.WithInitialConnWindowSize(StreamWindow),
	)
	if err != nil {
		first.Close()
		return nil, backend.Errorf(backend.ErrInvalid, "agent client: %w", err)
	}
	// HTTP/2 starts on the connection now, in the background, rather than at the
	// first call: the agent's gRPC server holds a connection that has passed berth's
	// handshake but not started HTTP/2 as one still being set up, which its
	// shutdown waits for.
	conn.Connect()
	c := &Client{conn: conn, rpc: agentpb.NewAgentClient(conn), pre: pre}
	if hello == nil {
		if hello, err = c.callHello(ctx, hctx, o); err != nil {
			c.Close()
			return nil, err
		}
	}
	p := int(hello.Protocol)
	if p <= 0 || !slices.Contains(o.versions, p) {
		c.Close()
		if p == 0 && len(hello.Versions) > 0 {
			agentVersions := make([]int, len(hello.Versions))
			for i, v := range hello.Versions {
				agentVersions[i] = int(v)
			}
			_, err := pickProtocol(o.versions, agentVersions)
			return nil, backend.Errorf(backend.ErrUnsupported, "agent protocol: %w", err)
		}
		return nil, backend.Errorf(backend.ErrUnsupported, "agent protocol: the agent chose version %d, which this client (versions %v) does not speak", p, o.versions)
	}
	c.protocol, c.instance, c.pid = p, hello.Instance, int(hello.Pid)
	c.oomWatch, c.execUser = hello.OomWatch, hello.ExecUser
	return c, nil
}

// connect dials and makes berth's handshake (version 2; version 1 on a new
// connection when the agent knows only that), returning the connection to speak
// HTTP/2 on and the agent's Hello answer when its handshake answer carried one.
func connect(ctx context.Context, dial backend.Dialer, token []byte, versions []int) (net.Conn, *agentpb.HelloResponse, error) {
	for _, v1 := range []bool{false, true} {
		c, err := dial(ctx)
		if err != nil {
			return nil, nil, err
		}
		hc, hello, err := clientHandshake(ctx, c, token, versions, v1)
		if err == nil {
			return hc, hello, nil
		}
		c.Close()
		if !errors.Is(err, errOldHandshake) {
			return nil, nil, err
		}
	}
	return nil, nil, backend.Errorf(backend.ErrUnsupported, "the agent denied both versions of berth's handshake")
}

// callHello asks an agent that answered the handshake without its Hello answer (a
// berth before that answer) with the Hello call, bounded by hctx (the hello
// timeout within ctx).
func (c *Client) callHello(ctx, hctx context.Context, o clientOptions) (*agentpb.HelloResponse, error) {
	req := &agentpb.HelloRequest{}
	for _, v := range o.versions {
		req.Versions = append(req.Versions, int32(v))
	}
	resp, err := c.rpc.Hello(hctx, req)
	if err == nil {
		return resp, nil
	}
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("agent hello: %w", ctx.Err())
	case hctx.Err() != nil:
		return nil, helloTimeout(o)
	}
	err = wireErr("agent hello", err)
	if backend.KindOf(err) == nil {
		// An answer no berth agent gives: not protobuf, a status of no kind.
		err = backend.Errorf(backend.ErrUnsupported, "%w: that is not an answer of a berth agent of protocol %v; recreate the sandbox (berth exec --recreate) to give it this berth's agent", err, o.versions)
	}
	return nil, err
}

// helloTimeout is the error of an agent that accepted the connection and did not
// answer within the hello timeout.
func helloTimeout(o clientOptions) error {
	return backend.Errorf(backend.ErrTimeout, "the agent did not answer within %s (the hello timeout): a paused or overloaded sandbox, or something else listening on its socket", o.helloTimeout)
}

// preDialMaxAge is how long the connection NewClient made waits for the client's
// first call: an older one may have been closed by the agent meanwhile (gRPC's
// server gives a connection two minutes to start HTTP/2), so a new one is made.
const preDialMaxAge = 10 * time.Second

// preDialed holds the connection NewClient made until gRPC takes it for the client's
// first call.
type preDialed struct {
	mu   sync.Mutex
	conn net.Conn
	at   time.Time
}

// take returns the connection once, nil after that or when it is older than
// preDialMaxAge (it is closed then).
func (p *preDialed) take() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.conn
	p.conn = nil
	if c != nil && time.Since(p.at) > preDialMaxAge {
		c.Close()
		return nil
	}
	return c
}

// Connect connects to the agent of a sandbox whose agent files the host prepared
// (PrepareSandbox): the socket in files.SocketDir (DialSocketDir), with the token of
// files.Dir. Errors: those of NewClient.
func Connect(ctx context.Context, files backend.AgentFiles, opts ...ClientOption) (*Client, error) {
	opts = append([]ClientOption{WithTokenFrom(files.Dir)}, opts...)
	return NewClient(ctx, DialSocketDir(files.SocketDir), opts...)
}

// WaitReady calls NewClient until it succeeds or ctx is done, backing off from 5 ms
// to 200 ms between attempts, for agents that are still starting (containers). An
// error that waiting cannot mend (ErrConflict, ErrUnsupported, ErrInvalid) is
// returned at once. When ctx ends first, the error wraps ctx.Err() and the last
// connection error (ErrUnavailable).
func WaitReady(ctx context.Context, dial backend.Dialer, opts ...ClientOption) (*Client, error) {
	delay := 5 * time.Millisecond
	for {
		c, err := NewClient(ctx, dial, opts...)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, backend.ErrConflict) || errors.Is(err, backend.ErrUnsupported) || errors.Is(err, backend.ErrInvalid) {
			return nil, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			if !errors.Is(err, backend.ErrUnavailable) {
				err = backend.Errorf(backend.ErrUnavailable, "%w", err)
			}
			return nil, fmt.Errorf("agent did not become ready: %w (%w)", err, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// Protocol returns the negotiated protocol version.
func (c *Client) Protocol() int { return c.protocol }

// Instance returns the agent's instance id from Hello: random per agent process, so
// a reconnect that finds another instance reached a restarted agent.
func (c *Client) Instance() string { return c.instance }

// PID returns the agent's process id in its own PID namespace.
func (c *Client) PID() int { return c.pid }

// WatchesOOM reports whether the agent reports OOM kills (ExecResult.OOMKilled) from
// its cgroup's counter.
func (c *Client) WatchesOOM() bool { return c.oomWatch }

// ExecUser returns the agent's default exec user ("" for its own).
func (c *Client) ExecUser() string { return c.execUser }

// Close closes the connection. Execs still running on it lose their client, so the
// agent kills their process trees.
func (c *Client) Close() error {
	if pc := c.pre.take(); pc != nil {
		pc.Close()
	}
	return c.conn.Close()
}

// State returns the state of the client's connection (gRPC's connectivity state):
// Ready or Idle while it is usable, TransientFailure once the agent went away.
func (c *Client) State() connectivity.State { return c.conn.GetState() }

// wireErr turns a gRPC error from the agent into an error with its backend kind,
// prefixed with op, the agent's message shown as peerText. gRPC's own Unavailable
// (the connection broke) says the agent is unreachable; a cancelled or expired call
// wraps the context error.
func wireErr(op string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if ok && peerText(st.Message()) != st.Message() {
		p := st.Proto()
		p.Message = peerText(p.Message)
		err, st = status.ErrorProto(p), status.FromProto(p)
	}
	switch {
	case !ok:
		return fmt.Errorf("%s: %w", op, err)
	case rpcerr.FromPeer(err):
		return fmt.Errorf("%s: %w", op, rpcerr.FromStatus(err))
	case st.Code() == codes.Canceled:
		return fmt.Errorf("%s: %w", op, context.Canceled)
	case st.Code() == codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", op, context.DeadlineExceeded)
	case st.Code() == codes.Unavailable:
		return &connLostError{backend.Errorf(backend.ErrUnavailable, "%s: agent unreachable: %s", op, st.Message())}
	}
	return fmt.Errorf("%s: %w", op, rpcerr.FromStatus(err))
}

// peerText returns s, text from the agent, as an error shows it: quoted when it
// holds a control or format character, so that a hostile agent cannot drive the
// terminal through an error message.
func peerText(s string) string {
	for _, r := range s {
		if unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
			return strconv.Quote(s)
		}
	}
	return s
}

// connLostError is an error of a call whose connection to the agent broke (or could
// not be made again), as opposed to one the agent answered: ConnectionLost tells them
// apart.
type connLostError struct{ err error }

func (e *connLostError) Error() string { return e.err.Error() }
func (e *connLostError) Unwrap() error { return e.err }

// ConnectionLost reports whether err (of a call on a Client) says the connection to
// the agent broke or could not be made, rather than that the agent answered with an
// error: a host that keeps clients drops the client then and connects again. Such
// errors wrap backend.ErrUnavailable.
func ConnectionLost(err error) bool {
	var c *connLostError
	return errors.As(err, &c)
}

// errExecDone is returned by Process calls made after the exec has finished.
var errExecDone = errors.New("exec has finished")

// cancelWait is how long a cancelled exec waits for the agent's result before it
// drops the stream (the agent then kills the tree on its own).
const cancelWait = 15 * time.Second

// streamEndWait is how long an exec's stream may stay open after its result before
// the client drops it.
const streamEndWait = 5 * time.Second

// execStream is the client side of an Exec or Shell call.
type execStream = grpc.BidiStreamingClient[agentpb.ExecInput, agentpb.ExecOutput]

// Exec starts req in the agent's sandbox and returns once the process runs (or a
// command that cannot be run has its 127/126 result ready). req.Stdout and req.Stderr
// receive the output as it comes, from one goroutine; a writer that blocks holds the
// process back after StreamWindow bytes of buffering. An empty req.User runs as the
// agent's default exec user. Cancelling ctx kills the process tree; Wait then returns
// the result with Canceled set. Errors at start: empty argv or a working directory
// that does not exist (ErrInvalid, naming it), agent unreachable (ErrUnavailable),
// ctx done.
func (c *Client) Exec(ctx context.Context, req backend.ExecRequest) (backend.Process, error) {
	if err := backend.CheckExecText(req); err != nil {
		return nil, err
	}
	if err := backend.CheckArgv(req); err != nil {
		return nil, err
	}
	start := &agentpb.ExecStart{
		Argv:      req.Argv,
		Env:       req.Env,
		Dir:       req.Dir,
		User:      req.User,
		Tty:       req.TTY,
		Stdin:     req.Stdin,
		TimeoutNs: int64(req.Timeout),
	}
	if req.TTY {
		start.Size = &agentpb.WindowSize{Rows: uint32(req.Size.Rows), Cols: uint32(req.Size.Cols)}
	}
	return c.start(ctx, c.rpc.Exec, &agentpb.ExecInput{Msg: &agentpb.ExecInput_Start{Start: start}},
		fmt.Sprintf("exec %q", req.Argv[0]), req.TTY, req.Stdin, req.Stdout, req.Stderr)
}

// ShellRequest is one shell-mode call (Client.Shell).
type ShellRequest struct {
	// Command is the command string, run with bash (sh when the sandbox has no bash)
	// through eval.
	Command string
	// Session names the shell state (directory, exported variables) that the call
	// starts from and records; required. Calls of one session run side by side:
	// each starts from the state last recorded, and the last to end wins.
	Session string
	// Env is KEY=VALUE pairs applied over the session's variables (and recorded with
	// them); Dir, when set, is the working directory instead of the session's; User
	// overrides the default exec user.
	Env  []string
	Dir  string
	User string
	// Stdin connects Process.Write to the command's stdin; false gives it EOF.
	Stdin bool
	// Stdout and Stderr receive the output as it comes (nil discards).
	Stdout, Stderr io.Writer
	// Timeout, when positive, kills the call's tree after this long, counting the
	// wait for the session's previous call; the state is then not recorded.
	Timeout time.Duration
}

// Shell starts one shell-mode call: `cd` and `export` of one call hold for the next
// of the same session, each call is its own process (so `exit`, `set -e`, a syntax
// error or `exec` end only that call), and the next starts from the last state a
// call recorded. The result's Cwd is the session's directory for the next call.
// Errors at start: as Exec; an empty command or session (ErrInvalid).
func (c *Client) Shell(ctx context.Context, req ShellRequest) (backend.Process, error) {
	if req.Command == "" || req.Session == "" {
		return nil, backend.Errorf(backend.ErrInvalid, "shell: a command and a session are required")
	}
	if err := backend.CheckExecText(backend.ExecRequest{Argv: []string{req.Command, req.Session}, Env: req.Env, Dir: req.Dir, User: req.User}); err != nil {
		return nil, err
	}
	start := &agentpb.ShellStart{
		Command: req.Command, Session: req.Session, Env: req.Env, Dir: req.Dir, User: req.User,
		Stdin: req.Stdin, TimeoutNs: int64(req.Timeout),
	}
	return c.start(ctx, c.rpc.Shell, &agentpb.ExecInput{Msg: &agentpb.ExecInput_Shell{Shell: start}},
		"shell", false, req.Stdin, req.Stdout, req.Stderr)
}

// start opens an Exec or Shell stream, sends first and waits for started.
func (c *Client) start(ctx context.Context, open func(context.Context, ...grpc.CallOption) (execStream, error), first *agentpb.ExecInput, what string, tty, stdin bool, stdout, stderr io.Writer) (backend.Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := open(sctx)
	if err != nil {
		scancel()
		return nil, wireErr(what, err)
	}
	// Until started is in, ctx ending drops the stream (the agent sees it go and
	// kills what it started), which ends the Send or Recv below. The calls run in
	// this goroutine: a hand-over to another one and back costs a wake-up each way.
	stop := context.AfterFunc(ctx, scancel)
	m, err := func() (*agentpb.ExecOutput, error) {
		if err := stream.Send(first); err != nil && err != io.EOF {
			return nil, err
		}
		return stream.Recv()
	}()
	if !stop() {
		scancel()
		return nil, ctx.Err()
	}
	if err != nil {
		scancel()
		return nil, wireErr(what, err)
	}
	started := m.GetStarted()
	if started == nil {
		scancel()
		return nil, backend.Errorf(backend.ErrUnavailable, "%s: agent protocol error: no started message", what)
	}
	p := &process{
		c:      c,
		stream: stream,
		cancel: scancel,
		id:     started.ExecId,
		tty:    tty,
		stdin:  stdin,
		stdout: stdout,
		stderr: stderr,
		done:   make(chan struct{}),
	}
	go p.recvLoop()
	if ctx.Done() != nil { // a context that can end (not context.Background)
		go p.watch(ctx)
	}
	return p, nil
}

// process is a started exec on the client side.
type process struct {
	c      *Client
	stream execStream
	cancel context.CancelFunc
	id     uint64
	tty    bool
	stdin  bool
	stdout io.Writer
	stderr io.Writer

	sendMu      sync.Mutex
	sendClosed  bool
	stdinClosed bool

	done     chan struct{}
	result   backend.ExecResult
	err      error
	canceled bool // set by watch before it drops the stream
	mu       sync.Mutex
}

// recvLoop reads the exec's stream: output to the writers, then the result. Wait
// returns as soon as the result is in (done is closed then): the output before it
// has been written, and what is left of the stream (the agent's end of the call, one
// more round trip after the client's CloseSend) is read here without holding the
// caller back.
func (p *process) recvLoop() {
	defer p.cancel()
	var got bool
	finish := sync.OnceFunc(func() { close(p.done) })
	defer finish()
	var werr error
	write := func(w *io.Writer, b []byte, name string) {
		if *w == nil {
			return
		}
		if _, err := (*w).Write(b); err != nil {
			if werr == nil {
				werr = fmt.Errorf("writing %s: %w", name, err)
			}
			*w = nil // keep the process running; its further output is dropped
		}
	}
	for {
		m, err := p.stream.Recv()
		if err != nil {
			if !got {
				p.mu.Lock()
				canceled := p.canceled
				p.mu.Unlock()
				switch {
				case err == io.EOF:
					err = backend.Errorf(backend.ErrUnavailable, "exec: the agent ended the exec without a result")
				case canceled:
					err = fmt.Errorf("exec: %w", context.Canceled)
					p.result.Canceled = true
				default:
					err = wireErr("exec", err)
					if errors.Is(err, context.Canceled) {
						err = &connLostError{backend.Errorf(backend.ErrUnavailable, "exec: connection to the agent lost")}
					}
				}
				p.err = err
			}
			return
		}
		if got {
			// Nothing after the result reaches the caller, whose Wait has
			// returned: an agent sends nothing more, a hostile one is ignored.
			continue
		}
		switch x := m.Msg.(type) {
		case *agentpb.ExecOutput_Stdout:
			write(&p.stdout, x.Stdout, "stdout")
		case *agentpb.ExecOutput_Stderr:
			write(&p.stderr, x.Stderr, "stderr")
		case *agentpb.ExecOutput_Result:
			r := x.Result
			p.result = backend.ExecResult{
				ExitCode:  int(r.ExitCode),
				Signal:    int(r.Signal),
				TimedOut:  r.TimedOut,
				Canceled:  r.Canceled,
				OOMKilled: r.OomKilled,
				Duration:  time.Duration(r.DurationNs),
				Cwd:       r.Cwd,
			}
			got = true
			p.err = werr
			p.sendMu.Lock()
			if !p.sendClosed {
				p.sendClosed = true
				p.stream.CloseSend()
			}
			p.sendMu.Unlock()
			finish()
			// The agent ends the stream once it sees CloseSend; one that does not
			// has it dropped, so no reader stays behind on a kept connection.
			t := time.AfterFunc(streamEndWait, p.cancel)
			defer t.Stop()
		}
	}
}

// watch kills the tree when ctx is cancelled before the exec ends.
func (p *process) watch(ctx context.Context) {
	select {
	case <-p.done:
		return
	case <-ctx.Done():
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := p.c.rpc.Cancel(cctx, &agentpb.CancelRequest{ExecId: p.id})
	ccancel()
	if err == nil || errors.Is(rpcerr.FromStatus(err), backend.ErrNotFound) {
		t := time.NewTimer(cancelWait)
		defer t.Stop()
		select {
		case <-p.done:
			return
		case <-t.C:
		}
	}
	p.mu.Lock()
	p.canceled = true
	p.mu.Unlock()
	p.cancel()
}

func (p *process) send(m *agentpb.ExecInput) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.sendClosed {
		return errExecDone
	}
	if err := p.stream.Send(m); err != nil {
		p.sendClosed = true
		if err == io.EOF {
			return errExecDone
		}
		return wireErr("exec", err)
	}
	return nil
}

// Write sends p to the process's stdin in ChunkSize pieces; it blocks while the
// process does not read (flow control).
func (p *process) Write(b []byte) (int, error) {
	if !p.stdin {
		return 0, backend.Errorf(backend.ErrInvalid, "write: the exec was started without stdin")
	}
	n := 0
	for n < len(b) {
		end := min(n+ChunkSize, len(b))
		c := make([]byte, end-n)
		copy(c, b[n:end])
		p.sendMu.Lock()
		closed := p.stdinClosed
		p.sendMu.Unlock()
		if closed {
			return n, fmt.Errorf("write: stdin is closed: %w", io.ErrClosedPipe)
		}
		if err := p.send(&agentpb.ExecInput{Msg: &agentpb.ExecInput_Stdin{Stdin: c}}); err != nil {
			return n, fmt.Errorf("write: %w", err)
		}
		n = end
	}
	return n, nil
}

// CloseStdin closes the process's stdin (for a TTY exec: sends the end-of-file
// character). Closing twice, or stdin that was never opened, is a no-op.
func (p *process) CloseStdin() error {
	if !p.stdin {
		return nil
	}
	p.sendMu.Lock()
	if p.stdinClosed {
		p.sendMu.Unlock()
		return nil
	}
	p.stdinClosed = true
	p.sendMu.Unlock()
	err := p.send(&agentpb.ExecInput{Msg: &agentpb.ExecInput_CloseStdin{CloseStdin: &agentpb.CloseStdin{}}})
	if errors.Is(err, errExecDone) {
		return nil
	}
	return err
}

// Resize changes the terminal's size; ErrInvalid for an exec without TTY.
func (p *process) Resize(size backend.WindowSize) error {
	if !p.tty {
		return backend.Errorf(backend.ErrInvalid, "resize: the exec has no terminal")
	}
	return p.send(&agentpb.ExecInput{Msg: &agentpb.ExecInput_Resize{Resize: &agentpb.WindowSize{Rows: uint32(size.Rows), Cols: uint32(size.Cols)}}})
}

// Signal sends sig to the exec's process group.
func (p *process) Signal(sig int) error {
	if sig <= 0 || sig > 64 {
		return backend.Errorf(backend.ErrInvalid, "signal %d: not a Linux signal number", sig)
	}
	return p.send(&agentpb.ExecInput{Msg: &agentpb.ExecInput_Signal{Signal: int32(sig)}})
}

// Wait returns the result once the leader has exited and the output up to then has
// been written.
func (p *process) Wait() (backend.ExecResult, error) {
	<-p.done
	return p.result, p.err
}

// Shutdown asks the agent to end: every process it started gets SIGTERM, then
// SIGKILL after grace (0 means DefaultGrace), and the agent exits after answering.
func (c *Client) Shutdown(ctx context.Context, grace time.Duration) error {
	_, err := c.rpc.Shutdown(ctx, &agentpb.ShutdownRequest{GraceNs: int64(grace)})
	return wireErr("agent shutdown", err)
}

// Shutdown connects to the agent of files (Connect) and asks it to end every process
// of the sandbox (SIGTERM, SIGKILL after grace; 0 means DefaultGrace) and exit,
// giving up after grace plus 2 seconds: what a driver's Stop does first. Errors wrap
// backend.ErrUnavailable when the agent cannot be reached; the driver then kills the
// sandbox's first process itself.
func Shutdown(ctx context.Context, files backend.AgentFiles, grace time.Duration) error {
	if grace <= 0 {
		grace = DefaultGrace
	}
	ctx, cancel := context.WithTimeout(ctx, grace+2*time.Second)
	defer cancel()
	c, err := Connect(ctx, files)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Shutdown(ctx, grace)
}

// CopyIn extracts the tar stream r into dir in the sandbox, never following links out
// of dir. Errors: dir does not exist (ErrNotFound), a bad archive or an entry that
// would leave dir (ErrInvalid), or reading r fails.
func (c *Client) CopyIn(ctx context.Context, dir string, r io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.CopyIn(ctx)
	if err != nil {
		return wireErr("copy in", err)
	}
	if err := stream.Send(&agentpb.CopyInRequest{Msg: &agentpb.CopyInRequest_Dir{Dir: dir}}); err != nil {
		_, err = stream.CloseAndRecv()
		return wireErr("copy in", err)
	}
	buf := make([]byte, ChunkSize)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			c := make([]byte, n)
			copy(c, buf[:n])
			if err := stream.Send(&agentpb.CopyInRequest{Msg: &agentpb.CopyInRequest_Data{Data: c}}); err != nil {
				// The agent ended the call; its status says why.
				_, err = stream.CloseAndRecv()
				return wireErr("copy in", err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("copy in: reading the archive: %w", rerr)
		}
	}
	_, err = stream.CloseAndRecv()
	return wireErr("copy in", err)
}

// CopyOut writes the file or directory path in the sandbox to w as a tar stream
// (entries named from path's base name; links stored, not followed). Errors: path
// does not exist (ErrNotFound), or writing w fails.
func (c *Client) CopyOut(ctx context.Context, path string, w io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.CopyOut(ctx, &agentpb.CopyOutRequest{Path: path})
	if err != nil {
		return wireErr("copy out", err)
	}
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return wireErr("copy out", err)
		}
		if _, err := w.Write(m.Data); err != nil {
			return fmt.Errorf("copy out: %w", err)
		}
	}
}

// ExecOnce starts req on c (Client.Exec) and closes c once Wait has returned, or at
// once when the start fails: one exec on a connection made for it.
func ExecOnce(ctx context.Context, c *Client, req backend.ExecRequest) (backend.Process, error) {
	p, err := c.Exec(ctx, req)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &closingProcess{Process: p, close: c.Close}, nil
}

// Exec connects to the agent of files (Connect), starts req and closes the
// connection once Wait has returned: one exec without keeping a Client, as a driver's
// tests or a one-off tool run one. Errors: those of Connect and Client.Exec.
func Exec(ctx context.Context, files backend.AgentFiles, req backend.ExecRequest, opts ...ClientOption) (backend.Process, error) {
	c, err := Connect(ctx, files, opts...)
	if err != nil {
		return nil, err
	}
	return ExecOnce(ctx, c, req)
}

// closingProcess closes its connection once Wait has returned.
type closingProcess struct {
	backend.Process
	close func() error
	once  sync.Once
}

func (p *closingProcess) Wait() (backend.ExecResult, error) {
	res, err := p.Process.Wait()
	p.once.Do(func() { p.close() })
	return res, err
}
