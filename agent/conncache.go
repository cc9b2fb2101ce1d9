package agent

import (
	"context"
	"errors"
	"sync"

	"github.com/berth-sh/berth/backend"
)

// Conn is one cached connection to the agent of a sandbox, with what the driver
// keeps about that sandbox while it runs.
type Conn[M any] struct {
	// Client is the connection. Every call on the sandbox shares it: close it only
	// through the ConnCache (Forget, Close) or after Take.
	Client *Client
	// Identity names the agent instance that Client reached, in the driver's terms
	// (a container's id and start time, a task's PID, an agent process's PID and
	// start time). The ConnCache compares it with what its IdentifyFunc reports now;
	// "" never matches.
	Identity string
	// Meta is the driver's data about the sandbox, read when the connection was made
	// (for example its default exec user and its OOM counter).
	Meta M
}

// Close closes c's Client. It does nothing when c is nil.
func (c *Conn[M]) Close() {
	if c != nil {
		c.Client.Close()
	}
}

// ConnectFunc connects to the agent of the running sandbox name and returns the new
// connection with its Identity and Meta set. Its errors (ErrNotFound for a missing
// sandbox, ErrConflict for a stopped one, ErrUnavailable for an agent that does not
// answer) reach the caller as they are.
type ConnectFunc[M any] func(ctx context.Context, name string) (*Conn[M], error)

// IdentifyFunc returns the identity (see Conn.Identity) of the agent that sandbox
// name runs now, or "" when it runs none (it is stopped). An error (the sandbox is
// gone, the runtime does not answer) reaches the caller as it is.
type IdentifyFunc func(ctx context.Context, name string) (string, error)

// ConnCache keeps one agent connection per sandbox name, made on first use by its
// ConnectFunc and shared by every concurrent call on that sandbox: a long-lived host
// (a registry kept open) reuses connections through it. It is safe for concurrent
// use.
//
// When a call through Do fails with backend.ErrUnavailable, that is either the
// connection (the agent went away: the sandbox was stopped, or started anew) or the
// agent's own answer (for example, it cannot fork while the sandbox's pids limit is
// exhausted). The cache asks its IdentifyFunc: the same agent keeps the shared
// connection, since closing it would kill the other calls' execs, and the error is
// returned; another agent, or none, drops the connection and the call is made once
// more on a new one. Without an IdentifyFunc every such error drops the connection.
type ConnCache[M any] struct {
	connect  ConnectFunc[M]
	identify IdentifyFunc

	mu    sync.Mutex
	conns map[string]*Conn[M]
}

// NewConnCache returns an empty cache that connects through connect and checks a
// failed call's agent through identify (nil: never, see ConnCache).
func NewConnCache[M any](connect ConnectFunc[M], identify IdentifyFunc) *ConnCache[M] {
	return &ConnCache[M]{connect: connect, identify: identify, conns: map[string]*Conn[M]{}}
}

// Get returns the cached connection of name, connecting when there is none. When
// two calls connect at once, the first to finish is cached and the other's
// connection is closed.
func (cc *ConnCache[M]) Get(ctx context.Context, name string) (*Conn[M], error) {
	cc.mu.Lock()
	c := cc.conns[name]
	cc.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := cc.connect(ctx, name)
	if err != nil {
		return nil, err
	}
	cc.mu.Lock()
	if old := cc.conns[name]; old != nil {
		cc.mu.Unlock()
		c.Close()
		return old, nil
	}
	cc.conns[name] = c
	cc.mu.Unlock()
	return c, nil
}

// Put caches c as the connection of name, closing the one it replaces: for a driver
// that has just started the sandbox's agent and connected to it.
func (cc *ConnCache[M]) Put(name string, c *Conn[M]) {
	cc.mu.Lock()
	old := cc.conns[name]
	cc.conns[name] = c
	cc.mu.Unlock()
	if old != c {
		old.Close()
	}
}

// Take removes the connection of name from the cache and returns it, nil when there
// is none. The caller owns it and must close it: Stop uses it to ask the agent to
// shut down when its Identity is the running agent's.
func (cc *ConnCache[M]) Take(name string) *Conn[M] {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	c := cc.conns[name]
	delete(cc.conns, name)
	return c
}

// Forget closes and removes the connection of name, if any (execs still running on
// it lose their client, and the agent kills their process trees). Call it when the
// sandbox is stopped, removed or about to get a new agent.
func (cc *ConnCache[M]) Forget(name string) {
	cc.Take(name).Close()
}

// drop closes c and removes it from the cache if it is still name's connection
// (another call may have replaced it already).
func (cc *ConnCache[M]) drop(name string, c *Conn[M]) {
	cc.mu.Lock()
	if cc.conns[name] == c {
		delete(cc.conns, name)
	}
	cc.mu.Unlock()
	c.Close()
}

// Do runs op on the connection of name (see Get). When op fails with
// backend.ErrUnavailable and the sandbox no longer runs the agent the connection
// reached (see ConnCache), the connection is dropped and op runs once more on a new
// one. Errors: those of the ConnectFunc and the IdentifyFunc, and op's.
func (cc *ConnCache[M]) Do(ctx context.Context, name string, op func(*Conn[M]) error) error {
	for attempt := 0; ; attempt++ {
		c, err := cc.Get(ctx, name)
		if err != nil {
			return err
		}
		err = op(c)
		if err == nil || attempt > 0 || !errors.Is(err, backend.ErrUnavailable) {
			return err
		}
		if cc.identify != nil {
			id, ierr := cc.identify(ctx, name)
			if ierr != nil {
				cc.drop(name, c)
				return ierr
			}
			if id != "" && id == c.Identity {
				return err // the agent itself answered; others still use the connection
			}
		}
		cc.drop(name, c)
	}
}

// Close closes and removes every cached connection; the sandboxes keep running and
// the cache stays usable. It returns nil.
func (cc *ConnCache[M]) Close() error {
	cc.mu.Lock()
	conns := cc.conns
	cc.conns = map[string]*Conn[M]{}
	cc.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return nil
}
