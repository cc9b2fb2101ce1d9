package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/agent/agentpb"
)

// DialSocketDir returns the dialer of an agent whose socket is in dir (the sandbox's
// socket directory on the host). Every dial opens dir and then the socket with
// O_PATH|O_NOFOLLOW and connects through /proc/self/fd/N: no symbolic link planted
// in the directory is followed, and the path may be longer than the 108 bytes a
// socket address holds. Errors wrap backend.ErrUnavailable.
func DialSocketDir(dir string) backend.Dialer {
	return func(ctx context.Context) (net.Conn, error) {
		dfd, err := unix.Open(dir, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "agent socket directory %s: %v", dir, err)
		}
		defer unix.Close(dfd)
		sfd, err := unix.Openat(dfd, backend.AgentSocketName, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "agent socket %s/%s: %v", dir, backend.AgentSocketName, err)
		}
		defer unix.Close(sfd)
		var st unix.Stat_t
		if err := unix.Fstat(sfd, &st); err != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "agent socket %s/%s: %v", dir, backend.AgentSocketName, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return nil, backend.Errorf(backend.ErrUnavailable, "agent socket %s/%s is not a socket", dir, backend.AgentSocketName)
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", sfd))
		if err != nil {
			return nil, backend.Errorf(backend.ErrUnavailable, "connecting to agent socket %s/%s: %v", dir, backend.AgentSocketName, err)
		}
		return c, nil
	}
}

// Client is a connection to one agent. Its methods are safe for concurrent use.
type Client struct {
	conn     *grpc.ClientConn
	rpc      agentpb.AgentClient
	protocol int
}

// NewClient connects to the agent that dial reaches and negotiates the protocol
// (Hello): the client speaks ProtocolVersion and ProtocolVersion-1. Errors: the
// agent cannot be reached (ErrUnavailable), or speaks no common version
// (ErrUnsupported, naming both sides' versions). Close the Client when done.
func NewClient(ctx context.Context, dial backend.Dialer) (*Client, error) {
	return newClient(ctx, dial, clientVersions())
}

func newClient(ctx context.Context, dial backend.Dialer, versions []int) (*Client, error) {
	if dial == nil {
		return nil, backend.Errorf(backend.ErrInvalid, "agent client: no dialer")
	}
	conn, err := grpc.NewClient("passthrough:///berth-agent",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dial(ctx) }),
		grpc.WithInitialWindowSize(StreamWindow),
		grpc.WithInitialConnWindowSize(StreamWindow),
	)
	if err != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "agent client: %v", err)
	}
	c := &Client{conn: conn, rpc: agentpb.NewAgentClient(conn)}
	req := &agentpb.HelloRequest{}
	for _, v := range versions {
		req.Versions = append(req.Versions, int32(v))
	}
	resp, err := c.rpc.Hello(ctx, req)
	if err != nil {
		conn.Close()
		if status.Code(err) == codes.FailedPrecondition {
			return nil, backend.Errorf(backend.ErrUnsupported, "agent protocol: %s", status.Convert(err).Message())
		}
		return nil, mapError("agent hello", err)
	}
	p := int(resp.Protocol)
	ok := false
	for _, v := range versions {
		ok = ok || v == p
	}
	if !ok {
		conn.Close()
		return nil, backend.Errorf(backend.ErrUnsupported, "agent protocol: the agent chose version %d, which this client (versions %v) does not speak", p, versions)
	}
	c.protocol = p
	return c, nil
}

// WaitReady calls NewClient until it succeeds or ctx is done, backing off from 5 ms
// to 200 ms between attempts; for agents that are still starting (containers).
// A protocol mismatch is returned at once. When ctx ends first, the error wraps
// ctx.Err() and the last connection error (ErrUnavailable).
func WaitReady(ctx context.Context, dial backend.Dialer) (*Client, error) {
	delay := 5 * time.Millisecond
	for {
		c, err := NewClient(ctx, dial)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, backend.ErrUnsupported) || errors.Is(err, backend.ErrInvalid) {
			return nil, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			if !errors.Is(err, backend.ErrUnavailable) {
				err = backend.Errorf(backend.ErrUnavailable, "%v", err)
			}
			return nil, fmt.Errorf("agent did not become ready: %w (%w)", err, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// Protocol returns the negotiated protocol version.
func (c *Client) Protocol() int { return c.protocol }

// Close closes the connection. Execs still running on it lose their client, so the
// agent kills their process trees.
func (c *Client) Close() error { return c.conn.Close() }

// mapError turns a gRPC error from the agent into a backend error kind, prefixed
// with op.
func mapError(op string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", op, err)
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Canceled:
		return fmt.Errorf("%s: %w", op, context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", op, context.DeadlineExceeded)
	case codes.NotFound:
		return backend.Errorf(backend.ErrNotFound, "%s: %s", op, msg)
	case codes.InvalidArgument:
		return backend.Errorf(backend.ErrInvalid, "%s: %s", op, msg)
	case codes.AlreadyExists, codes.FailedPrecondition:
		return backend.Errorf(backend.ErrConflict, "%s: %s", op, msg)
	case codes.Unimplemented:
		return backend.Errorf(backend.ErrUnsupported, "%s: %s", op, msg)
	case codes.Unavailable:
		return backend.Errorf(backend.ErrUnavailable, "%s: agent unreachable: %s", op, msg)
	default:
		return backend.Errorf(backend.ErrUnavailable, "%s: agent: %s", op, msg)
	}
}

// errExecDone is returned by Process calls made after the exec has finished.
var errExecDone = errors.New("exec has finished")

// cancelWait is how long a cancelled exec waits for the agent's result before it
// drops the stream (the agent then kills the tree on its own).
const cancelWait = 15 * time.Second

// Exec starts req in the agent's sandbox and returns once the process runs (or a
// command that cannot be run has its 127/126 result ready). req.Stdout and req.Stderr
// receive the output as it comes, from one goroutine; a writer that blocks holds the
// process back after StreamWindow bytes of buffering. Cancelling ctx kills the process
// tree; Wait then returns the result with Canceled set. Errors at start: empty argv or
// a working directory that does not exist (ErrInvalid, naming it), agent unreachable
// (ErrUnavailable), ctx done.
func (c *Client) Exec(ctx context.Context, req backend.ExecRequest) (backend.Process, error) {
	if err := checkShell(req, c.protocol); err != nil {
		return nil, err
	}
	if err := backend.CheckExecText(req); err != nil {
		return nil, err
	}
	if err := backend.CheckArgv(req); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := c.rpc.Exec(sctx)
	if err != nil {
		scancel()
		return nil, mapError("exec", err)
	}
	start := &agentpb.ExecStart{
		Argv:      req.Argv,
		Env:       req.Env,
		Dir:       req.Dir,
		User:      req.User,
		Tty:       req.TTY,
		Stdin:     req.Stdin,
		TimeoutNs: int64(req.Timeout),
		Shell:     req.Shell,
		Session:   req.Session,
	}
	if req.Job != nil {
		start.Job = &agentpb.JobRequest{Op: string(req.Job.Op), Id: req.Job.ID, Follow: req.Job.Follow}
	}
	if req.TTY {
		start.Size = &agentpb.WindowSize{Rows: uint32(req.Size.Rows), Cols: uint32(req.Size.Cols)}
	}
	type first struct {
		m   *agentpb.ExecOutput
		err error
	}
	ch := make(chan first, 1)
	go func() {
		if err := stream.Send(&agentpb.ExecInput{Msg: &agentpb.ExecInput_Start{Start: start}}); err != nil && err != io.EOF {
			ch <- first{nil, err}
			return
		}
		m, err := stream.Recv()
		ch <- first{m, err}
	}()
	var f first
	select {
	case f = <-ch:
	case <-ctx.Done():
		scancel() // the agent sees the stream go and kills what it started
		<-ch
		return nil, ctx.Err()
	}
	if f.err != nil {
		scancel()
		what := fmt.Sprintf("exec %q", execName(req))
		if req.Job != nil && req.Job.Op != backend.JobStart {
			what = execName(req)
		}
		return nil, mapError(what, f.err)
	}
	started := f.m.GetStarted()
	if started == nil {
		scancel()
		return nil, backend.Errorf(backend.ErrUnavailable, "exec %q: agent protocol error: no started message", execName(req))
	}
	p := &process{
		c:      c,
		stream: stream,
		cancel: scancel,
		id:     started.ExecId,
		tty:    req.TTY,
		stdin:  req.Stdin,
		stdout: req.Stdout,
		stderr: req.Stderr,
		done:   make(chan struct{}),
	}
	go p.recvLoop()
	go p.watch(ctx)
	return p, nil
}

// process is a started exec on the client side.
type process struct {
	c      *Client
	stream agentpb.Agent_ExecClient
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

func (p *process) recvLoop() {
	defer close(p.done)
	defer p.cancel()
	var got bool
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
				if err == io.EOF {
					err = backend.Errorf(backend.ErrUnavailable, "exec: the agent ended the exec without a result")
				} else if canceled {
					err = fmt.Errorf("exec: %w", context.Canceled)
					p.result.Canceled = true
				} else {
					err = mapError("exec", err)
					if errors.Is(err, context.Canceled) {
						err = backend.Errorf(backend.ErrUnavailable, "exec: connection to the agent lost")
					}
				}
				p.err = err
			} else if werr != nil {
				p.err = werr
			}
			return
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
			p.sendMu.Lock()
			if !p.sendClosed {
				p.sendClosed = true
				p.stream.CloseSend()
			}
			p.sendMu.Unlock()
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
	if err == nil || status.Code(err) == codes.NotFound {
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
		return mapError("exec", err)
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
	return mapError("agent shutdown", err)
}

// CopyIn extracts the tar stream r into dir in the sandbox, never following links out
// of dir. Errors: dir does not exist (ErrNotFound), a bad archive or an entry that
// would leave dir (ErrInvalid), or reading r fails.
func (c *Client) CopyIn(ctx context.Context, dir string, r io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.CopyIn(ctx)
	if err != nil {
		return mapError("copy in", err)
	}
	if err := stream.Send(&agentpb.CopyInRequest{Msg: &agentpb.CopyInRequest_Dir{Dir: dir}}); err != nil {
		_, err = stream.CloseAndRecv()
		return mapError("copy in", err)
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
				return mapError("copy in", err)
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
	return mapError("copy in", err)
}

// CopyOut writes the file or directory path in the sandbox to w as a tar stream
// (entries named from path's base name; links stored, not followed). Errors: path
// does not exist (ErrNotFound), or writing w fails.
func (c *Client) CopyOut(ctx context.Context, path string, w io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.CopyOut(ctx, &agentpb.CopyOutRequest{Path: path})
	if err != nil {
		return mapError("copy out", err)
	}
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return mapError("copy out", err)
		}
		if _, err := w.Write(m.Data); err != nil {
			return fmt.Errorf("copy out: %w", err)
		}
	}
}

// checkShell validates the shell-mode and job fields of req for an agent of
// protocol p.
func checkShell(req backend.ExecRequest, p int) error {
	if j := req.Job; j != nil {
		switch {
		case req.Shell != "":
			return backend.Errorf(backend.ErrInvalid, "exec: a job operation cannot be a shell-mode call")
		case req.Session == "":
			return backend.Errorf(backend.ErrInvalid, "exec: job %s needs the session name (ExecRequest.Session)", j.Op)
		case j.Op != backend.JobStart && j.Op != backend.JobList && j.Op != backend.JobLogs && j.Op != backend.JobKill:
			return backend.Errorf(backend.ErrInvalid, "exec: job operation %q: want start, list, logs or kill", j.Op)
		case (j.Op == backend.JobLogs || j.Op == backend.JobKill) && j.ID == "":
			return backend.Errorf(backend.ErrInvalid, "exec: job %s needs a job id", j.Op)
		case p < 2:
			return backend.Errorf(backend.ErrUnsupported, "exec: the sandbox's agent speaks protocol %d, which has no background jobs; restart the sandbox so that it runs the current agent", p)
		}
		return nil
	}
	switch {
	case req.Shell == "":
		return nil
	case len(req.Argv) > 0:
		return backend.Errorf(backend.ErrInvalid, "exec: both argv %q and a shell command given; use one", req.Argv)
	case req.Session == "":
		return backend.Errorf(backend.ErrInvalid, "exec: shell mode needs the session name (ExecRequest.Session)")
	case p < 2:
		return backend.Errorf(backend.ErrUnsupported, "exec: the sandbox's agent speaks protocol %d, which has no shell mode; restart the sandbox (berth close with on_close = \"stop\", or berth rm) so that it runs the current agent", p)
	}
	return nil
}

// execName is how errors name req's command.
func execName(req backend.ExecRequest) string {
	if req.Job != nil && req.Job.Op != backend.JobStart {
		return "job " + string(req.Job.Op)
	}
	if req.Shell != "" {
		return "shell"
	}
	return req.Argv[0]
}
