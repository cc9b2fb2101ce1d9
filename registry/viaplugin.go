package registry

import (
	"runtime"
	"sync"
	"weak"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

// viaPlugins maps each agent client whose connection runs through a driver plugin
// (Capabilities.Agent = AgentDial: the Kubernetes driver's port-forward, a VM's
// vsock) to that plugin's backend, so that a call that lost its connection can tell
// a crash of the plugin (a DriverCrashedError) from the agent's own end. The keys
// are weak: an entry goes when its client is garbage, wherever it was closed.
type viaPlugins struct {
	m sync.Map // weak.Pointer[agent.Client] → backend.TerminalBackend
}

// add records that c dials its agent through b.
func (v *viaPlugins) add(c *agent.Client, b backend.TerminalBackend) {
	k := weak.Make(c)
	v.m.Store(k, b)
	runtime.AddCleanup(c, func(k weak.Pointer[agent.Client]) { v.m.Delete(k) }, k)
}

// lostWithPlugin reports whether c, an agent client whose connection was lost,
// dialled through a driver plugin that has exited while the registry is open: its
// crash (or a kill from outside) took the connection. The plugin's exit is known
// by then: the connection's error waits for it (backends' crash grace).
func (r *Registry) lostWithPlugin(c *agent.Client) bool {
	if c == nil || r.life.Err() != nil {
		return false
	}
	b, ok := r.viaPlugin.m.Load(weak.Make(c))
	if !ok {
		return false
	}
	x, ok := b.(exiter)
	return ok && x.Exited()
}
