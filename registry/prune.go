package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/flock"
)

// Prune actions (PruneAction.Action).
const (
	// PruneKeep leaves the sandbox or file as it is (Cause says why).
	PruneKeep = "keep"
	// PruneAdopt records an unrecorded sandbox of ours again.
	PruneAdopt = "adopt"
	// PruneStop stops the sandbox; its files stay and its next exec starts it.
	PruneStop = "stop"
	// PruneRemove removes the sandbox with its files.
	PruneRemove = "remove"
	// PruneDelete deletes a file or directory of the state dir that nothing
	// references (PruneAction.Path).
	PruneDelete = "delete"
)

// PruneOptions configure Prune.
type PruneOptions struct {
	// DryRun reports what Prune would do and changes nothing.
	DryRun bool
	// Owner, when set and not this state dir's owner id, makes Prune clean up after
	// a lost state dir: every sandbox labelled with that owner, past the grace
	// period, is removed (CauseOwner), and nothing else is touched. Empty means this
	// state dir's owner (Registry.Owner).
	Owner string
}

// PruneAction is one thing Prune did (or, in a dry run, would do) and why.
type PruneAction struct {
	// Driver and Sandbox name the sandbox; empty for file actions.
	Driver  string `json:"driver,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
	// Sessions are the sessions recorded on the sandbox.
	Sessions []string `json:"sessions,omitempty"`
	// State is the sandbox's state before the action (created, running, stopped).
	State string `json:"state,omitempty"`
	// Path is the state dir file or directory of a PruneDelete (or kept file).
	Path string `json:"path,omitempty"`
	// Action is PruneKeep, PruneAdopt, PruneStop, PruneRemove or PruneDelete.
	Action string `json:"action"`
	// Cause is the reason's kind: CauseAge, CauseIdle, CauseInUse, CauseOrphan,
	// CauseAdopt, CauseGrace, CauseDrift, CauseRecorded or CauseOwner.
	Cause string `json:"cause"`
	// Reason says why in words, with the times and settings involved.
	Reason string `json:"reason"`
	// Created is the sandbox's creation time; IdleSince its last use (zero when
	// unknown), both UTC.
	Created   time.Time `json:"created,omitzero"`
	IdleSince time.Time `json:"idle_since,omitzero"`
	// Done is set when the action was carried out (never in a dry run; not for
	// PruneKeep).
	Done bool `json:"done"`
	// Error is why the action failed, or "".
	Error string `json:"error,omitempty"`
}

// PruneDriver is one driver's line in a PruneReport.
type PruneDriver struct {
	// Name is the driver's name.
	Name string `json:"name"`
	// Sandboxes is how many sandboxes of the owner the driver listed.
	Sandboxes int `json:"sandboxes"`
	// Error is why the driver could not be started or listed (its runtime is
	// down, ...); its sandboxes were skipped. Empty when it was reconciled.
	Error string `json:"error,omitempty"`
}

// PruneReport is what Prune did.
type PruneReport struct {
	// Owner is the owner id whose sandboxes were reconciled.
	Owner string `json:"owner"`
	// DryRun is PruneOptions.DryRun.
	DryRun bool `json:"dry_run"`
	// At is the time retention was judged at: the registry clock's time of the run
	// plus its WithClockOffset (UTC).
	At time.Time `json:"at"`
	// Drivers are the configured drivers, sorted by name.
	Drivers []PruneDriver `json:"drivers"`
	// Actions are the sandboxes (by driver and name) and then the files, each with
	// what was done and why.
	Actions []PruneAction `json:"actions"`
}

// Failed reports whether a driver could not be reconciled or an action failed.
func (p *PruneReport) Failed() bool {
	for _, d := range p.Drivers {
		if d.Error != "" {
			return true
		}
	}
	for _, a := range p.Actions {
		if a.Error != "" {
			return true
		}
	}
	return false
}

// validOwner checks a PruneOptions.Owner.
func validOwner(owner string) error {
	ok := owner != "" && len(owner) <= 128
	for i := 0; ok && i < len(owner); i++ {
		c := owner[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
	}
	if !ok {
		q := fmt.Sprintf("%q", owner) // a long one shortened to its head and length
		if len(owner) > 64 {
			q = fmt.Sprintf("%q… (%d characters)", owner[:48], len(owner))
		}
		return backend.Errorf(backend.ErrInvalid, "owner id %s is not valid: an owner id is 1 to 128 characters of A-Z a-z 0-9 - _ . (a state dir's own id is 32 hex digits: see the owner of berth prune --dry-run --json, or the berth.owner label of the sandboxes left behind)", q)
	}
	return nil
}

// Prune reconciles every driver that may hold sandboxes of ours (the drivers of the
// scope rules, of the recorded sessions and of driver blocks, and known drivers with a
// dir in STATE/sandboxes: one a session moved away from) with the state store and
// applies retention now:
//
//   - sandboxes of ours that the store records get their rule's max_age and
//     idle_ttl/idle_action (an exec in flight, in any berth process, makes a sandbox
//     not idle; max_age removes it anyway). Drift is reported, not acted on.
//   - sandboxes of ours that it does not record (a crash between create and record)
//     are adopted when a scope rule still maps to them and removed otherwise, but
//     never while younger than the grace period (WithOrphanGrace), measured from
//     LabelCreated.
//   - sandboxes without our owner label are never listed, stopped or removed.
//   - per-sandbox directories (STATE/sandboxes/DRIVER/SANDBOX), busy markers, lock
//     files, agent copies and full-output files that nothing references, older than
//     the grace period, are deleted; a driver's own files not while it could not be
//     listed, lock files not while any driver could not be listed, as its sandboxes
//     may still use them. A dir that a live sandbox uses is never deleted. A live
//     session's full-output files older than output_max_age are deleted.
//
// A driver that cannot be started or listed is reported in PruneReport.Drivers and
// skipped; the rest go on. Each action holds the sandbox's lock and decides again
// under it, so it never races an exec starting in another process. Errors: an
// invalid PruneOptions.Owner (ErrInvalid), or a state dir or store that cannot be
// used; everything else is reported per driver and action.
func (r *Registry) Prune(ctx context.Context, opts PruneOptions) (*PruneReport, error) {
	if err := r.ensure(); err != nil {
		return nil, err
	}
	owner := r.owner
	foreign := false
	if opts.Owner != "" {
		if err := validOwner(opts.Owner); err != nil {
			return nil, err
		}
		owner, foreign = opts.Owner, opts.Owner != r.owner
	}
	now := r.now()
	rep := &PruneReport{Owner: owner, DryRun: opts.DryRun, At: now, Drivers: []PruneDriver{}, Actions: []PruneAction{}}
	recs, err := r.store.all()
	if err != nil {
		return nil, err
	}
	listed := map[sbKey]bool{}    // sandboxes of ours that exist after this run
	listedOK := map[string]bool{} // drivers that were listed
	allListed := true
	for _, name := range r.hostDrivers(recs) {
		pd := PruneDriver{Name: name}
		b, err := r.driver(ctx, name)
		var sbs []backend.Sandbox
		if err == nil {
			sbs, err = b.List(ctx, map[string]string{backend.LabelOwner: owner})
			if err != nil {
				err = fmt.Errorf("listing sandboxes of driver %s: %w", name, r.crashed(name, err))
			}
		}
		if err != nil {
			pd.Error = err.Error()
			allListed = false
			rep.Drivers = append(rep.Drivers, pd)
			r.log.Warn("prune: driver skipped", "driver", name, "error", err)
			continue
		}
		sort.Slice(sbs, func(i, j int) bool { return sbs[i].Name < sbs[j].Name })
		for _, sb := range sbs {
			if sb.Labels[backend.LabelOwner] != owner {
				continue // never touch what is not labelled ours, whatever List returned
			}
			pd.Sandboxes++
			key := sbKey{name, sb.Name}
			listed[key] = true
			act := r.pruneSandbox(ctx, b, name, sb, foreign, opts.DryRun, now)
			if act.Action == PruneRemove && act.Done {
				delete(listed, key)
			}
			rep.Actions = append(rep.Actions, act)
		}
		listedOK[name] = true
		rep.Drivers = append(rep.Drivers, pd)
	}
	if !foreign {
		rep.Actions = append(rep.Actions, r.pruneFiles(listed, listedOK, allListed, opts.DryRun)...)
	}
	r.logPrune(rep, opts.DryRun)
	return rep, nil
}

// logPrune logs every action of rep that changed something or failed, one line each
// (berth prune, prune --watch and berth serve's rounds alike): "prune" at info,
// "prune action failed" at warn with the error.
func (r *Registry) logPrune(rep *PruneReport, dry bool) {
	for _, a := range rep.Actions {
		if a.Action == PruneKeep && a.Error == "" {
			continue
		}
		args := []any{"action", a.Action, "driver", a.Driver, "sandbox", a.Sandbox, "path", a.Path,
			"sessions", strings.Join(a.Sessions, ","), "cause", a.Cause, "reason", a.Reason, "dry_run", dry}
		if a.Error != "" {
			r.log.Warn("prune action failed", append(args, "error", a.Error)...)
		} else {
			r.log.Info("prune", args...)
		}
	}
}

// sbKey names one sandbox: a driver and a sandbox name.
type sbKey struct{ driver, name string }

// sandboxCreated returns a sandbox's creation time: LabelCreated, else the
// runtime's CreatedAt.
func sandboxCreated(sb backend.Sandbox) time.Time {
	if t, err := time.Parse(time.RFC3339, sb.Labels[backend.LabelCreated]); err == nil {
		return t.UTC()
	}
	return sb.CreatedAt.UTC()
}

// pruneSandbox decides about one listed sandbox of the owner and, unless dry, acts.
// Outside a dry run it holds the sandbox's lock and decides on a fresh Inspect and
// store read.
func (r *Registry) pruneSandbox(ctx context.Context, b backend.TerminalBackend, driver string, sb backend.Sandbox, foreign, dry bool, now time.Time) PruneAction {
	act := PruneAction{Driver: driver, Sandbox: sb.Name, State: string(sb.State), Action: PruneKeep}
	failed := func(err error) PruneAction {
		act.Error = err.Error()
		return act
	}
	removed := false
	if !dry && !foreign {
		lock, err := flock.Lock(ctx, r.lockPath(sb.Name))
		if err != nil {
			return failed(err)
		}
		defer func() { lock.Unlock(removed) }()
		fresh, err := b.Inspect(ctx, sb.Name)
		if errors.Is(err, backend.ErrNotFound) {
			act.Cause, act.Reason = CauseRecorded, "removed meanwhile by another berth process"
			return act
		} else if err != nil {
			return failed(fmt.Errorf("inspecting sandbox %s: %w", sb.Name, err))
		}
		if fresh.Labels[backend.LabelOwner] != sb.Labels[backend.LabelOwner] {
			act.Cause, act.Reason = CauseRecorded, "replaced meanwhile by a sandbox of another owner; left alone"
			return act
		}
		sb = fresh
		act.State = string(sb.State)
	}
	recs, err := r.store.all()
	if err != nil {
		return failed(err)
	}
	created := sandboxCreated(sb)
	if t, ok := claimTime(recs, driver, sb.Name); ok {
		created = t // a claimed pool member's retention counts from the claim
	}
	act.Created = created
	young := now.Sub(created) < r.grace
	graceReason := fmt.Sprintf("created %s ago (%s), within the grace period %s: it may be in the middle of a create",
		FormatDuration(now.Sub(created)), created.Format(time.RFC3339), FormatDuration(r.grace))
	var rule *config.Rule
	switch last, sessions := sandboxUse(recs, driver, sb.Name); {
	case foreign:
		if young {
			act.Cause, act.Reason = CauseGrace, "unrecorded sandbox of owner "+sb.Labels[backend.LabelOwner]+" "+graceReason
		} else {
			act.Action, act.Cause = PruneRemove, CauseOwner
			act.Reason = fmt.Sprintf("carries owner %s, not this state dir's (%s): left behind by a lost state dir (--owner)", sb.Labels[backend.LabelOwner], r.owner)
		}
	case len(sessions) > 0:
		act.Sessions, act.IdleSince = sessions, last
		var drift string
		rule, drift = r.ruleOf(driver, sb, sessions)
		if rule == nil {
			act.Cause, act.Reason = CauseDrift, drift
			break
		}
		busy, err := r.sandboxBusy(driver, sb.Name)
		if err != nil {
			return failed(err)
		}
		v := retentionVerdict(rule, created, last, sb.State, busy, now)
		if sb.State == backend.StateRunning {
			v = r.notIdleIfJobs(ctx, b, driver, sb.Name, v)
		}
		act.Action, act.Cause, act.Reason = v.action, v.cause, v.reason
		if v.action == PruneKeep && drift != "" && v.cause == CauseRecorded {
			act.Cause, act.Reason = CauseDrift, drift
		} else if v.cause == CauseRecorded {
			act.Reason = fmt.Sprintf("recorded for %s, last used %s; within its retention", strings.Join(sessions, ", "), last.Format(time.RFC3339))
		}
	case sb.Labels[backend.LabelPool] != "":
		act.Action, act.Cause, act.Reason = r.prunePoolMember(driver, sb, young, graceReason, now)
	case young:
		act.Cause, act.Reason = CauseGrace, "unrecorded; "+graceReason
	default:
		if rule = r.ruleMapping(driver, sb); rule != nil {
			act.Action, act.Cause = PruneAdopt, CauseAdopt
			act.Reason = fmt.Sprintf("ours but unrecorded (a crash between create and record?), and rule %s still maps %q to it", rule.Pos(), sb.Labels[backend.LabelSession])
			if v := retentionVerdict(rule, created, time.Time{}, sb.State, false, now); v.action == PruneRemove {
				act.Action, act.Cause, act.Reason = v.action, v.cause, v.reason
			}
		} else {
			act.Action, act.Cause = PruneRemove, CauseOrphan
			act.Reason = fmt.Sprintf("ours but unrecorded, and no scope rule maps %q to it any more", sb.Labels[backend.LabelSession])
		}
	}
	if dry || act.Action == PruneKeep {
		return act
	}
	switch act.Action {
	case PruneStop:
		if err := b.Stop(ctx, sb.Name, 0); err != nil {
			return failed(fmt.Errorf("stopping sandbox %s: %w", sb.Name, r.crashed(driver, err)))
		}
	case PruneRemove:
		dir := r.sandboxDir(driver, sb.Name)
		if err := b.Remove(ctx, sb.Name); err != nil {
			return failed(fmt.Errorf("removing sandbox %s: %w", sb.Name, r.crashed(driver, err)))
		}
		removed = !foreign
		if !foreign {
			// Records stay, marked, so the sessions' next exec says its sandbox is new.
			if _, err := r.store.markRemoved(driver, sb.Name, r.stamp(), act.Reason); err != nil {
				return failed(fmt.Errorf("sandbox %s is removed, but recording that failed: %w", sb.Name, err))
			}
			os.Remove(r.busyPath(driver, sb.Name))
			if sb.Labels[backend.LabelPool] != "" {
				r.store.poolDrop(driver, sb.Name, false)
			}
			if err := os.RemoveAll(dir); err != nil {
				r.log.Warn("deleting sandbox dir", "dir", dir, "error", err)
			}
		}
	case PruneAdopt:
		if rule.Isolation == config.IsolationSession {
			key := sb.Labels[backend.LabelSession]
			rec := record{Session: key, Driver: driver, Sandbox: sb.Name, Scope: rule.Glob,
				SpecHash: sb.Labels[backend.LabelSpecHash], Created: created, LastUsed: r.stamp()}
			if caps, err := r.capabilities(ctx, b); err == nil {
				rec.Agent = caps.Agent
			}
			wrote, err := r.store.putIfAbsent(rec)
			if err != nil {
				return failed(fmt.Errorf("recording adopted sandbox %s: %w", sb.Name, err))
			}
			if wrote {
				r.store.touch(key, sb.Name, rec.LastUsed) // a last use left from before counts no more
			}
			act.Sessions = []string{key}
		}
	}
	act.Done = true
	r.event(SandboxEvent{Action: act.Action, Driver: driver, Sandbox: sb.Name, Cause: act.Cause, Retention: true})
	return act
}

// ruleOf returns the rule that maps one of sessions (recorded on sb) to sb on
// driver, with a drift note when sb's spec differs from it. When no rule maps them
// there any more it returns the rule whose glob is sb's LabelScope (if it still
// exists) and says so in drift; nil when there is none.
func (r *Registry) ruleOf(driver string, sb backend.Sandbox, sessions []string) (*config.Rule, string) {
	if sb.Labels[backend.LabelPool] != "" {
		// A claimed warm pool member: named by its id, judged against PoolHash.
		for _, s := range sessions {
			rule, _, err := r.cfg.Match(s)
			if err != nil || rule.Driver != driver {
				continue
			}
			if h := sb.Labels[backend.LabelSpecHash]; h != "" && h != rule.PoolHash(r.owner) {
				return rule, fmt.Sprintf("its spec differs from rule %s's (the config changed since it was created); berth rm %s rebuilds it on the next exec", rule.Pos(), s)
			}
			return rule, ""
		}
	}
	for _, s := range sessions {
		rule, _, err := r.cfg.Match(s)
		if err != nil || rule.Driver != driver || rule.SandboxName(r.owner, s) != sb.Name {
			continue
		}
		if h := sb.Labels[backend.LabelSpecHash]; h != "" && h != rule.Spec(r.owner, s).Labels[backend.LabelSpecHash] {
			return rule, fmt.Sprintf("its spec differs from rule %s's (the config changed since it was created); berth rm %s rebuilds it on the next exec", rule.Pos(), s)
		}
		return rule, ""
	}
	drift := fmt.Sprintf("no scope rule maps %s to this sandbox on driver %s any more; their next exec moves to a new sandbox and this one is then removed as an orphan", strings.Join(sessions, ", "), driver)
	for i := range r.cfg.Rules {
		if r.cfg.Rules[i].Glob == sb.Labels[backend.LabelScope] {
			return &r.cfg.Rules[i], drift
		}
	}
	return nil, drift
}

// claimTime returns the creation time of the live pooled records of sandbox on
// driver (the claim), if there is one.
func claimTime(recs []record, driver, sandbox string) (time.Time, bool) {
	for _, rec := range recs {
		if rec.Pooled && rec.Driver == driver && rec.Sandbox == sandbox && rec.Removed.IsZero() && !rec.Created.IsZero() {
			return rec.Created, true
		}
	}
	return time.Time{}, false
}

// prunePoolMember decides about a warm pool member that no session records: kept
// while the store's pool bucket has it (ready, being made, or claimed a moment
// ago), removed when its claim was never recorded (its berth died mid-claim) or the
// store does not know it, once past the grace period. A member is never a leak, and
// never adopted by a session.
func (r *Registry) prunePoolMember(driver string, sb backend.Sandbox, young bool, graceReason string, now time.Time) (action, cause, reason string) {
	entries, err := r.store.poolAll()
	if err != nil {
		return PruneKeep, CauseInUse, fmt.Sprintf("warm pool member; the store's pool could not be read: %v", err)
	}
	for _, e := range entries {
		if e.Driver != driver || e.Sandbox != sb.Name {
			continue
		}
		switch {
		case e.Claimed.IsZero() && e.Ready.IsZero():
			return PruneKeep, CausePool, fmt.Sprintf("warm pool member of scope %q, being made since %s", e.Scope, e.Created.Format(time.RFC3339))
		case e.Claimed.IsZero():
			return PruneKeep, CausePool, fmt.Sprintf("warm pool member of scope %q, ready since %s", e.Scope, e.Ready.Format(time.RFC3339))
		case now.Sub(e.Claimed) < r.grace:
			return PruneKeep, CausePool, fmt.Sprintf("warm pool member claimed by session %q at %s; its record is being written", e.Session, e.Claimed.Format(time.RFC3339))
		}
		return PruneRemove, CauseOrphan, fmt.Sprintf("warm pool member claimed by session %q at %s, but the claim was never recorded (the claiming berth died); a member is never handed to another session", e.Session, e.Claimed.Format(time.RFC3339))
	}
	if young {
		return PruneKeep, CauseGrace, "warm pool member that the store does not record; " + graceReason
	}
	return PruneRemove, CauseOrphan, "warm pool member that the store does not record (left by a berth that died while making it, or by a drained pool)"
}

// ruleMapping returns the rule that still maps sb's LabelSession to sb on driver,
// or nil.
func (r *Registry) ruleMapping(driver string, sb backend.Sandbox) *config.Rule {
	key := sb.Labels[backend.LabelSession]
	if key == "" {
		return nil
	}
	for i := range r.cfg.Rules {
		rule := &r.cfg.Rules[i]
		if rule.Isolation == config.IsolationShared && rule.Driver == driver && rule.Name == key && config.SharedSandboxName(r.owner, key) == sb.Name {
			return rule
		}
	}
	if rule, _, err := r.cfg.Match(key); err == nil && rule.Isolation == config.IsolationSession && rule.Driver == driver && config.SandboxName(r.owner, key) == sb.Name {
		return rule
	}
	return nil
}

// pruneFiles deletes state dir files that nothing references and that were last
// modified longer ago than the grace period (real time: WithClock does not date
// files): per-sandbox dirs and busy markers (see hostdirs.go), lock files, agent
// copies, full-output files and last-use files. listed holds the sandboxes of ours
// that the drivers listed (less those this run removed), listedOK the drivers that
// could be listed. A driver's own files are kept while it cannot be listed (or is
// not known); lock files, which do not say whose they are, while any driver cannot
// be listed.
func (r *Registry) pruneFiles(listed map[sbKey]bool, listedOK map[string]bool, allListed, dry bool) []PruneAction {
	var out []PruneAction
	recs, err := r.store.all()
	if err != nil {
		return []PruneAction{{Action: PruneKeep, Path: r.stateDir, Cause: CauseRecorded, Error: err.Error()}}
	}
	// Files are dated by the file system, in real time, whatever the registry's
	// clock says: a shifted clock must not make a file being written look old.
	old := func(fi os.FileInfo) bool { return time.Since(fi.ModTime()) >= r.grace }
	live := liveSandboxes(recs)
	entries, err := r.store.poolAll()
	if err != nil {
		return []PruneAction{{Action: PruneKeep, Path: r.stateDir, Cause: CauseRecorded, Error: err.Error()}}
	}
	for _, e := range entries {
		live[sbKey{e.Driver, e.Sandbox}] = true // a member's files go with its entry
	}
	byName := map[string][]fileCandidate{}
	add := func(c fileCandidate) { byName[c.name] = append(byName[c.name], c) }

	// The current layout, per driver: STATE/sandboxes/DRIVER/SANDBOX.
	for _, d := range r.driverDirs() {
		root := filepath.Join(r.stateDir, "sandboxes", d)
		if !listedOK[d] {
			why := "could not be listed"
			if !slices.Contains(r.known, d) {
				why = "is not known (not built in, not found as a plugin)"
			}
			out = append(out, PruneAction{Path: root, Action: PruneKeep, Cause: CauseInUse,
				Reason: fmt.Sprintf("driver %s %s: its sandboxes may use these dirs", d, why)})
			continue
		}
		ents, _ := os.ReadDir(root)
		if len(ents) == 0 {
			out = append(out, r.pruneDriverDir(root, d, listed, old, dry)...)
		}
		for _, e := range ents {
			k := sbKey{d, e.Name()}
			if !listed[k] && !live[k] && backend.ValidateSandboxName(k.name) == nil {
				add(fileCandidate{path: r.sandboxDir(d, k.name), name: k.name, driver: d, kind: fileDir})
			}
		}
	}
	// STATE/locks: SANDBOX.DRIVER.busy per driver; SANDBOX.lock per name.
	locks, _ := os.ReadDir(filepath.Join(r.stateDir, "locks"))
	for _, l := range locks {
		p := filepath.Join(r.stateDir, "locks", l.Name())
		rest, busyFile := strings.CutSuffix(l.Name(), ".busy")
		if x, d, ok := strings.Cut(rest, "."); busyFile && ok {
			k := sbKey{d, x}
			if !listed[k] && !live[k] && (listedOK[d] || allListed) && backend.ValidateSandboxName(x) == nil {
				add(fileCandidate{path: p, name: x, driver: d, kind: fileBusy})
			}
			continue
		}
		if !allListed {
			continue
		}
		x, ok := strings.CutSuffix(l.Name(), ".lock")
		if ok && backend.ValidateSandboxName(x) == nil && !nameUsed(x, listed, recs) {
			add(fileCandidate{path: p, name: x, kind: fileNameLock})
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		out = append(out, r.pruneNameFiles(name, byName[name], old, dry)...)
	}
	out = append(out, r.pruneAgentCopies(old, dry)...)
	out = append(out, r.pruneOutputs(recs, old, dry)...)
	out = append(out, r.pruneLastUse(recs, old, dry)...)
	out = append(out, r.pruneSocketDirs(dry)...)
	return out
}

// pruneSocketDirs deletes the plugin socket directories (backends.PluginSocketBase)
// that no running berth holds and that are older than the grace period (at least a
// minute): those of a berth killed while it ran a driver plugin. They are the invoking user's, shared by
// all of the user's state dirs.
func (r *Registry) pruneSocketDirs(dry bool) []PruneAction {
	// go-plugin makes a dir a moment before its berth locks it; a minute covers
	// that moment on any machine, whatever grace the caller chose.
	stale, err := backends.PruneSocketDirs(max(r.grace, time.Minute), dry)
	if err != nil {
		base, _ := backends.PluginSocketBase()
		return []PruneAction{{Path: base, Action: PruneKeep, Cause: CauseInUse, Error: err.Error()}}
	}
	var out []PruneAction
	for _, s := range stale {
		a := PruneAction{Path: s.Path, Action: PruneDelete, Cause: CauseOrphan, Done: s.Removed,
			Reason: "socket dir of a driver plugin whose berth process is gone"}
		if s.Err != nil {
			a.Error = s.Err.Error()
		}
		out = append(out, a)
	}
	return out
}

// pruneLastUse deletes the last-use files (STATE/lastuse/HASH, see store.touch) of
// sessions that have no record any more.
func (r *Registry) pruneLastUse(recs []record, old func(os.FileInfo) bool, dry bool) []PruneAction {
	live := map[string]bool{}
	for _, rec := range recs {
		live[filepath.Base(r.store.lastUsePath(rec.Session))] = true
	}
	dir := r.store.lastUseDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []PruneAction
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() || live[e.Name()] || !old(fi) {
			continue
		}
		a := PruneAction{Path: p, Action: PruneDelete, Cause: CauseOrphan, Reason: "last-use time of a session that has no record any more"}
		if !dry {
			if err := os.Remove(p); err != nil {
				a.Error = err.Error()
			} else {
				a.Done = true
			}
		}
		out = append(out, a)
	}
	return out
}

// fileCandidate is a state dir file of one sandbox name that pruneFiles found
// unreferenced.
type fileCandidate struct {
	path   string
	name   string // the sandbox name
	driver string // for fileDir and fileBusy
	kind   int
}

// Kinds of fileCandidate.
const (
	fileDir      = iota // STATE/sandboxes/DRIVER/SANDBOX
	fileBusy            // STATE/locks/SANDBOX.DRIVER.busy
	fileNameLock        // STATE/locks/SANDBOX.lock
)

// liveSandboxes returns the sandboxes that recs name and retention has not removed.
func liveSandboxes(recs []record) map[sbKey]bool {
	live := map[sbKey]bool{}
	for _, rec := range recs {
		if rec.Removed.IsZero() {
			live[sbKey{rec.Driver, rec.Sandbox}] = true
		}
	}
	return live
}

// nameUsed reports whether a listed sandbox or a live record, on any driver, has name.
func nameUsed(name string, listed map[sbKey]bool, recs []record) bool {
	for k := range listed {
		if k.name == name {
			return true
		}
	}
	return slices.ContainsFunc(recs, func(rec record) bool { return rec.Sandbox == name && rec.Removed.IsZero() })
}

// pruneDriverDir deletes the empty STATE/sandboxes/DRIVER dir once it is older than
// the grace period, unless the driver still has sandboxes of ours (the dir may be the
// mark that makes prune look at that driver: see markDriver).
func (r *Registry) pruneDriverDir(root, driver string, listed map[sbKey]bool, old func(os.FileInfo) bool, dry bool) []PruneAction {
	for k := range listed {
		if k.driver == driver {
			return nil
		}
	}
	fi, err := os.Lstat(root)
	if err != nil || !old(fi) {
		return nil
	}
	a := PruneAction{Path: root, Action: PruneDelete, Cause: CauseOrphan, Reason: fmt.Sprintf("empty, and driver %s has no sandboxes of ours", driver)}
	if !dry {
		if err := os.Remove(root); err != nil {
			if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
				return nil // a sandbox is being made there right now
			}
			a.Error = err.Error()
		} else {
			a.Done = true
		}
	}
	return []PruneAction{a}
}

// pruneOutputs deletes the full-output files (STATE/output/SESSION-HASH/) of
// sessions that no longer have a sandbox (no live record names them), and those of
// live sessions older than output_max_age.
func (r *Registry) pruneOutputs(recs []record, old func(os.FileInfo) bool, dry bool) []PruneAction {
	live := map[string]bool{}
	for _, rec := range recs {
		if rec.Removed.IsZero() {
			live[filepath.Base(filepath.Dir(r.outputPath(rec.Session, "x")))] = true
		}
	}
	dir := filepath.Join(r.stateDir, "output")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []PruneAction
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() {
			continue
		}
		if live[e.Name()] {
			out = append(out, r.pruneOldOutputs(p, dry)...)
			continue
		}
		if !old(fi) {
			continue
		}
		a := PruneAction{Path: p, Action: PruneDelete, Cause: CauseOrphan, Reason: "full-output files of a session that no longer has a sandbox"}
		if !dry {
			if err := os.RemoveAll(p); err != nil {
				a.Error = err.Error()
			} else {
				a.Done = true
			}
		}
		out = append(out, a)
	}
	return out
}

// pruneOldOutputs deletes the full-output files in dir (one live session's) last
// modified longer ago than output_max_age, in real time like every file age.
func (r *Registry) pruneOldOutputs(dir string, dry bool) []PruneAction {
	maxAge := r.cfg.OutputMaxAge
	if maxAge <= 0 {
		maxAge = config.DefaultOutputMaxAge
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []PruneAction
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() || time.Since(fi.ModTime()) <= maxAge {
			continue
		}
		p := filepath.Join(dir, e.Name())
		a := PruneAction{Path: p, Action: PruneDelete, Cause: CauseAge,
			Reason: fmt.Sprintf("full-output file older than output_max_age %s", FormatDuration(maxAge))}
		if !dry {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				a.Error = err.Error()
			} else {
				a.Done = true
			}
		}
		out = append(out, a)
	}
	return out
}

// pruneNameFiles deletes files of sandbox name that pruneFiles found unreferenced,
// under the name's lock, after deciding again on a fresh store read and busy check.
// While one of them is younger than the grace period (a sandbox of the name may be in
// the middle of a create) all are kept.
func (r *Registry) pruneNameFiles(name string, cands []fileCandidate, old func(os.FileInfo) bool, dry bool) []PruneAction {
	var present []fileCandidate
	for _, c := range cands {
		fi, err := os.Lstat(c.path)
		if err != nil {
			continue
		}
		if !old(fi) {
			return []PruneAction{{Path: c.path, Action: PruneKeep, Cause: CauseGrace,
				Reason: fmt.Sprintf("unreferenced, but younger than the grace period %s: a sandbox may be in the middle of a create", FormatDuration(r.grace))}}
		}
		present = append(present, c)
	}
	mk := func(c fileCandidate) PruneAction {
		reason := fmt.Sprintf("no session record or sandbox of ours is named %s", name)
		switch c.kind {
		case fileDir, fileBusy:
			reason = fmt.Sprintf("no session record or sandbox of ours is named %s on driver %s", name, c.driver)
		}
		return PruneAction{Path: c.path, Action: PruneDelete, Cause: CauseOrphan, Reason: reason}
	}
	if len(present) == 0 {
		return nil
	}
	if dry {
		var out []PruneAction
		for _, c := range present {
			out = append(out, mk(c))
		}
		return out
	}
	lockExisted := fileExists(r.lockPath(name))
	lock, ok, err := flock.TryLock(r.lockPath(name))
	if err != nil || !ok {
		return nil // in use right now: next time
	}
	// Decide again under the lock: a create may have recorded a sandbox meanwhile,
	// or an exec be running in one.
	recs, err := r.store.all()
	if err != nil {
		lock.Unlock(false)
		return nil
	}
	live := liveSandboxes(recs)
	removeLock := !lockExisted
	var out []PruneAction
	for _, c := range present {
		switch c.kind {
		case fileDir, fileBusy:
			if busy, err := isBusy(r.busyPath(c.driver, name)); live[sbKey{c.driver, name}] || err != nil || busy {
				continue
			}
		case fileNameLock:
			if nameUsed(name, nil, recs) {
				continue
			}
		}
		a := mk(c)
		if c.kind == fileNameLock {
			removeLock, a.Done = true, true // removed by unlock below
		} else if err := os.RemoveAll(c.path); err != nil {
			a.Error = err.Error()
		} else {
			a.Done = true
		}
		out = append(out, a)
	}
	lock.Unlock(removeLock)
	return out
}

// isHash reports whether name is a lowercase hex SHA-256, the name of an agent copy.
func isHash(name string) bool {
	if len(name) != 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// pruneAgentCopies deletes agent copies (STATE/agent/bin/HASH) that no sandbox
// dir links to any more and that are not this registry's current agent binary.
func (r *Registry) pruneAgentCopies(old func(os.FileInfo) bool, dry bool) []PruneAction {
	dir := filepath.Join(r.stateDir, "agent", "bin")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	current := ""
	var out []PruneAction
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() || !old(fi) || !isHash(e.Name()) {
			continue // temporary files of an Install in progress are not copies yet
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || st.Nlink > 1 {
			continue // a sandbox dir still links it
		}
		if current == "" {
			current = currentAgentHash(r.stateDir, r.agentSrc)
		}
		if e.Name() == current {
			continue
		}
		a := PruneAction{Path: p, Action: PruneDelete, Cause: CauseOrphan, Reason: "agent copy that no sandbox links to and that is not the current agent binary"}
		if !dry {
			if err := os.Remove(p); err != nil {
				a.Error = err.Error()
			} else {
				a.Done = true
			}
		}
		out = append(out, a)
	}
	return out
}
