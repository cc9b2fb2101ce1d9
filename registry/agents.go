package registry

import (
	"sync"

	"google.golang.org/grpc/connectivity"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

// agentCache keeps one agent client per sandbox that a call reached directly, for
// the life of the Registry: a long-lived registry (a library user, berth serve)
// then pays the dial, the token handshake and Hello once per sandbox, not per call.
// A client whose connection failed is dropped at its next use (its state is no
// longer ready), or when a call's start fails for a lost connection (the call is
// then made once more on a new one); Close closes every client.
type agentCache struct {
	mu     sync.Mutex
	m      map[sbKey]*agent.Client
	closed bool // closeAll was called: put refuses
}

// errClosed is the error of a call that meets a closed Registry.
var errClosed = backend.Errorf(backend.ErrUnavailable, "the registry is closed; open another with registry.Open")

// get returns the cached client of k when its connection is up (ready) or being
// made by another call (connecting), dropping any other. One whose connection went
// idle (gRPC's state after the agent's end closed it: the sandbox stopped or its
// agent died, or after gRPC's idle timeout) is not reused: a call on it would
// connect again on its own, and when nothing listens any more, fail, where a call
// that cannot be made twice (a job's start, a copy) has no way to tell that nothing
// ran. The caller dials afresh instead, which costs what the reconnection would and
// fails before any call, sending it down the slow path.
func (a *agentCache) get(k sbKey) *agent.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.m[k]
	if c == nil {
		return nil
	}
	switch c.State() {
	case connectivity.Ready, connectivity.Connecting:
		return c
	}
	delete(a.m, k)
	c.Close()
	return nil
}

// put caches c for k and returns the client to use: c, or the one another call
// cached meanwhile (c is then closed). After closeAll it closes c and returns
// errClosed: a call that raced Close runs nothing and leaks no connection.
func (a *agentCache) put(k sbKey, c *agent.Client) (*agent.Client, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		c.Close()
		return nil, errClosed
	}
	if a.m == nil {
		a.m = map[sbKey]*agent.Client{}
	}
	if old := a.m[k]; old != nil {
		c.Close()
		return old, nil
	}
	a.m[k] = c
	return c, nil
}

// drop forgets and closes c when it is still k's client.
func (a *agentCache) drop(k sbKey, c *agent.Client) {
	a.mu.Lock()
	if a.m[k] == c {
		delete(a.m, k)
	}
	a.mu.Unlock()
	c.Close()
}

// dropStale forgets and closes k's client when it reaches another agent process
// than instance (an Instance from Hello): the sandbox's agent was started again.
func (a *agentCache) dropStale(k sbKey, instance string) {
	a.mu.Lock()
	c := a.m[k]
	if c == nil || c.Instance() == instance {
		a.mu.Unlock()
		return
	}
	delete(a.m, k)
	a.mu.Unlock()
	c.Close()
}

// forget closes and forgets k's client, if any: its sandbox was stopped, removed or
// made anew.
func (a *agentCache) forget(k sbKey) {
	a.mu.Lock()
	c := a.m[k]
	delete(a.m, k)
	a.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// closeAll closes and forgets every client.
func (a *agentCache) closeAll() {
	a.mu.Lock()
	m := a.m
	a.m = nil
	a.closed = true
	a.mu.Unlock()
	for _, c := range m {
		c.Close()
	}
}
