package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/flock"
)

// Warm pools (a rule's pool block; docs/pools.md).
//
// A long-lived registry (berth serve; a library user calling RunPools or FillPools)
// keeps, for every rule with a pool, Size sandboxes of the rule's spec created and
// started, their agents answering. Such a member is named by a random id
// (config.PoolMemberName) and labelled LabelPool = id, LabelScope = the rule's
// glob and LabelSpecHash = the rule's PoolHash; it has no LabelSession, since no
// session has it yet and Docker cannot change a container's labels later. The
// store's "pool" bucket records every member from before its create (poolEntry):
// being created, ready, or claimed.
//
// A session of the rule that has no sandbox yet (or whose sandbox retention removed,
// or that vanished) picks the oldest ready member whose lock is free (one that
// another claim or a drain holds is passed over), takes the lock, dials its agent
// unless the registry holds a connection to it, and claims it in one store
// transaction (poolTake) that writes the session's record, naming the member
// (record.Pooled) with the claim's time as its creation (max_age and idle_ttl count
// from the claim), and deletes the member's pool entry. Two claims, in any processes, never get the same member; the claim is
// durable before the session's first command runs in the member, and costs one
// store commit. If the call fails before its command starts, the session's record is
// put back as it was (poolUntake) and the member is removed: a member is never
// handed to a second session. With no ready member (a miss) the session's sandbox
// is created as without a pool. Any registry claims (the CLI, embedded, too: the
// store says which members exist); only the one that runs RunPools refills.
//
// Reconcile (Prune) keeps members that the store records, removes members that it
// does not (left by a filler that died before writing their entry, or claimed by an
// earlier berth that died between its claim and its record) once they are older
// than the grace period, and never counts a member as a leak. FillPools drains members whose rule
// is gone or whose spec changed (drift), and replaces members older than max_idle.

// PoolEvent is one thing that happened to a warm pool, reported to the hook of
// WithPoolEvents: berth serve counts them in its metrics.
type PoolEvent struct {
	// Kind is PoolClaim, PoolMiss, PoolReady or PoolRemove.
	Kind string
	// Scope is the rule's glob, Driver its driver.
	Scope  string
	Driver string
	// Sandbox is the member (empty for PoolMiss).
	Sandbox string
	// Session is the claiming session (PoolClaim, PoolMiss).
	Session string
	// Took is, for PoolReady, how long the member took from its reservation to its
	// agent's answer (the refill time).
	Took time.Duration
	// Cause is, for PoolRemove, why: PoolDrift, PoolIdle, PoolFailed, PoolStale.
	Cause string
}

// PoolEvent kinds and PoolRemove causes.
const (
	// PoolClaim: a session claimed a member.
	PoolClaim = "claim"
	// PoolMiss: a session of a rule with a pool found no ready member and had its
	// sandbox created as without a pool.
	PoolMiss = "miss"
	// PoolReady: a new member is created and its agent answers.
	PoolReady = "ready"
	// PoolRemove: a member left the pool without a claim.
	PoolRemove = "remove"

	// PoolDrift: the member's rule changed (its spec hash, driver or pool block) or
	// is gone: the pool is drained and refilled.
	PoolDrift = "drift"
	// PoolIdle: the member waited longer than the pool's max_idle.
	PoolIdle = "max_idle"
	// PoolFailed: making the member failed (its create, or its agent's answer).
	PoolFailed = "failed"
	// PoolStale: the member's entry was left by a filler or claim that did not
	// finish (a berth that died) and is older than the grace period.
	PoolStale = "stale"
)

// WithPoolEvents makes the registry report what happens to its warm pools to hook,
// synchronously from the goroutine that did it (hook must be quick and safe for
// concurrent use). Default (and nil): nothing is reported.
func WithPoolEvents(hook func(PoolEvent)) Option {
	return func(o *options) error {
		o.onPool = hook
		return nil
	}
}

func (r *Registry) poolEvent(ev PoolEvent) {
	if r.onPool != nil {
		r.onPool(ev)
	}
}

// PoolStatus is one rule's pool, as Pools reports it.
type PoolStatus struct {
	// Scope is the rule's glob, Position its "file:line:col"; Driver its driver.
	Scope    string
	Position string
	Driver   string
	// Size and MaxIdle are the rule's pool block (MaxIdle 0: never replaced).
	Size    int
	MaxIdle time.Duration
	// Ready counts members ready to be claimed, Creating those being made, Claiming
	// those claimed but not recorded (left by a berth that claimed in two
	// transactions, which Prune removes past the grace period; this one claims in
	// one, poolTake, so it is 0 unless such a store is reused). Draining
	// counts members of this rule's scope and driver left from an earlier spec
	// (drift), which FillPools removes.
	Ready    int
	Creating int
	Claiming int
	Draining int
	// Members are the pool's members, oldest first.
	Members []PoolMember
}

// PoolMember is one member of a pool.
type PoolMember struct {
	// Sandbox is the member's sandbox name.
	Sandbox string
	// State is "ready", "creating", "claiming" or "draining".
	State string
	// Created is when the member was reserved; Ready when its agent first answered
	// (zero while creating); both UTC.
	Created time.Time
	Ready   time.Time
	// Session is the claiming session (State "claiming").
	Session string
}

// Pools reports every rule's pool from the store, in rule order, without calling any
// driver; a pool that nothing fills (no RunPools, no berth serve) shows no members.
// Members of a scope whose rule has no pool any more are reported under a status
// with Size 0. Errors: the store's.
func (r *Registry) Pools(ctx context.Context) ([]PoolStatus, error) {
	var entries []poolEntry
	if fileExists(r.store.path) {
		if err := r.ensure(); err != nil {
			return nil, err
		}
		var err error
		if entries, err = r.store.poolAll(); err != nil {
			return nil, err
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Created.Before(entries[j].Created) })
	var out []PoolStatus
	index := map[[2]string]int{}
	for i := range r.cfg.Rules {
		rule := &r.cfg.Rules[i]
		if rule.Pool == nil {
			continue
		}
		k := [2]string{rule.Glob, rule.Driver}
		if _, dup := index[k]; dup {
			continue
		}
		index[k] = len(out)
		out = append(out, PoolStatus{Scope: rule.Glob, Position: rule.Pos(), Driver: rule.Driver, Size: rule.Pool.Size, MaxIdle: rule.Pool.MaxIdle})
	}
	for _, e := range entries {
		k := [2]string{e.Scope, e.Driver}
		i, ok := index[k]
		if !ok {
			index[k] = len(out)
			i = len(out)
			out = append(out, PoolStatus{Scope: e.Scope, Driver: e.Driver, Position: "(no rule with a pool)"})
		}
		st := &out[i]
		m := PoolMember{Sandbox: e.Sandbox, Created: e.Created, Ready: e.Ready, Session: e.Session}
		rule := r.poolRule(e)
		switch {
		case !e.Claimed.IsZero():
			m.State = "claiming"
			st.Claiming++
		case rule == nil:
			m.State = "draining"
			st.Draining++
		case e.Ready.IsZero():
			m.State = "creating"
			st.Creating++
		default:
			m.State = "ready"
			st.Ready++
		}
		st.Members = append(st.Members, m)
	}
	return out, nil
}

// poolRule returns the rule whose pool e belongs to now: a rule with a pool, of e's
// scope and driver, whose PoolHash is e's; nil when there is none (drift).
func (r *Registry) poolRule(e poolEntry) *config.Rule {
	for i := range r.cfg.Rules {
		rule := &r.cfg.Rules[i]
		if rule.Pool != nil && rule.Glob == e.Scope && rule.Driver == e.Driver && rule.PoolHash(r.owner) == e.Hash {
			return rule
		}
	}
	return nil
}

// poolMaker returns this registry's maker id (16 hex digits), taking on first use
// the flock of its maker lock file, which it holds until Close: entries it
// reserves carry the id, and while the lock is held they are its own.
func (r *Registry) poolMaker() (string, error) {
	r.makerMu.Lock()
	defer r.makerMu.Unlock()
	if r.maker != nil {
		return r.makerID, nil
	}
	id := randomHex(8)
	h, ok, err := flock.TryLock(r.makerLockPath(id))
	if err != nil {
		return "", fmt.Errorf("warm pools: %w", err)
	}
	if !ok {
		return "", fmt.Errorf("warm pools: the maker lock %s is held by another process", r.makerLockPath(id))
	}
	r.maker, r.makerID = h, id
	return id, nil
}

// makerLockPath is the flock that the registry whose maker id is id holds while it
// lives: STATE/locks/pool-maker-ID.filler (a name prune's lock cleanup leaves alone).
func (r *Registry) makerLockPath(id string) string {
	return filepath.Join(r.stateDir, "locks", "pool-maker-"+id+".filler")
}

// makerGone reports whether the registry of maker id no longer lives: its lock
// can be taken (its process died, or it closed the registry). The lock file is
// then deleted. An entry without a maker id, of this registry, or with an id that
// is not 16 hex digits is not judged.
func (r *Registry) makerGone(id string) bool {
	r.makerMu.Lock()
	self := r.makerID
	r.makerMu.Unlock()
	if id == "" || id == self || !isHex16(id) {
		return false
	}
	h, ok, err := flock.TryLock(r.makerLockPath(id))
	if err != nil || !ok {
		return false
	}
	h.Unlock(true)
	return true
}

func isHex16(s string) bool {
	if len(s) != 16 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// poolParallel bounds how many members of one pool FillPools makes at once.
const poolParallel = 4

// DefaultPoolInterval is how often RunPools checks its pools when nothing claims.
const DefaultPoolInterval = 10 * time.Second

// RunPools keeps every rule's pool filled (FillPools) until ctx is done: at once,
// after every claim from a pool of this registry's config (in this process: when the
// claiming call ends, or PoolRefillDelay after the claim, whichever comes first), and
// every interval (0: DefaultPoolInterval), which also replaces members older than
// max_idle and retries after failures. With no rule that has a pool it makes one
// round, which drains the members an earlier config left, and returns. Errors of a
// round are logged, never returned. Only one registry per state dir should run it
// (berth serve does).
func (r *Registry) RunPools(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultPoolInterval
	}
	if !r.hasPools() {
		// No rule has a pool (any more): drain what an earlier config left.
		if err := r.FillPools(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("warm pools: draining the members of rules without a pool failed", "error", err)
		}
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := r.FillPools(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("warm pools: a round failed; trying again", "error", err, "in", interval)
		}
		r.poolRounds.Add(1)
		select {
		case <-ctx.Done():
			return
		case <-r.poolKick:
		case <-t.C:
		}
	}
}

func (r *Registry) hasPools() bool {
	for i := range r.cfg.Rules {
		if r.cfg.Rules[i].Pool != nil {
			return true
		}
	}
	return false
}

// PoolRefillDelay is how long after a claim RunPools starts refilling the pool when
// the claiming call is still running then; a call that ends sooner starts it at its
// end. Refilling at the claim itself made the refill's create (a container's, on
// docker and containerd) compete with the claim's first command: measured through
// berth serve's API, a claim to its first `true` took 9.5-11 ms p50 that way and
// 3.9-5.9 ms with the refill after it (local, docker, containerd 1.6 and 2.x).
const PoolRefillDelay = 250 * time.Millisecond

// kickPools tells RunPools that a member was claimed.
func (r *Registry) kickPools() {
	select {
	case r.poolKick <- struct{}{}:
	default:
	}
}

// FillPools makes one round over the warm pools and returns when it is done: it
// drains members whose rule changed, is gone or has no pool any more (drift),
// replaces members older than
// their pool's max_idle, removes entries left by a berth that died (older than the
// grace period), and creates members until every pool has Size unclaimed ones (up to
// poolParallel at once per pool). Tests and library users call it to fill pools
// deterministically; RunPools calls it in a loop. Errors: the store's, and every
// failed create or removal, joined (the round goes on past each).
func (r *Registry) FillPools(ctx context.Context) error {
	if !r.hasPools() && !fileExists(r.store.path) {
		return nil
	}
	if err := r.ensure(); err != nil {
		return err
	}
	entries, err := r.store.poolAll()
	if err != nil {
		return err
	}
	recs, err := r.store.all()
	if err != nil {
		return err
	}
	recorded := map[sbKey]bool{}
	for _, rec := range recs {
		recorded[sbKey{rec.Driver, rec.Sandbox}] = true
	}
	now := r.now()
	var errs []error
	for _, e := range entries {
		cause := ""
		rule := r.poolRule(e)
		switch {
		case !e.Claimed.IsZero():
			// A claim in flight, or one whose berth died before recording it.
			if recorded[sbKey{e.Driver, e.Sandbox}] {
				r.store.poolDrop(e.Driver, e.Sandbox, false) // recorded: the entry is left over
				continue
			}
			if now.Sub(e.Claimed) >= r.grace {
				cause = PoolStale
			}
		case e.Ready.IsZero():
			if now.Sub(e.Created) >= r.grace || r.makerGone(e.Maker) {
				cause = PoolStale
			}
		case rule == nil:
			cause = PoolDrift
		case rule.Pool.MaxIdle > 0 && now.Sub(e.Ready) >= rule.Pool.MaxIdle:
			cause = PoolIdle
		}
		if cause == "" {
			continue
		}
		if err := r.drainMember(ctx, e, cause, !e.Claimed.IsZero() || e.Ready.IsZero()); err != nil {
			errs = append(errs, err)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range r.cfg.Rules {
		rule := &r.cfg.Rules[i]
		if rule.Pool == nil {
			continue
		}
		for range min(rule.Pool.Size, poolParallel) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					made, err := r.makeMember(ctx, rule)
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
					if !made || err != nil {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// DrainPools removes every unclaimed member of every pool (ready, being made, or
// left from an earlier spec), whatever the config says now: the way to empty the
// pools of a state dir (a test's cleanup; before deleting a state dir). Members
// marked claimed (by a berth that claimed in two transactions) are left to Prune.
// A running RunPools refills its pools afterwards. Errors: the store's, and every failed removal, joined.
func (r *Registry) DrainPools(ctx context.Context) error {
	if !fileExists(r.store.path) {
		return nil
	}
	if err := r.ensure(); err != nil {
		return err
	}
	entries, err := r.store.poolAll()
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !e.Claimed.IsZero() {
			continue
		}
		if err := r.drainMember(ctx, e, PoolDrift, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// drainMember removes member e from its pool and its driver. force says whether a
// claimed or unfinished entry may go (stale ones); otherwise only an unclaimed entry
// is dropped, in the transaction that decides against a concurrent claim.
func (r *Registry) drainMember(ctx context.Context, e poolEntry, cause string, force bool) error {
	if _, ok, err := r.store.poolDrop(e.Driver, e.Sandbox, !force); err != nil || !ok {
		return err // claimed meanwhile, or dropped by another round
	}
	r.log.Info("warm pool: removing a member", "scope", e.Scope, "driver", e.Driver, "sandbox", e.Sandbox, "cause", cause)
	if err := r.removeMember(ctx, e.Driver, e.Sandbox); err != nil {
		return fmt.Errorf("warm pool of %q: removing member %s (%s): %w", e.Scope, e.Sandbox, cause, err)
	}
	r.poolEvent(PoolEvent{Kind: PoolRemove, Scope: e.Scope, Driver: e.Driver, Sandbox: e.Sandbox, Cause: cause})
	return nil
}

// removeMember removes a member's sandbox (under its lock) and its host files. A
// removal that fails leaves a sandbox that Prune removes once it is past the grace
// period (no entry, no record).
func (r *Registry) removeMember(ctx context.Context, driver, sandbox string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	lock, err := flock.Lock(ctx, r.lockPath(sandbox))
	if err != nil {
		return err
	}
	removed := false
	defer func() { lock.Unlock(removed) }()
	r.agents.forget(sbKey{driver, sandbox})
	b, err := r.driver(ctx, driver)
	if err != nil {
		return err
	}
	if _, err := r.again(ctx, driver, "remove sandbox "+sandbox, b, func(b backend.TerminalBackend) error { return b.Remove(ctx, sandbox) }); err != nil {
		return err
	}
	r.event(SandboxEvent{Action: EventRemove, Driver: driver, Sandbox: sandbox, Cause: "pool"})
	r.removeHostFiles(driver, sandbox)
	removed = true
	return nil
}

// makeMember reserves and creates one member of rule's pool, and reports whether it
// made one (false, nil: the pool is full). The member is ready when its agent has
// answered; its client is kept for the session that claims it. On failure nothing is
// left: the member is removed and its entry dropped.
func (r *Registry) makeMember(ctx context.Context, rule *config.Rule) (bool, error) {
	id := randomHex(8)
	spec := rule.MemberSpec(r.owner, id)
	maker, err := r.poolMaker()
	if err != nil {
		return false, err
	}
	e := poolEntry{Driver: rule.Driver, Sandbox: spec.Name, ID: id, Scope: rule.Glob, Hash: spec.Labels[backend.LabelSpecHash], Created: r.stamp(), Maker: maker}
	if ok, err := r.store.poolReserve(e, rule.Pool.Size); err != nil || !ok {
		return false, err
	}
	start := time.Now()
	agentReach, err := r.createMember(ctx, rule, spec)
	if err == nil {
		var ok bool
		if ok, err = r.store.poolReady(e.Driver, e.Sandbox, agentReach, r.stamp()); err == nil && !ok {
			err = fmt.Errorf("its pool entry was dropped while it was made")
		}
	}
	if err != nil {
		r.store.poolDrop(e.Driver, e.Sandbox, false)
		if rerr := r.removeMember(ctx, e.Driver, e.Sandbox); rerr != nil {
			r.log.Error("warm pool: removing a member that failed", "sandbox", e.Sandbox, "error", rerr)
		}
		r.poolEvent(PoolEvent{Kind: PoolRemove, Scope: e.Scope, Driver: e.Driver, Sandbox: e.Sandbox, Cause: PoolFailed})
		return false, fmt.Errorf("warm pool of %q (%s): making member %s on driver %s: %w", rule.Glob, rule.Pos(), e.Sandbox, rule.Driver, err)
	}
	took := time.Since(start)
	r.log.Debug("warm pool: member ready", "scope", e.Scope, "sandbox", e.Sandbox, "took", took)
	r.poolEvent(PoolEvent{Kind: PoolReady, Scope: e.Scope, Driver: e.Driver, Sandbox: e.Sandbox, Took: took})
	return true, nil
}

// createMember creates the member of spec through rule's driver, under the member's
// lock, and dials its agent (the client is cached); it returns how the agent is
// reached.
func (r *Registry) createMember(ctx context.Context, rule *config.Rule, spec backend.SandboxSpec) (backend.AgentReach, error) {
	lock, err := flock.Lock(ctx, r.lockPath(spec.Name))
	if err != nil {
		return "", err
	}
	defer lock.Unlock(false)
	b, err := r.driver(ctx, rule.Driver)
	if err != nil {
		return "", err
	}
	caps, err := r.capabilities(ctx, b)
	if err != nil {
		return "", err
	}
	if caps, err = RuntimeCapabilities(caps, rule); err != nil {
		return "", err
	}
	dir := r.sandboxDir(rule.Driver, spec.Name)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", stateDirError(r.stateDir, err.Error())
	}
	files, err := r.prepare(dir)
	if err != nil {
		return "", fmt.Errorf("preparing the agent: %w", err)
	}
	if err := r.pull(ctx, b, rule, "pool of "+rule.Glob, spec.Name); err != nil {
		return "", err
	}
	spec.Labels[backend.LabelCreated] = r.stamp().Format(time.RFC3339)
	var sb backend.Sandbox
	b, err = r.again(ctx, rule.Driver, "create sandbox "+spec.Name, b, func(b backend.TerminalBackend) (err error) {
		sb, err = b.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files})
		return err
	})
	if err != nil {
		return "", err
	}
	if o := sb.Labels[backend.LabelOwner]; o != "" && o != r.owner {
		return "", backend.Errorf(backend.ErrConflict, "the driver returned sandbox %s of owner %s, not ours (%s)", spec.Name, o, r.owner)
	}
	r.event(SandboxEvent{Action: EventCreate, Driver: rule.Driver, Sandbox: spec.Name, Cause: "pool"})
	if !caps.HasAgent() {
		return caps.Agent, nil
	}
	c, err := r.connectAgent(ctx, b, caps.Agent, spec.Name, files)
	if err != nil {
		return "", fmt.Errorf("its agent does not answer: %w", err)
	}
	if _, err := r.agents.put(sbKey{rule.Driver, spec.Name}, c); err != nil {
		return "", err
	}
	return caps.Agent, nil
}

// claimed is the member that acquire claimed for a session.
type claimed struct {
	entry poolEntry
	lock  *flock.Held // the member's lock
	// prev is the session's record before the claim (nil: it had none), which an
	// undone claim restores.
	prev *record
}

// acquireMember is acquire's work for a session of a rule with a pool, or whose
// record names a claimed member; the caller holds the lock of the session's own
// sandbox name. It reports false when acquire should go on as without a pool: the
// session has a sandbox of its own name, or the pool has no ready member. With true,
// p is the session's member: its recorded one, adopted (started) by its driver, or
// a newly claimed one whose agent answers.
func (r *Registry) acquireMember(ctx context.Context, p *pending, session string, rule *config.Rule) (bool, error) {
	old, recorded, err := r.store.get(session)
	if err != nil {
		return false, fmt.Errorf("session %q: %w", session, err)
	}
	gone := false // the session had a sandbox, which is gone
	if recorded && old.Pooled && old.Driver == rule.Driver && old.Removed.IsZero() {
		ok, err := r.adoptMember(ctx, p, session, rule, old)
		if err != nil || ok {
			return ok, err
		}
		gone = true
		if old, _, err = r.store.get(session); err != nil {
			return false, fmt.Errorf("session %q: %w", session, err)
		}
	}
	if rule.Pool == nil || (recorded && !gone && old.Removed.IsZero()) {
		return false, nil
	}
	b, err := r.driver(ctx, rule.Driver)
	if err != nil {
		return false, fmt.Errorf("session %q: %w", session, err)
	}
	caps, err := r.capabilities(ctx, b)
	if err != nil {
		return false, fmt.Errorf("session %q: driver %s: %w", session, rule.Driver, err)
	}
	if caps, err = RuntimeCapabilities(caps, rule); err != nil {
		return false, fmt.Errorf("session %q: %w", session, err)
	}
	hash := rule.PoolHash(r.owner)
	var prev *record // the session's record before the claim, which poolUntake restores
	if recorded {
		prev = &old
	}
	tried := map[string]bool{}
	for {
		e, ok, err := r.store.poolCandidate(rule.Driver, rule.Glob, hash, tried)
		if err != nil {
			return false, fmt.Errorf("session %q: claiming a warm pool member: %w", session, err)
		}
		if !ok {
			r.poolEvent(PoolEvent{Kind: PoolMiss, Scope: rule.Glob, Driver: rule.Driver, Session: session})
			r.log.Debug("warm pool empty; creating the session's sandbox", "session", session, "scope", rule.Glob)
			return false, nil
		}
		tried[e.Sandbox] = true
		// A member whose lock someone holds (another claim of it, a drain removing
		// it) is passed over: waiting could mean waiting for a removal.
		mlock, free, err := flock.TryLock(r.lockPath(e.Sandbox))
		if err != nil {
			return false, fmt.Errorf("session %q: %w", session, err)
		}
		if !free {
			continue
		}
		dir := r.sandboxDir(e.Driver, e.Sandbox)
		files := backend.AgentFiles{Dir: filepath.Join(dir, "agent"), SocketDir: filepath.Join(dir, "run")}
		client, err := r.memberAgent(ctx, b, caps, e, files)
		if err != nil {
			// Dead (killed, its sandbox removed behind berth's back): out of the
			// pool, and the next one.
			r.log.Warn("warm pool member does not answer; removing it and trying the next", "sandbox", e.Sandbox, "error", err)
			mlock.Unlock(false)
			if _, dropped, _ := r.store.poolDrop(e.Driver, e.Sandbox, true); dropped {
				r.kickPools() // its place is made again now, not at the next round
				if rerr := r.removeMember(ctx, e.Driver, e.Sandbox); rerr != nil {
					r.log.Error("warm pool: removing a member that does not answer", "sandbox", e.Sandbox, "error", rerr)
				}
				r.poolEvent(PoolEvent{Kind: PoolRemove, Scope: e.Scope, Driver: e.Driver, Sandbox: e.Sandbox, Cause: PoolFailed})
			}
			continue
		}
		now := r.stamp()
		rec := record{Session: session, Driver: rule.Driver, Sandbox: e.Sandbox, Scope: rule.Glob,
			SpecHash: e.Hash, Created: now, LastUsed: now, Agent: e.Agent, Pooled: true}
		// The claim is this one transaction, the session's record with it: it is
		// durable before any command runs in the member.
		took, err := r.store.poolTake(e, rec)
		if err != nil {
			mlock.Unlock(false)
			return false, fmt.Errorf("session %q: claiming a warm pool member: %w", session, err)
		}
		if !took {
			mlock.Unlock(false) // claimed or drained meanwhile: the next one
			continue
		}
		// The refill waits for the claiming call to end (sessionConn.end), or
		// PoolRefillDelay when that call runs on: its create competes with the
		// claim's first command for the CPUs.
		p.refill = time.AfterFunc(PoolRefillDelay, r.kickPools)
		p.b, p.caps, p.files, p.client = b, caps, files, client
		p.spec = rule.MemberSpec(r.owner, e.ID)
		p.dir = dir
		p.member = &claimed{entry: e, lock: mlock, prev: prev}
		p.lease = &Lease{Session: session, Driver: rule.Driver, Sandbox: e.Sandbox, Rule: rule, Created: true, Pooled: true}
		if recorded {
			p.lease.Recreated, p.lease.RecreatedReason = true, recreatedReason(old, rule.Driver, backend.Sandbox{})
		}
		p.rec = rec
		r.poolEvent(PoolEvent{Kind: PoolClaim, Scope: rule.Glob, Driver: rule.Driver, Sandbox: e.Sandbox, Session: session})
		r.log.Debug("claimed a warm pool member", "session", session, "sandbox", e.Sandbox)
		return true, nil
	}
}

// memberAgent returns a client of the agent of member e (the one kept since the
// filler or an earlier claim dialled it, else a new one); nil when the driver runs
// no berth agent.
func (r *Registry) memberAgent(ctx context.Context, b backend.TerminalBackend, caps backend.Capabilities, e poolEntry, files backend.AgentFiles) (*agent.Client, error) {
	if !caps.HasAgent() {
		return nil, nil
	}
	key := sbKey{e.Driver, e.Sandbox}
	if c := r.agents.get(key); c != nil {
		return c, nil
	}
	c, err := r.connectAgent(ctx, b, caps.Agent, e.Sandbox, files)
	if err != nil {
		return nil, err
	}
	return r.agents.put(key, c)
}

// adoptMember makes the member that session claimed earlier (old) ready again,
// under its lock: retention due is applied first (expireOwn), then its driver's
// Create adopts (starts) it. false, nil when it is gone (retention removed it, or
// its driver no longer has it): the caller claims another or creates one.
func (r *Registry) adoptMember(ctx context.Context, p *pending, session string, rule *config.Rule, old record) (bool, error) {
	mlock, err := flock.Lock(ctx, r.lockPath(old.Sandbox))
	if err != nil {
		return false, fmt.Errorf("session %q: %w", session, err)
	}
	fail := func(err error) (bool, error) {
		mlock.Unlock(false)
		return false, err
	}
	b, err := r.driver(ctx, rule.Driver)
	if err != nil {
		return fail(fmt.Errorf("session %q: %w", session, err))
	}
	if p.caps, err = r.capabilities(ctx, b); err != nil {
		return fail(fmt.Errorf("session %q: driver %s: %w", session, rule.Driver, err))
	}
	if p.caps, err = RuntimeCapabilities(p.caps, rule); err != nil {
		return fail(fmt.Errorf("session %q: %w", session, err))
	}
	if old, err = r.expireOwn(ctx, b, rule, old); err != nil {
		return fail(fmt.Errorf("session %q: %w", session, err))
	}
	if !old.Removed.IsZero() {
		return fail(nil)
	}
	sb, err := b.Inspect(ctx, old.Sandbox)
	if errors.Is(err, backend.ErrNotFound) {
		// Gone behind berth's back: its records say so, as prune would.
		r.store.markRemoved(old.Driver, old.Sandbox, r.stamp(), fmt.Sprintf("sandbox %s no longer existed on driver %s (removed outside berth?)", old.Sandbox, old.Driver))
		return fail(nil)
	} else if err != nil {
		return fail(fmt.Errorf("session %q: sandbox %s on driver %s: %w", session, old.Sandbox, rule.Driver, err))
	}
	dir := r.sandboxDir(rule.Driver, old.Sandbox)
	if p.files, err = r.prepare(dir); err != nil {
		return fail(fmt.Errorf("session %q: preparing the agent for sandbox %s: %w", session, old.Sandbox, err))
	}
	spec := rule.MemberSpec(r.owner, sb.Labels[backend.LabelPool])
	spec.Name = old.Sandbox
	spec.Labels[backend.LabelCreated] = sb.Labels[backend.LabelCreated]
	sb, b, err = r.createDetached(ctx, rule.Driver, b, backend.CreateRequest{Spec: spec, Agent: p.files})
	if err != nil {
		return fail(fmt.Errorf("session %q: starting its sandbox %s on driver %s: %w", session, old.Sandbox, rule.Driver, err))
	}
	if o := sb.Labels[backend.LabelOwner]; o != "" && o != r.owner {
		return fail(backend.Errorf(backend.ErrConflict, "session %q: driver %s returned sandbox %s of owner %s, not ours (%s); refusing to use it", session, rule.Driver, old.Sandbox, o, r.owner))
	}
	have := sb.Labels[backend.LabelSpecHash]
	if have == "" {
		have = old.SpecHash
	}
	p.b, p.spec, p.dir = b, spec, dir
	p.member = &claimed{lock: mlock}
	p.lease = &Lease{Session: session, Driver: rule.Driver, Sandbox: old.Sandbox, Rule: rule, Pooled: true,
		Drift: have != rule.PoolHash(r.owner)}
	if !sb.Adopted {
		// The driver made it anew (a Pod that had ended: stop means remove there).
		p.lease.Created, p.lease.Recreated, p.lease.RecreatedReason = true, true, recreatedReason(old, rule.Driver, sb)
	} else if sb.EndReason != "" {
		r.log.Warn("session's sandbox had ended; started it again with its files", "session", session, "sandbox", old.Sandbox, "reason", endCause(sb))
	}
	rec := old
	rec.SpecHash, rec.Agent, rec.LastUsed = have, p.caps.Agent, r.stamp()
	if !sb.Adopted {
		rec.Created = rec.LastUsed // a new sandbox: its retention starts now
	}
	p.rec = rec
	return true, nil
}
