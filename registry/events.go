package registry

// SandboxEvent is one change a registry made to a sandbox, reported to the hook of
// WithSandboxEvents: berth serve counts them in its metrics. Only changes that were
// carried out are reported (never a dry run's, never a failed call's).
type SandboxEvent struct {
	// Action is EventCreate, EventStop, EventRemove or EventAdopt.
	Action string
	// Driver and Sandbox name the sandbox.
	Driver  string
	Sandbox string
	// Cause says why: for a create CreateNew, CreateRecreated or CreateMoved; for a
	// remove asked for by a call RemoveAsked, RemoveRecreate, RemoveClose,
	// RemoveFailedCreate or RemoveStranded; for retention's actions their Cause (CauseIdle, CauseAge,
	// CauseOrphan, CauseAdopt, CauseDrift, ...).
	Cause string
	// Retention is set for the actions of retention and reconcile (Prune, and the
	// expiry that a call applies to the session it touches).
	Retention bool
}

// SandboxEvent actions.
const (
	EventCreate = "create"
	EventStop   = "stop"
	EventRemove = "remove"
	EventAdopt  = "adopt"
)

// SandboxEvent causes of creates and of removes that calls ask for.
const (
	// CreateNew: the session had no sandbox.
	CreateNew = "new"
	// CreateRecreated: the session's sandbox had been removed (by retention, by
	// berth recreate, outside berth) and this one is new and empty.
	CreateRecreated = "recreated"
	// CreateMoved: the session's rule now maps it to another sandbox.
	CreateMoved = "moved"
	// RemoveAsked: berth rm (RemoveSession).
	RemoveAsked = "rm"
	// RemoveRecreate: berth recreate, exec --recreate (Recreate).
	RemoveRecreate = "recreate"
	// RemoveClose: berth close of a session whose rule says on_close = "remove".
	RemoveClose = "close"
	// RemoveFailedCreate: a sandbox this call created, removed again because the call
	// failed after the create (nothing half-created is left).
	RemoveFailedCreate = "failed_create"
	// RemoveStranded: a sandbox of ours whose host-side files (its agent's token and
	// socket dir) were gone, or whose agent would not take them, so that no call could
	// reach it: removed so that the call makes a new one.
	RemoveStranded = "stranded"
)

// WithSandboxEvents makes the registry report every sandbox it creates, stops,
// removes or adopts to hook, synchronously from the goroutine that made the change
// (so hook must be quick and safe for concurrent use). Default (and nil): nothing
// is reported.
func WithSandboxEvents(hook func(SandboxEvent)) Option {
	return func(o *options) error {
		o.onSandbox = hook
		return nil
	}
}

// event reports ev to the WithSandboxEvents hook, if any.
func (r *Registry) event(ev SandboxEvent) {
	if r.onSandbox != nil {
		r.onSandbox(ev)
	}
}
