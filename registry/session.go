package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/flock"
	"github.com/berth-sh/berth/internal/phase"
)

// One call on a session's sandbox (an exec, a shell call, a job operation, a copy)
// reaches the sandbox's agent in one of two ways:
//
//   - directly (the fast path): the session's record names the sandbox its rule maps
//     it to, nothing of retention is due, and its agent answers: on the socket the
//     host prepared, STATE/sandboxes/DRIVER/SANDBOX/run, for drivers whose agents
//     listen there (backend.AgentSocket: no driver is started, no runtime is asked),
//     or through the driver's DialAgent for drivers that carry the connection
//     (backend.AgentDial: the driver is started, if it is not running yet, for the
//     dial alone; no lifecycle call is made). Nothing is written to the store before
//     the call (its last use is touched after it, without fsync). A long-lived
//     registry keeps the agent's client for the next call (agentCache);
//   - through the lifecycle (the slow path): anything else (no record, a moved rule,
//     retention due, --recreate, an agent that does not answer because the sandbox is
//     stopped or gone) starts the driver, which creates, adopts or starts the sandbox,
//     and then the agent is dialled as the driver's Capabilities.Agent says.
//
// Either way the call holds the sandbox's busy marker from before the dial until it
// ends, so prune never sees it as idle; the marker is taken under the sandbox's lock,
// which prune, remove and create hold while they decide.

// openMode says what a call may do to reach a session's sandbox.
type openMode int

const (
	// openCreate: create a sandbox for a session without one, start a stopped one
	// (exec, shell, job start, upload).
	openCreate openMode = iota
	// openExisting: the session must have a recorded sandbox (ErrNotFound
	// otherwise); a stopped one is started (download).
	openExisting
	// openRunning: the session must have a recorded, running sandbox: nothing is
	// created or started (job list, logs, kill: jobs end with their sandbox).
	// errNotRunning when it is not running.
	openRunning
)

// errNotRunning is what a direct dial says when no agent answers on the sandbox's
// socket, or through its driver (it is stopped or gone): the slow path decides what
// that means.
var errNotRunning = errors.New("the sandbox's agent does not answer on its socket")

// sessionConn is a session's sandbox reached for one call: its lease and either an
// agent client or (drivers without agent) the driver itself. Release it with done,
// after commit (the call started) or fail (it did not).
type sessionConn struct {
	r        *Registry
	session  string
	lease    *Lease
	client   *agent.Client           // nil for drivers without berth's agent
	cached   bool                    // client is the Registry's (agentCache): not closed at the end
	b        backend.TerminalBackend // set on the slow path
	busy     *busyMarker
	madeBusy bool
	p        *pending // slow path: the sandbox's lock is held and its record unwritten
	ended    bool
	refill   *time.Timer // the claim's refill (pending.refill), started at the end at the latest
}

// key is the sandbox the call reached.
func (c *sessionConn) key() sbKey { return sbKey{c.lease.Driver, c.lease.Sandbox} }

// lost reports whether err, an error of the start of a call, says that a client the
// Registry kept has lost its connection; the client is then dropped, and the caller
// may make the call once more (nothing has run).
func (c *sessionConn) lost(err error) bool {
	if !c.cached || !agent.ConnectionLost(err) {
		return false
	}
	c.r.agents.drop(c.key(), c.client)
	c.cached = false
	return true
}

// open reaches session's sandbox for one call (see the comment above openMode).
// Errors: a bad session or no rule (ErrInvalid), a rule whose mounts the mount
// policy refuses (a *config.Error, see CheckMounts), no recorded sandbox with
// openExisting/openRunning (ErrNotFound), a sandbox that is not running with
// openRunning (errNotRunning), a tampered agent socket (ErrConflict), an agent of an
// older berth (ErrUnsupported), an agent that accepts but does not answer
// (ErrTimeout), and those of the lifecycle (acquire).
func (r *Registry) open(ctx context.Context, session string, mode openMode) (*sessionConn, error) {
	if r.life.Err() != nil {
		// Closed: the direct path needs no driver, but a closed Registry runs
		// nothing, whichever path a call would take (Close's doc).
		return nil, fmt.Errorf("session %q: %w", session, errClosed)
	}
	rule, _, err := r.cfg.Match(session)
	if err != nil {
		return nil, err
	}
	// The mount policy refuses the rule, whichever path would reach its sandbox: one
	// that an earlier berth made with such a mount must not be used directly either.
	// It costs nothing for a rule without mounts.
	if err := r.checkMounts(rule); err != nil {
		return nil, fmt.Errorf("session %q: %w", session, err)
	}
	rec, recorded, err := r.ownerAndRecord(session)
	if err != nil {
		return nil, err
	}
	spec := r.specs.get(rule, r.owner, session)
	phase.Mark("store")
	if !recorded && mode != openCreate {
		return nil, noSession(session)
	}
	if recorded && r.direct(rule, spec, rec) {
		c, err := r.dialDirect(ctx, session, rule, spec, rec)
		if err == nil || !errors.Is(err, errNotRunning) {
			return c, err
		}
		r.log.Debug("the sandbox's agent does not answer; running the lifecycle", "session", session, "sandbox", rec.Sandbox)
	}
	if mode == openRunning {
		running, err := r.sandboxRunning(ctx, rec)
		if err != nil {
			return nil, err
		}
		if !running {
			return nil, errNotRunning
		}
	}
	return r.openSlow(ctx, session)
}

// ownerAndRecord makes sure of the store and the owner id (ensure) and returns
// session's record: in one read of the store when the owner id is not known yet and
// the store exists (the first call of a berth command). The record's LastUsed is a
// lower bound (store.getForCall), enough for direct's idle check.
func (r *Registry) ownerAndRecord(session string) (record, bool, error) {
	r.initMu.Lock()
	known := r.owner != ""
	r.initMu.Unlock()
	if !known {
		owner, rec, ok, err := r.store.ownerAndGet(session)
		if err == nil && owner != "" {
			// This path runs no init, which keeps the owner id's copy (OwnerFile):
			// a store made before the copy existed gets it here too. Failing to
			// write it fails nothing.
			writeOwnerCopy(filepath.Dir(r.store.path), owner)
			// Set once, like ensure does: a concurrent first call may have set it
			// already, and calls read r.owner without the lock once theirs is done.
			r.initMu.Lock()
			if r.owner == "" {
				r.owner = owner
			}
			r.initMu.Unlock()
			return rec, ok, nil
		}
	}
	if err := r.ensure(); err != nil {
		return record{}, false, err
	}
	rec, ok, err := r.store.getForCall(session)
	if err != nil {
		return record{}, false, fmt.Errorf("session %q: %w", session, err)
	}
	return rec, ok, nil
}

// direct reports whether a call may try the session's recorded sandbox without its
// driver's lifecycle: the record names the sandbox the rule maps the session to now,
// on the rule's driver, reached through its socket or its driver's DialAgent, and
// neither max_age nor idle_ttl is due (due ones take the slow path, which applies
// them).
func (r *Registry) direct(rule *config.Rule, spec specSummary, rec record) bool {
	if (rec.Agent != backend.AgentSocket && rec.Agent != backend.AgentDial) || !rec.Removed.IsZero() || rec.Driver != rule.Driver || (rec.Sandbox != spec.Name && !rec.Pooled) {
		return false
	}
	ret, now := rule.Retention, r.now()
	if ret.MaxAge > 0 && !rec.Created.IsZero() && now.Sub(rec.Created) >= ret.MaxAge {
		return false
	}
	// A shared sandbox's idle time is that of its most recent session: the slow
	// path works it out.
	if ret.IdleTTL > 0 && (rule.Isolation == config.IsolationShared || now.Sub(rec.LastUsed) >= ret.IdleTTL) {
		return false
	}
	return true
}

// dialDirect takes the sandbox's busy marker (under its lock) and dials its agent
// through the socket in its host dir, or its driver's DialAgent (rec.Agent).
// errNotRunning when nothing answers there.
func (r *Registry) dialDirect(ctx context.Context, session string, rule *config.Rule, spec specSummary, rec record) (*sessionConn, error) {
	lock, err := flock.Lock(ctx, r.lockPath(rec.Sandbox))
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", session, err)
	}
	busy, made, err := holdBusy(r.busyPath(rec.Driver, rec.Sandbox))
	lock.Unlock(false)
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", session, err)
	}
	phase.Mark("lock")
	key := sbKey{rec.Driver, rec.Sandbox}
	client := r.agents.get(key)
	if client == nil {
		dir := r.sandboxDir(rec.Driver, rec.Sandbox)
		if rec.Agent == backend.AgentDial {
			client, err = r.dialThrough(ctx, rec, filepath.Join(dir, "agent"))
		} else {
			client, err = agent.NewClient(ctx, agent.DialSocketDir(filepath.Join(dir, "run")),
				agent.WithTokenFrom(filepath.Join(dir, "agent")), agent.WithHelloTimeout(r.cfg.AgentTimeout))
		}
		if err != nil {
			busy.unlock(false)
			return nil, r.agentError(session, rec.Driver, rec.Sandbox, err)
		}
		if client, err = r.agents.put(key, client); err != nil {
			busy.unlock(false)
			return nil, fmt.Errorf("session %q: %w", session, err)
		}
	}
	phase.Mark("dial")
	want := spec.Hash
	if rec.Pooled {
		want = rule.PoolHash(r.owner)
	}
	lease := &Lease{
		Session: session, Driver: rec.Driver, Sandbox: rec.Sandbox, Rule: rule, Direct: true, Pooled: rec.Pooled,
		Drift: rec.SpecHash != "" && rec.SpecHash != want,
	}
	return &sessionConn{r: r, session: session, lease: lease, client: client, cached: true, busy: busy, madeBusy: made}, nil
}

// dialThrough connects to the agent of rec's sandbox through its driver's
// DialAgent, with the token of the agent dir. A sandbox that the driver does not
// find, or finds not running, or whose agent cannot be reached (ErrNotFound,
// ErrConflict, ErrUnavailable: deleted behind berth's back, ended, its agent
// gone) is ErrUnavailable, which agentError makes errNotRunning: the slow path's
// Create then says what became of it, and makes it anew.
func (r *Registry) dialThrough(ctx context.Context, rec record, agentDir string) (*agent.Client, error) {
	b, err := r.driver(ctx, rec.Driver)
	if err != nil {
		return nil, err
	}
	d, ok := b.(backend.AgentDialer)
	if !ok {
		return nil, backend.Errorf(backend.ErrUnavailable, "driver %s does not implement DialAgent", rec.Driver)
	}
	c, err := agent.NewClient(ctx, func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, rec.Sandbox) },
		agent.WithTokenFrom(agentDir), agent.WithHelloTimeout(r.cfg.AgentTimeout))
	switch {
	case err == nil:
		r.viaPlugin.add(c, b) // so that a plugin's crash mid-call reads as one (lostWithPlugin)
		return c, nil
	case errors.Is(err, backend.ErrNotFound), errors.Is(err, backend.ErrConflict), errors.Is(err, backend.ErrUnavailable):
		return nil, backend.Errorf(backend.ErrUnavailable, "%w", err)
	}
	return nil, err
}

// agentError says what a failed dial of sandbox's agent means for session: nothing
// listens (errNotRunning, for the slow path), or an error that names the session and
// how to recover.
func (r *Registry) agentError(session, driver, sandbox string, err error) error {
	switch {
	case errors.Is(err, backend.ErrUnavailable):
		return fmt.Errorf("%w: %v", errNotRunning, err)
	case errors.Is(err, backend.ErrConflict):
		return fmt.Errorf("session %q: sandbox %s on driver %s: %w; something in the sandbox took over its agent's socket: start over with `berth exec --recreate -s %s -- true` (a new, empty sandbox) or remove it with `berth rm %s`", session, sandbox, driver, err, session, session)
	case errors.Is(err, backend.ErrUnsupported):
		return fmt.Errorf("session %q: sandbox %s on driver %s: %w; stop it with `berth stop %s` (its files are kept) and the next call starts it with this berth's agent, or start over with `berth exec --recreate -s %s -- true`", session, sandbox, driver, err, session, session)
	case errors.Is(err, backend.ErrTimeout):
		return fmt.Errorf("session %q: sandbox %s on driver %s: %w; raise agent_timeout in the config if the machine is that busy, or `berth stop %s` and try again", session, sandbox, driver, err, session)
	}
	return fmt.Errorf("session %q: sandbox %s on driver %s: %w", session, sandbox, driver, err)
}

// openSlow runs the lifecycle (acquire: the driver creates, adopts or starts the
// sandbox, under its lock), takes the busy marker, and connects to the agent the way
// the driver says. The lock stays held until commit or fail.
func (r *Registry) openSlow(ctx context.Context, session string) (*sessionConn, error) {
	stranded := ""
	for attempt := 0; ; attempt++ {
		c, err := r.openSlowOnce(ctx, session, attempt == 0, &stranded)
		if err == nil && stranded != "" && c.lease.Created && !c.lease.Recreated {
			c.lease.Recreated, c.lease.RecreatedReason = true, stranded
		}
		if !errors.Is(err, errStranded) {
			return c, err
		}
	}
}

// errStranded is openSlowOnce's "the adopted sandbox could not be reached and is
// removed now: run the lifecycle once more".
var errStranded = errors.New("stranded sandbox removed")

// openSlowOnce is one try of openSlow. When mayRetry, a sandbox that the driver
// adopted but whose agent refuses its host dir's token or does not answer, and that
// no record names (no call has used it: a create that an earlier berth let go of
// half-way), is removed, *stranded says why, and errStranded asks for one more try.
func (r *Registry) openSlowOnce(ctx context.Context, session string, mayRetry bool, stranded *string) (*sessionConn, error) {
	p, err := r.acquire(ctx, session)
	if err != nil {
		return nil, err
	}
	c := &sessionConn{r: r, session: session, lease: p.lease, b: p.b, p: p, refill: p.refill}
	if p.client != nil {
		// A claimed pool member, dialled by the claim (or by the filler).
		c.client, c.cached = p.client, true
	}
	if c.busy, c.madeBusy, err = holdBusy(r.busyPath(p.lease.Driver, p.lease.Sandbox)); err != nil {
		c.fail()
		return nil, fmt.Errorf("session %q: %w", session, err)
	}
	if !p.caps.HasAgent() || c.client != nil {
		return c, nil
	}
	c.client, err = r.connectAgent(ctx, p.b, p.caps.Agent, p.lease.Sandbox, p.files)
	if err != nil {
		if mayRetry && r.unreachableUnused(ctx, p, err) {
			*stranded = fmt.Sprintf("its sandbox %s on driver %s, which no call had used, could not be reached (%v); it was removed and this one is new and empty", p.lease.Sandbox, p.lease.Driver, err)
			c.fail()
			return nil, errStranded
		}
		c.fail()
		err = r.agentError(session, p.lease.Driver, p.lease.Sandbox, err)
		if errors.Is(err, errNotRunning) {
			err = backend.Errorf(backend.ErrUnavailable, "session %q: driver %s started sandbox %s, but its agent does not answer: %w", session, p.lease.Driver, p.lease.Sandbox, errors.Unwrap(err))
		}
		return nil, err
	}
	// The sandbox may have a new agent now (started, made anew): a client kept for
	// its old one must not be used. A sandbox that was found running has the same
	// agent, and its kept client may be serving other calls right now (another
	// session of a shared sandbox, a concurrent call that found the record first):
	// it stays.
	r.agents.dropStale(c.key(), c.client.Instance())
	callTrace(ctx).agentReady(p.lease.Driver, p.lease.Sandbox)
	return c, nil
}

// unreachableUnused reports whether p's sandbox, which the driver adopted and whose
// agent the call could not reach (err: the agent refuses the token of the sandbox's
// host dir, ErrConflict, or does not answer, ErrUnavailable), is one that no record
// names, and if so removes it (on a fresh bounded context, with p's lock held).
func (r *Registry) unreachableUnused(ctx context.Context, p *pending, err error) bool {
	if p.lease.Created || p.member != nil || ctx.Err() != nil ||
		!(errors.Is(err, backend.ErrConflict) || errors.Is(err, backend.ErrUnavailable)) {
		return false
	}
	if onDriver, _ := r.recorded(p.lease.Driver, p.lease.Sandbox); onDriver {
		return false
	}
	if rerr := r.removeStranded(ctx, p, err.Error()); rerr != nil {
		r.log.Error("an unused sandbox whose agent cannot be reached could not be removed", "sandbox", p.lease.Sandbox, "error", rerr)
		return false
	}
	return true
}

// connectAgent dials the agent of sandbox on driver b as reach says: the socket of
// files, or b's AgentDialer; with the sandbox's token either way.
func (r *Registry) connectAgent(ctx context.Context, b backend.TerminalBackend, reach backend.AgentReach, sandbox string, files backend.AgentFiles) (*agent.Client, error) {
	opts := []agent.ClientOption{agent.WithTokenFrom(files.Dir), agent.WithHelloTimeout(r.cfg.AgentTimeout)}
	if reach == backend.AgentDial {
		d, ok := b.(backend.AgentDialer)
		if !ok {
			return nil, backend.Errorf(backend.ErrUnsupported, "the driver says its agents are reached through it (agent %q) but does not implement DialAgent", reach)
		}
		c, err := agent.NewClient(ctx, func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, sandbox) }, opts...)
		if err == nil {
			r.viaPlugin.add(c, b)
		}
		return c, err
	}
	return agent.NewClient(ctx, agent.DialSocketDir(files.SocketDir), opts...)
}

// commit records the session on its sandbox (slow path: the record of a created or
// adopted sandbox is written only once the call has started; a claim of a pool
// member wrote it with the claim) and lets go of the sandbox's lock. On a failure to
// record, the call must be ended and fail called.
func (c *sessionConn) commit() error {
	if c.p == nil {
		return nil
	}
	c.p.rec.LastUsed = c.r.stamp()
	if c.p.member == nil || c.p.member.entry.Sandbox == "" { // a claim wrote its record (poolTake)
		if err := c.r.store.put(c.p.rec); err != nil {
			return fmt.Errorf("session %q: recording sandbox %s: %w", c.session, c.lease.Sandbox, err)
		}
	}
	if err := c.r.store.touch(c.session, c.lease.Sandbox, c.p.rec.LastUsed); err != nil {
		c.r.log.Warn("recording last use", "session", c.session, "error", err)
	}
	c.r.release(c.p, false)
	c.p = nil
	return nil
}

// fail undoes what the call did: a sandbox that it created is removed again, the
// lock is let go, and the connection closed.
func (c *sessionConn) fail() {
	if c.p != nil {
		c.r.undo(c.p)
		c.busy.unlock(c.madeBusy)
		c.r.release(c.p, true)
		c.p = nil
		c.busy = nil
	}
	c.end(false)
}

// done ends a call that started: last use is touched, the busy marker let go, the
// connection closed.
func (c *sessionConn) done() { c.end(true) }

func (c *sessionConn) end(touch bool) {
	if c.ended {
		return
	}
	c.ended = true
	if c.refill != nil && c.refill.Stop() {
		c.r.kickPools() // the claim's refill, now that its call is over
	}
	if touch {
		if err := c.r.store.touch(c.session, c.lease.Sandbox, c.r.stamp()); err != nil {
			c.r.log.Warn("recording last use", "session", c.session, "error", err)
		}
	}
	c.busy.unlock(false)
	if c.client != nil && !c.cached {
		c.client.Close()
	}
}

// callErr wraps err, an error of the call on the agent, with the session, sandbox and
// driver, and says when the driver's plugin has crashed meanwhile. A lost connection
// to the agent (agent.ConnectionLost: the agent died, or the sandbox stopped or
// vanished under the call) is said as such, with what the driver says of the sandbox
// now (lostCause).
func (c *sessionConn) callErr(what string, err error) error {
	return c.wrapErr(what, "", err)
}

// runErr is callErr for the end of a call whose command was running (Wait).
func (c *sessionConn) runErr(what string, err error) error {
	return c.wrapErr(what, " while the command ran", err)
}

func (c *sessionConn) wrapErr(what, during string, err error) error {
	if err == nil {
		return nil
	}
	where := fmt.Sprintf("session %q: %s in sandbox %s on driver %s", c.session, what, c.lease.Sandbox, c.lease.Driver)
	if agent.ConnectionLost(err) && c.r.lostWithPlugin(c.client) {
		return fmt.Errorf("%s: %w", where, &DriverCrashedError{Driver: c.lease.Driver, Op: what, Err: fmt.Errorf(
			"the connection to the sandbox's agent runs through the driver's plugin and was lost with it%s (%w); a command that ran is killed with its tree when its connection drops; berth starts the plugin again, and the next call works on the same sandbox", during, err)})
	}
	if agent.ConnectionLost(err) {
		return fmt.Errorf("%s: lost the connection to the sandbox's agent%s (%w); %s", where, during, err, c.r.lostCause(c.lease.Driver, c.lease.Sandbox))
	}
	return fmt.Errorf("%s: %w", where, c.r.crashed(c.lease.Driver, err))
}

// lostCause says why a call may have lost its agent, from the driver's Inspect of the
// sandbox (bounded by the config's agent_timeout), and what the next call does.
func (r *Registry) lostCause(driver, sandbox string) string {
	bound := r.cfg.AgentTimeout
	if bound <= 0 {
		bound = config.DefaultAgentTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	b, err := r.driver(ctx, driver)
	if err != nil {
		return fmt.Sprintf("its driver could not be asked what became of the sandbox: %v", err)
	}
	sb, err := b.Inspect(ctx, sandbox)
	switch {
	case errors.Is(err, backend.ErrNotFound):
		return "the sandbox is gone (removed behind berth's back); the next call creates a new, empty one"
	case err != nil:
		return fmt.Sprintf("its driver could not tell what became of the sandbox: %v", r.crashed(driver, err))
	case sb.State != backend.StateRunning && sb.EndReason != "":
		return fmt.Sprintf("the sandbox is %s now: it ended during the call (%s); the command's outcome is unknown; the next call starts it again", sb.State, endCause(sb))
	case sb.State != backend.StateRunning:
		return fmt.Sprintf("the sandbox is %s now: it stopped or died during the call; the command's outcome is unknown; the next call starts it again", sb.State)
	}
	return "its driver still says the sandbox runs, but its agent is gone (killed or crashed, or the sandbox is going down); the command's outcome is unknown; the next call starts the sandbox's agent again"
}

// sandboxRunning reports whether rec's sandbox is running on its driver (false when
// it is stopped or gone), asking the driver.
func (r *Registry) sandboxRunning(ctx context.Context, rec record) (bool, error) {
	b, err := r.driver(ctx, rec.Driver)
	if err != nil {
		return false, fmt.Errorf("session %q: %w", rec.Session, err)
	}
	sb, err := b.Inspect(ctx, rec.Sandbox)
	if errors.Is(err, backend.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("session %q: sandbox %s: %w", rec.Session, rec.Sandbox, err)
	}
	return sb.State == backend.StateRunning, nil
}

// dialSandbox connects to the agent of sandbox on driver b, which runs (prune's
// question whether background jobs run there): its socket in the sandbox's host dir,
// or b's AgentDialer. It fails for drivers without agent.
func (r *Registry) dialSandbox(ctx context.Context, b backend.TerminalBackend, driver, sandbox string) (*agent.Client, error) {
	caps, err := r.capabilities(ctx, b)
	if err != nil {
		return nil, err
	}
	if !caps.HasAgent() {
		return nil, backend.Errorf(backend.ErrUnsupported, "driver %s runs no berth agent", driver)
	}
	dir := r.sandboxDir(driver, sandbox)
	files := backend.AgentFiles{Dir: filepath.Join(dir, "agent"), SocketDir: filepath.Join(dir, "run")}
	ctx, cancel := context.WithTimeout(ctx, agentQueryTimeout)
	defer cancel()
	return r.connectAgent(ctx, b, caps.Agent, sandbox, files)
}

// agentQueryTimeout bounds prune's question to a sandbox's agent.
const agentQueryTimeout = 10 * time.Second

// specSummary is what a call's first look at its session needs of the sandbox spec
// that the session's rule gives (config.Rule.Spec): the sandbox's name and the
// spec's hash (LabelSpecHash).
type specSummary struct {
	Name, Hash string
}

// specMemo keeps the specSummary of each (rule, owner, session) that a registry's
// calls looked at: Rule.Spec encodes the spec as JSON and hashes it, 25 µs of CPU a
// call here, and a config's rules do not change while a registry holds it. It keeps
// at most specMemoMax entries and starts afresh when full.
type specMemo struct {
	mu sync.Mutex
	m  map[specMemoKey]specSummary
}

type specMemoKey struct {
	rule           *config.Rule
	owner, session string
}

const specMemoMax = 4096

// get returns the specSummary of session under rule and owner.
func (m *specMemo) get(rule *config.Rule, owner, session string) specSummary {
	k := specMemoKey{rule, owner, session}
	m.mu.Lock()
	s, ok := m.m[k]
	m.mu.Unlock()
	if ok {
		return s
	}
	spec := rule.Spec(owner, session)
	s = specSummary{Name: spec.Name, Hash: spec.Labels[backend.LabelSpecHash]}
	m.mu.Lock()
	if m.m == nil || len(m.m) >= specMemoMax {
		m.m = make(map[specMemoKey]specSummary)
	}
	m.m[k] = s
	m.mu.Unlock()
	return s
}
