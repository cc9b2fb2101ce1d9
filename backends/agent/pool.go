package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"sync"
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
// own Close. A Pool is safe for concurrent use.
type Pool struct {
	resolve Resolver

	mu      sync.Mutex
	clients map[string]*Client
}

// NewPool returns a Pool that finds each sandbox's agent through resolve.
func NewPool(resolve Resolver) *Pool {
	return &Pool{resolve: resolve, clients: map[string]*Client{}}
}

// client returns the cached Client of name, connecting when there is none.
func (p *Pool) client(ctx context.Context, name string) (*Client, error) {
	p.mu.Lock()
	c := p.clients[name]
	p.mu.Unlock()
	if c != nil {
		return c, nil
	}
	dial, err := p.resolve(ctx, name)
	if err != nil {
		return nil, err
	}
	c, err = NewClient(ctx, dial)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.clients[name]; old != nil {
		c.Close()
		return old, nil
	}
	p.clients[name] = c
	return c, nil
}

// Forget closes and drops the cached Client of name, if any (execs still running on
// it lose their client and are killed by the agent). Call it when the sandbox's
// agent is gone or replaced.
func (p *Pool) Forget(name string) {
	p.mu.Lock()
	c := p.clients[name]
	delete(p.clients, name)
	p.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

func (p *Pool) drop(name string, c *Client) {
	p.mu.Lock()
	if p.clients[name] == c {
		delete(p.clients, name)
	}
	p.mu.Unlock()
	c.Close()
}

// Exec implements backend.TerminalBackend.Exec through the sandbox's agent. A
// cached connection that has gone stale (the agent was restarted) is replaced once.
// Errors: those of the Resolver, ErrUnavailable when the agent cannot be reached,
// and the agent's own (ErrInvalid for an empty argv or a missing working directory).
func (p *Pool) Exec(ctx context.Context, name string, req backend.ExecRequest) (backend.Process, error) {
	c, err := p.client(ctx, name)
	if err != nil {
		return nil, err
	}
	proc, err := c.Exec(ctx, req)
	if err != nil && errors.Is(err, backend.ErrUnavailable) {
		p.drop(name, c)
		if c, err = p.client(ctx, name); err == nil {
			proc, err = c.Exec(ctx, req)
		}
	}
	return proc, err
}

// CopyIn implements backend.Copier.CopyIn through the sandbox's agent: the tar
// stream r is extracted into dir (absolute, or relative to the agent's working
// directory) without following links out of dir.
func (p *Pool) CopyIn(ctx context.Context, name, dir string, r io.Reader) error {
	c, err := p.client(ctx, name)
	if err != nil {
		return err
	}
	return c.CopyIn(ctx, dir, r)
}

// CopyOut implements backend.Copier.CopyOut through the sandbox's agent: path is
// written to w as a tar stream.
func (p *Pool) CopyOut(ctx context.Context, name, path string, w io.Writer) error {
	c, err := p.client(ctx, name)
	if err != nil {
		return err
	}
	return c.CopyOut(ctx, path, w)
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
func (p *Pool) Close() error {
	p.mu.Lock()
	clients := p.clients
	p.clients = map[string]*Client{}
	p.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	return nil
}
