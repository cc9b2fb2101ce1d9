package registry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/config"
)

// DefaultOrphanGrace is how old an unrecorded sandbox of ours, or an unreferenced
// file in the state dir, must be before Prune removes it (WithOrphanGrace).
// Creating a sandbox (an image pull included) is expected to take less.
const DefaultOrphanGrace = 15 * time.Minute

// now returns the time retention is judged at: the registry's clock (WithClock) plus
// its offset (WithClockOffset), in UTC.
func (r *Registry) now() time.Time { return r.clock().Add(r.offset).UTC() }

// stamp returns the time the registry records (creation, last use, removal): its
// clock without the offset, in UTC, so that looking ahead leaves no future time in
// the store or on a sandbox.
func (r *Registry) stamp() time.Time { return r.clock().UTC() }

// Causes of prune actions and expiry (PruneAction.Cause).
const (
	// CauseAge: the sandbox is older than its rule's max_age, or a full-output file
	// (ShellResult.StdoutFile) is older than output_max_age.
	CauseAge = "age"
	// CauseIdle: no exec has run in the sandbox for longer than its rule's idle_ttl.
	CauseIdle = "idle"
	// CauseInUse: an exec is running in the sandbox, so it is not idle.
	CauseInUse = "in-use"
	// CauseOrphan: the sandbox (or file) is ours, the store does not record it, and
	// no scope rule maps to it any more.
	CauseOrphan = "orphan"
	// CauseAdopt: the sandbox is ours and unrecorded (a crash between create and
	// record), and a scope rule still maps to it, so it is recorded again.
	CauseAdopt = "adopt"
	// CauseGrace: the sandbox (or file) is unreferenced but younger than the grace
	// period, so it may be in the middle of a create; it is left alone for now.
	CauseGrace = "grace"
	// CauseDrift: the sandbox no longer matches its rule (spec, driver or name
	// changed). Prune only reports it.
	CauseDrift = "drift"
	// CauseRecorded: the sandbox is recorded and within its retention limits.
	CauseRecorded = "recorded"
	// CausePool: the sandbox is a warm pool member that the store records (ready,
	// being made, or being claimed): reconcile keeps it; its pool's filler
	// (FillPools) drains and replaces members.
	CausePool = "pool"
	// CauseOwner: the sandbox carries the owner id given to Prune (PruneOptions.Owner),
	// which is not this state dir's: it was left by a lost state dir.
	CauseOwner = "owner"
)

// verdict is what retention says about one sandbox at one moment.
type verdict struct {
	action string // PruneKeep, PruneStop or PruneRemove
	cause  string
	reason string
}

// retentionVerdict applies rule's idle_ttl and max_age to a sandbox created at
// created, last used at idleSince, in state state, at now. busy says an exec is in
// flight.
func retentionVerdict(rule *config.Rule, created, idleSince time.Time, state backend.State, busy bool, now time.Time) verdict {
	ret := rule.Retention
	if ret.MaxAge > 0 && !created.IsZero() && now.Sub(created) >= ret.MaxAge {
		return verdict{PruneRemove, CauseAge, fmt.Sprintf("age %s reached max_age %s (created %s, rule %s)",
			FormatDuration(now.Sub(created)), FormatDuration(ret.MaxAge), created.Format(time.RFC3339), rule.Pos())}
	}
	if ret.IdleTTL > 0 {
		if busy {
			return verdict{PruneKeep, CauseInUse, "an exec is running in it, so it is not idle"}
		}
		if !idleSince.IsZero() && now.Sub(idleSince) >= ret.IdleTTL {
			action := PruneStop
			if ret.IdleAction == config.IdleRemove {
				action = PruneRemove
			}
			reason := fmt.Sprintf("idle since %s (%s, idle_ttl %s, idle_action %s, rule %s)",
				idleSince.Format(time.RFC3339), FormatDuration(now.Sub(idleSince)), FormatDuration(ret.IdleTTL), idleAction(ret), rule.Pos())
			if action == PruneStop && state == backend.StateStopped {
				return verdict{PruneKeep, CauseIdle, "already stopped; " + reason}
			}
			return verdict{action, CauseIdle, reason}
		}
	}
	return verdict{PruneKeep, CauseRecorded, ""}
}

func idleAction(ret config.Retention) config.IdleAction {
	if ret.IdleAction == "" {
		return config.IdleStop
	}
	return ret.IdleAction
}

// FormatDuration renders d for humans in the config's units: whole days as "7d",
// otherwise Go's form rounded to the second ("36h0m0s" → "36h", "1h30m").
func FormatDuration(d time.Duration) string {
	d = d.Round(time.Second) // first, so that 47h59m59.5s is 2d, not 1d24h
	if d >= 24*time.Hour && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	if d >= 24*time.Hour {
		days := d / (24 * time.Hour)
		return fmt.Sprintf("%dd%s", days, FormatDuration(d-days*24*time.Hour))
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// sandboxUse returns the latest LastUsed among the live records of sandbox on
// driver, and those records' sessions.
func sandboxUse(recs []record, driver, sandbox string) (last time.Time, sessions []string) {
	for _, rec := range recs {
		if rec.Driver != driver || rec.Sandbox != sandbox || !rec.Removed.IsZero() {
			continue
		}
		sessions = append(sessions, rec.Session)
		if rec.LastUsed.After(last) {
			last = rec.LastUsed
		}
	}
	return last, sessions
}

// expireOwn applies idle_ttl and max_age to the recorded sandbox of one session
// (old) before acquire uses it; the caller holds the sandbox's lock. It stops or
// removes the sandbox as retention says (a later Create then starts or recreates
// it) and returns the record as it is now (with Removed set when it removed the
// sandbox). Rules without idle_ttl and max_age cost nothing.
func (r *Registry) expireOwn(ctx context.Context, b backend.TerminalBackend, rule *config.Rule, old record) (record, error) {
	ret := rule.Retention
	if (ret.IdleTTL <= 0 && ret.MaxAge <= 0) || !old.Removed.IsZero() {
		return old, nil
	}
	now := r.now()
	idleSince := old.LastUsed
	if rule.Isolation == config.IsolationShared && ret.IdleTTL > 0 {
		recs, err := r.store.all()
		if err != nil {
			return old, err
		}
		idleSince, _ = sandboxUse(recs, old.Driver, old.Sandbox)
	}
	busy := false
	if ret.IdleTTL > 0 {
		var err error
		if busy, err = r.sandboxBusy(old.Driver, old.Sandbox); err != nil {
			return old, err
		}
	}
	// The state matters only to "already stopped"; stopping twice is harmless, so
	// no Inspect is spent on it.
	v := retentionVerdict(rule, old.Created, idleSince, backend.StateRunning, busy, now)
	v = r.notIdleIfJobs(ctx, b, old.Driver, old.Sandbox, v)
	switch v.action {
	case PruneStop:
		r.log.Info("stopping an idle sandbox before use", "session", old.Session, "sandbox", old.Sandbox, "reason", v.reason)
		if err := b.Stop(ctx, old.Sandbox, 0); err != nil {
			return old, fmt.Errorf("stopping expired sandbox %s (%s): %w", old.Sandbox, v.reason, err)
		}
		r.event(SandboxEvent{Action: EventStop, Driver: old.Driver, Sandbox: old.Sandbox, Cause: v.cause, Retention: true})
	case PruneRemove:
		r.log.Info("removing an expired sandbox before use", "session", old.Session, "sandbox", old.Sandbox, "reason", v.reason)
		if err := b.Remove(ctx, old.Sandbox); err != nil {
			return old, fmt.Errorf("removing expired sandbox %s (%s): %w", old.Sandbox, v.reason, err)
		}
		r.event(SandboxEvent{Action: EventRemove, Driver: old.Driver, Sandbox: old.Sandbox, Cause: v.cause, Retention: true})
		reason, at := v.reason, r.stamp()
		if _, err := r.store.markRemoved(old.Driver, old.Sandbox, at, reason); err != nil {
			return old, fmt.Errorf("sandbox %s is removed (%s), but recording that failed: %w", old.Sandbox, v.reason, err)
		}
		old.Removed, old.RemovedReason = at, reason
	}
	return old, nil
}

// movedReason says why a session whose rule now maps it to another sandbox (another
// driver, or another name) got a new, empty one, and what becomes of the old one.
func movedReason(old record, rule *config.Rule, sandbox string) string {
	what := fmt.Sprintf("now uses driver %s instead of %s", rule.Driver, old.Driver)
	if old.Driver == rule.Driver {
		what = fmt.Sprintf("now maps it to sandbox %s instead of %s", sandbox, old.Sandbox)
	}
	return fmt.Sprintf("its rule (%s) %s, so this sandbox is new and empty; the previous one (%s on driver %s) keeps its files and processes until berth prune removes it",
		rule.Pos(), what, old.Sandbox, old.Driver)
}

// movedBackReason says why a session runs in a sandbox it had before instead of the
// one it used last.
func movedBackReason(old record, rule *config.Rule, sandbox string) string {
	what := fmt.Sprintf("now uses driver %s instead of %s", rule.Driver, old.Driver)
	if old.Driver == rule.Driver {
		what = fmt.Sprintf("now maps it to sandbox %s instead of %s", sandbox, old.Sandbox)
	}
	return fmt.Sprintf("its rule (%s) %s, so it is back in its earlier sandbox %s on driver %s, files kept; the one it leaves (%s on driver %s) keeps its files and processes until berth prune removes it",
		rule.Pos(), what, sandbox, rule.Driver, old.Sandbox, old.Driver)
}

// recreatedReason says why a session that had a sandbox got a new one, sb: retention
// removed it, the runtime ended it (sb.EndReason, from Create: a Pod that was
// evicted or OOM-killed cannot be started again), or it was gone.
func recreatedReason(old record, driver string, sb backend.Sandbox) string {
	if old.RemovedReason != "" {
		return "its previous sandbox was removed by retention: " + old.RemovedReason + "; this one is new and empty"
	}
	if sb.EndReason != "" {
		return fmt.Sprintf("its previous sandbox %s on driver %s had ended (%s); this one is new and empty", old.Sandbox, driver, endCause(sb))
	}
	return fmt.Sprintf("its previous sandbox %s no longer existed on driver %s (removed outside berth?); this one is new and empty", old.Sandbox, driver)
}

// endCause says why sb's run ended, from its EndReason and EndMessage (which
// drivers take from the runtime; backends cleans a plugin's), for a notice:
// "OOMKilled: the memory limit was reached ...".
func endCause(sb backend.Sandbox) string {
	why := sb.EndReason
	switch sb.EndReason {
	case backend.EndOOMKilled:
		why += ": out of memory, its memory limit was reached"
	case backend.EndEvicted:
		why += " by its runtime"
	case backend.EndError:
		why += ": its agent exited with an error or was killed"
	case backend.EndCompleted:
		why += ": its agent exited"
	}
	if sb.EndMessage != "" && sb.EndMessage != sb.EndReason {
		why += ": " + sb.EndMessage
	}
	return why
}

// crashed adds to err, an exec error on driver, that the driver's plugin has
// exited and will be started again, when that is so and err does not say it yet.
func (r *Registry) crashed(driver string, err error) error {
	var dc *DriverCrashedError
	if errors.As(err, &dc) {
		return err
	}
	if errors.Is(err, backends.ErrCrashed) {
		return &DriverCrashedError{Driver: driver, Op: "the call", Err: err}
	}
	if err == nil || !errors.Is(err, backend.ErrUnavailable) || strings.Contains(err.Error(), "crashed") {
		return err
	}
	r.drvMu.Lock()
	e := r.drivers[driver]
	r.drvMu.Unlock()
	if e == nil {
		return err
	}
	e.mu.Lock()
	b := e.b
	e.mu.Unlock()
	if x, ok := b.(exiter); ok && x.Exited() {
		return &DriverCrashedError{Driver: driver, Op: "the call", Err: fmt.Errorf("its plugin process exited; berth starts it again: %w", err)}
	}
	return err
}
