package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-sh/berth/backend"
)

// A create is one unit: the driver's Create and the host dir it uses (the agent's
// token and socket dir) are both there or both gone. A caller may go away at any
// moment (a client of berth serve that disconnects, a context that is cancelled);
// the runtime may still finish what a cancelled request asked for (dockerd completes
// a container whose client went away). So:
//
//   - the driver's Create runs on a context that the caller's cancel does not reach
//     (createDetached, bounded by createBound): it ends as the driver makes it end,
//     and the call then fails on its cancelled context at its next step, which undoes
//     the sandbox it made (undo) as for any failed call;
//   - a Create that failed is cleared on a fresh bounded context
//     (clearFailedCreate): a sandbox of ours that the call made is removed before the
//     host dir goes, and the host dir stays when that cannot be done or known;
//   - a sandbox of ours whose host dir is gone, or that holds a token other than its
//     host dir's, cannot be reached by anything: the next call removes it and makes a
//     new one (removeStranded, and the retry in createIn), with a Recreated notice.

// createBound bounds a driver's Create that runs on after its caller has gone: above
// every driver's own bounds on a start (an agent's answer, a Pod's start_timeout),
// below forever, so that a Create that hangs lets go of the sandbox's lock at last.
const createBound = 10 * time.Minute

// cleanupBound bounds the clean-up of a failed or abandoned create (an Inspect and
// a Remove).
const cleanupBound = 2 * time.Minute

// detached returns a context that carries ctx's values but not its cancel or
// deadline, bounded by d.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// createDetached runs b's Create of req on a detached context (see above),
// retrying it once on a restarted plugin when the driver's plugin crashed (again),
// and runs the call trace's hooks around it. It returns the driver that answered.
func (r *Registry) createDetached(ctx context.Context, driver string, b backend.TerminalBackend, req backend.CreateRequest) (backend.Sandbox, backend.TerminalBackend, error) {
	name := req.Spec.Name
	tr := callTrace(ctx)
	tr.createStart(driver, name)
	cctx, cancel := detached(ctx, createBound)
	defer cancel()
	var sb backend.Sandbox
	b, err := r.again(cctx, driver, "create sandbox "+name, b, func(b backend.TerminalBackend) (err error) {
		sb, err = b.Create(cctx, req)
		return err
	})
	tr.createDone(driver, name, err)
	return sb, b, err
}

// clearFailedCreate clears what a failed Create of p's sandbox may have left, on a
// fresh bounded context: a sandbox of ours of its name is removed when this call
// made it (existed is false: there was none before) or when no record names it
// (removedOld then: it was there before and no call had used it). cleared reports
// that no sandbox of ours that may use p's host dir is there any more (so the dir
// may go); it is false when the driver cannot tell, or cannot remove it, and when
// the sandbox is a recorded one that stays.
func (r *Registry) clearFailedCreate(ctx context.Context, p *pending, existed bool) (cleared, removedOld bool) {
	name := p.spec.Name
	cctx, cancel := detached(ctx, cleanupBound)
	defer cancel()
	sb, err := p.b.Inspect(cctx, name)
	switch {
	case errors.Is(err, backend.ErrNotFound):
		return true, false
	case err != nil:
		r.log.Warn("a create failed and the driver cannot say whether it left a sandbox; its host dir is kept", "sandbox", name, "driver", p.driver, "error", err)
		return false, false
	case sb.Labels[backend.LabelOwner] != r.owner:
		return true, false // not ours: Create said so (ErrConflict); nothing of ours uses the dir
	}
	if existed {
		if onDriver, _ := r.recorded(p.driver, name); onDriver {
			return false, false // a session's sandbox that could not be started: it stays
		}
	}
	if err := p.b.Remove(cctx, name); err != nil {
		r.log.Error("removing the sandbox that a failed create left; its host dir is kept", "sandbox", name, "driver", p.driver, "error", err)
		return false, false
	}
	cause := RemoveFailedCreate
	if existed {
		cause = RemoveStranded
	}
	r.event(SandboxEvent{Action: EventRemove, Driver: p.driver, Sandbox: name, Cause: cause})
	r.agents.forget(sbKey{p.driver, name})
	return true, existed
}

// removeStranded removes p's sandbox, which is ours but cannot be reached (why), on
// a fresh bounded context: the call goes on to make a new one.
func (r *Registry) removeStranded(ctx context.Context, p *pending, why string) error {
	name := p.spec.Name
	r.log.Warn("removing a sandbox of ours that cannot be reached, to make a new one", "sandbox", name, "driver", p.driver, "reason", why)
	cctx, cancel := detached(ctx, cleanupBound)
	defer cancel()
	if err := p.b.Remove(cctx, name); err != nil {
		return fmt.Errorf("sandbox %s on driver %s cannot be reached (%s) and removing it failed: %w; remove it by hand", name, p.driver, why, err)
	}
	r.event(SandboxEvent{Action: EventRemove, Driver: p.driver, Sandbox: name, Cause: RemoveStranded})
	r.agents.forget(sbKey{p.driver, name})
	return nil
}
