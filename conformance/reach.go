package conformance

import (
	"context"
	"net"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

// Reach is how a run's cases reach a sandbox's processes, as berth's host does.
type Reach string

// The ways of reaching a sandbox.
const (
	// ReachDefault follows the driver's Capabilities.Agent: its socket (AgentSocket),
	// its AgentDialer (AgentDial), or its Execer (no agent).
	ReachDefault Reach = ""
	// ReachDial goes through the driver's AgentDialer although the driver's agents
	// listen on their sockets too: the "-dial" copies of the exec, tty and terminal
	// cases, for drivers that claim both (Capabilities.AgentDial).
	ReachDial Reach = "dial"
)

// dialVariantGroups are the groups whose cases also run through the driver's
// AgentDialer when the driver offers it beside its socket.
var dialVariantGroups = map[string]bool{"exec": true, "tty": true, "terminal": true}

// dialVariants returns a copy of every case of dialVariantGroups that does not need
// a registry (a registry reaches agents its own way), in group GROUP-dial, run with
// ReachDial, needing Capabilities.AgentDial besides what the case needs.
func dialVariants(cases []Case) []Case {
	var out []Case
	for _, c := range cases {
		if !dialVariantGroups[c.Group] || c.registry {
			continue
		}
		v := c
		v.Group = c.Group + "-" + string(ReachDial)
		v.Requires = joinRequires(c.Requires, "Capabilities.AgentDial")
		needs := c.Needs
		v.Needs = func(caps backend.Capabilities) (bool, string) {
			if caps.Agent != backend.AgentSocket || !caps.AgentDial {
				return false, "driver does not offer AgentDial beside its agents' sockets (Capabilities.AgentDial), so there is no second way to run this case"
			}
			if needs != nil {
				return needs(caps)
			}
			return true, ""
		}
		run := c.Run
		v.Run = func(t T, h *Harness) { run(t, h.withReach(ReachDial)) }
		out = append(out, v)
	}
	return out
}

func joinRequires(a, b string) string {
	if a == "" {
		return b
	}
	return a + ", " + b
}

// withReach returns a copy of h whose execs go the way reach says.
func (h *Harness) withReach(reach Reach) *Harness {
	c := *h
	c.reach = reach
	return &c
}

// agentFilesOf returns the agent files Create prepared for sandbox name.
func (h *Harness) agentFilesOf(name string) (backend.AgentFiles, bool) {
	h.filesMu.Lock()
	defer h.filesMu.Unlock()
	f, ok := h.files[name]
	return f, ok
}

func (h *Harness) recordFiles(name string, f backend.AgentFiles) {
	h.filesMu.Lock()
	defer h.filesMu.Unlock()
	h.files[name] = f
}

// Connect connects to the agent of sandbox name the way berth's host does: through
// the socket in the socket directory the harness prepared (Capabilities.Agent
// "socket"), or through the driver's AgentDialer (AgentDial, and the @dial copies of
// the cases), presenting the sandbox's token either way. The caller closes the
// client. Errors: the sandbox was not created through the harness, the driver runs no
// agent (ErrUnsupported), those of agent.NewClient.
func (h *Harness) Connect(ctx context.Context, name string) (*agent.Client, error) {
	files, ok := h.agentFilesOf(name)
	caps := h.Info.Capabilities
	if !ok && (caps.Agent == backend.AgentSocket && h.reach != ReachDial) {
		// The host prepared no agent files for it: there is no socket to dial, as
		// for a sandbox that does not exist.
		return nil, backend.Errorf(backend.ErrUnavailable, "conformance: no agent files were prepared for sandbox %s, so no agent socket can be dialled", name)
	}
	useDial := caps.Agent == backend.AgentDial || h.reach == ReachDial
	switch {
	case useDial:
		d, ok := h.Backend.(backend.AgentDialer)
		if !ok || !caps.AgentDial {
			return nil, backend.Errorf(backend.ErrUnsupported, "conformance: driver %s claims agent %q but does not implement backend.AgentDialer", h.Info.Name, caps.Agent)
		}
		dial := func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, name) }
		return agent.NewClient(ctx, dial, agent.WithTokenFrom(files.Dir))
	case caps.Agent == backend.AgentSocket:
		return agent.Connect(ctx, files)
	}
	return nil, backend.Errorf(backend.ErrUnsupported, "conformance: driver %s runs no berth agent (Capabilities.Agent is empty)", h.Info.Name)
}

// wantRefused checks the error of an exec that no agent can take: the sandbox is
// stopped, removed or missing. Through the agent's socket nothing answers
// (ErrUnavailable, from which berth's registry runs the lifecycle); through the
// driver's AgentDialer or Execer the driver says why (kind: ErrNotFound for a missing
// sandbox, ErrConflict for a stopped one).
func (h *Harness) wantRefused(t T, what string, err error, kind error) {
	t.Helper()
	if h.Info.Capabilities.Agent == backend.AgentSocket && h.reach != ReachDial {
		kind = backend.ErrUnavailable
	}
	wantKind(t, what, err, kind)
}

// Exec starts req in sandbox name the way berth's host does: through the sandbox's
// agent (Connect), or through the driver's Execer when its sandboxes run no agent.
// The connection is closed once Wait has returned.
func (h *Harness) Exec(ctx context.Context, name string, req backend.ExecRequest) (backend.Process, error) {
	if !h.Info.Capabilities.HasAgent() {
		ex, ok := h.Backend.(backend.Execer)
		if !ok {
			return nil, backend.Errorf(backend.ErrUnsupported, "conformance: driver %s runs no berth agent and does not implement backend.Execer: nothing can run in its sandboxes", h.Info.Name)
		}
		return ex.Exec(ctx, name, req)
	}
	c, err := h.Connect(ctx, name)
	if err != nil {
		return nil, err
	}
	return agent.ExecOnce(ctx, c, req)
}
