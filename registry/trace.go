package registry

import "context"

// CallTrace is a set of hooks that a call made with a context from WithCallTrace
// runs as it reaches the phases of its slow path (the lifecycle: see openMode),
// like net/http/httptrace's ClientTrace: a test, or a tool that measures, learns
// when each phase begins or ends and may act then (cancel the call's context, to
// abandon it at that point). Any hook may be nil. Hooks run synchronously on the
// call's goroutine, with the sandbox's lock held: they must not call the registry
// for the same sandbox.
type CallTrace struct {
	// CreateStart runs just before the driver's Create of the session's sandbox
	// (which creates or adopts it), CreateDone when that Create has returned, with
	// its error. The Create runs to its end even when the call's context ends
	// meanwhile: an abandoned create is finished and then undone, never left half.
	CreateStart func(driver, sandbox string)
	CreateDone  func(driver, sandbox string, err error)
	// AgentReady runs when the call has connected to the agent of the sandbox that
	// the lifecycle created, adopted or started (before anything runs in it).
	AgentReady func(driver, sandbox string)
	// Started runs when an Exec's command has started on the slow path, before the
	// session's record is written.
	Started func(driver, sandbox string)
}

type traceKey struct{}

// WithCallTrace returns a context, derived from ctx, whose registry calls run t's
// hooks.
func WithCallTrace(ctx context.Context, t *CallTrace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// callTrace returns the CallTrace of ctx; a zero one (every hook nil) when none.
func callTrace(ctx context.Context) *CallTrace {
	if t, ok := ctx.Value(traceKey{}).(*CallTrace); ok && t != nil {
		return t
	}
	return &CallTrace{}
}

func (t *CallTrace) createStart(driver, sandbox string) {
	if t.CreateStart != nil {
		t.CreateStart(driver, sandbox)
	}
}

func (t *CallTrace) createDone(driver, sandbox string, err error) {
	if t.CreateDone != nil {
		t.CreateDone(driver, sandbox, err)
	}
}

func (t *CallTrace) agentReady(driver, sandbox string) {
	if t.AgentReady != nil {
		t.AgentReady(driver, sandbox)
	}
}

func (t *CallTrace) started(driver, sandbox string) {
	if t.Started != nil {
		t.Started(driver, sandbox)
	}
}
