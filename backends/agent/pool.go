package agent

import (
	"context"
	"fmt"
	"io"
	"path"
	"time"

	"github.com/berth-sh/berth/backend"
)

// SandboxCommand returns the argv that starts the agent as the first process of a
// sandbox with its own root filesystem, in which the driver has mounted
// AgentFiles.Dir read-only at backend.AgentMountDir and AgentFiles.SocketDir at
// backend.SocketMountDir: the agent binary at its in-sandbox path, then
// "agent serve --socket-dir /.berth/run". extra is appended (for example
// "--log", FILE, or "--subreaper" when the agent is not PID 1 of its own PID
// namespace).
func SandboxCommand(extra ...string) []string {
	argv := []string{path.Join(backend.AgentMountDir, backend.AgentBinaryName), "agent", "serve", "--socket-dir", backend.SocketMountDir}
	return append(argv, extra...)
}

// HostCommand returns the argv that starts the agent of files on the host side of
// the mounts (a driver whose sandbox shares the host's paths): files.Binary, then
// "agent serve --socket-dir" files.SocketDir, then extra.
func HostCommand(files backend.AgentFiles, extra ...string) []string {
	argv := []string{files.Binary, "agent", "serve", "--socket-dir", files.SocketDir}
	return append(argv, extra...)
}

// Resolver returns the dialer of the running sandbox name's agent, usually
// DialSocketDir of the sandbox's AgentFiles.SocketDir, which the driver recorded at
// Create. It returns an error wrapping backend.ErrNotFound for a missing sandbox
// and backend.ErrConflict for a stopped one; those errors reach the caller as they
// are.
type Resolver func(ctx context.Context, name string) (backend.Dialer, error)

// Pool gives a driver berth's exec semantics without writing any: it keeps one
// agent Client per sandbox (connected on first use, dropped when the agent goes
// away) and implements the exec and copy calls of backend.TerminalBackend and
// backend.Copier through it. A driver embeds or holds a Pool and forwards Exec,
// CopyIn and CopyOut to it, calls Shutdown from Stop and Remove, and Close from its
// own Close. A Pool is safe for concurrent use. It is a ConnCache without driver
// data or identity check; a driver that needs either uses a ConnCache itself.
type Pool struct {
	resolve Resolver
	conns   *ConnCache[struct{}]
}

// NewPool returns a Pool that finds each sandbox's agent through resolve.
func NewPool(resolve Resolver) *Pool {
	p := &Pool{resolve: resolve}
	p.conns = NewConnCache(p.connect, nil)
	return p
}

// connect is the ConnCache's ConnectFunc: the Resolver's dialer, then NewClient.
func (p *Pool) connect(ctx context.Context, name string) (*Conn[struct{}], error) {
	dial, err := p.resolve(ctx, name)
	if err != nil {
		return nil, err
	}
	c, err := NewClient(ctx, dial)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	return &Conn[struct{}]{Client: c}, nil
}

// Forget closes and drops the cached Client of name, if any (execs still running on
// it lose their client and are killed by the agent). Call it when the sandbox's
// agent is gone or replaced.
func (p *Pool) Forget(name string) { p.conns.Forget(name) }

// Exec implements backend.TerminalBackend.Exec through the sandbox's agent. A
// cached connection that has gone stale (the agent was restarted) is replaced once.
// Errors: those of the Resolver, ErrUnavailable when the agent cannot be reached,
// and the agent's own (ErrInvalid for an empty argv or a missing working directory).
func (p *Pool) Exec(ctx context.Context, name string, req backend.ExecRequest) (backend.Process, error) {
	return p.conns.Exec(ctx, name, req)
}

// CopyIn implements backend.Copier.CopyIn through the sandbox's agent: the tar
// stream r is extracted into dir (absolute, or relative to the agent's working
// directory) without following links out of dir.
func (p *Pool) CopyIn(ctx context.Context, name, dir string, r io.Reader) error {
	return p.conns.CopyIn(ctx, name, dir, r)
}

// CopyOut implements backend.Copier.CopyOut through the sandbox's agent: path is
// written to w as a tar stream.
func (p *Pool) CopyOut(ctx context.Context, name, path string, w io.Writer) error {
	return p.conns.CopyOut(ctx, name, path, w)
}

// Shutdown asks the agent of name to end every process of the sandbox (SIGTERM,
// SIGKILL after grace; 0 means DefaultGrace) and exit, and drops the cached Client.
// It connects through dial (not the Resolver, which may refuse a sandbox that is
// being stopped) and gives up after grace plus 2 seconds. Errors wrap
// backend.ErrUnavailable when the agent cannot be reached; the driver should then
// kill the sandbox's first process itself.
func (p *Pool) Shutdown(ctx context.Context, name string, dial backend.Dialer, grace time.Duration) error {
	p.Forget(name)
	if grace <= 0 {
		grace = DefaultGrace
	}
	ctx, cancel := context.WithTimeout(ctx, grace+2*time.Second)
	defer cancel()
	c, err := NewClient(ctx, dial)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Shutdown(ctx, grace)
}

// Close closes every cached Client. Sandboxes keep running. It returns nil.
func (p *Pool) Close() error { return p.conns.Close() }
