package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/flock"
	"github.com/berth-sh/berth/internal/phase"
)

// LaunchFunc starts the driver named driver out of process and returns a client for
// it (see package backends and WithLauncher). It is called at most once per driver
// and Registry, again only after a launched plugin has exited; its error is returned
// from the call that needed the driver.
type LaunchFunc func(ctx context.Context, driver string) (backend.TerminalBackend, error)

// PrepareAgentFunc prepares the agent files of one sandbox in sandboxDir
// (STATE/sandboxes/DRIVER/SANDBOX, or STATE/sandboxes/SANDBOX for a sandbox that an
// earlier version made) and returns their paths for backend.CreateRequest.Agent.
// sandboxDir, and its parent, may not exist yet: create them as needed (MkdirAll).
type PrepareAgentFunc func(sandboxDir string) (backend.AgentFiles, error)

// PullEvent is one progress event of an image pull made for a session's sandbox.
type PullEvent struct {
	// Session, Driver and Image say which pull this is: the session whose sandbox is
	// being created, its rule's driver and its rule's image.
	Session string
	Driver  string
	Image   string
	backend.PullProgress
}

// Registry maps sessions to sandboxes. It is safe for concurrent use, and several
// processes may use one state dir at once. Close it to end the plugins it launched.
type Registry struct {
	cfg       *config.Config
	stateDir  string
	log       hclog.Logger
	known     []string
	inProcess map[string]func() backend.TerminalBackend
	launch    LaunchFunc
	prepare   PrepareAgentFunc
	onPull    func(PullEvent)
	onSandbox func(SandboxEvent)
	onPool    func(PoolEvent)
	poolKick  chan struct{} // RunPools wakes on it after a claim
	// poolRounds counts the rounds RunPools has finished (tests wait for it to be
	// idle before they claim).
	poolRounds atomic.Int64
	// maker is the flock that marks this registry's pool reservations as alive
	// (poolMaker), makerID its id; taken on first use, let go by Close.
	makerMu   sync.Mutex
	maker     *flock.Held
	makerID   string
	supervise *SupervisePolicy
	store     *store
	caps      sync.Map // backend.TerminalBackend → backend.Capabilities
	clock     func() time.Time
	offset    time.Duration // WithClockOffset: retention is judged at clock+offset
	grace     time.Duration
	agentSrc  string

	initMu sync.Mutex
	owner  string

	drvMu   sync.Mutex
	drivers map[string]*driverEntry
	closed  bool

	// agents are the clients of the agents that calls reached directly.
	agents agentCache
	// specs keeps what a call's first look at its session needs of its rule's spec.
	specs specMemo
	// viaPlugin holds, for each agent client reached through a driver plugin
	// (AgentDial), that plugin (dialedThrough).
	viaPlugin viaPlugins

	// life ends when the registry is closed: supervision's goroutines stop then.
	life    context.Context
	endLife context.CancelFunc
}

type driverEntry struct {
	mu sync.Mutex
	b  backend.TerminalBackend
	// Supervision (WithSupervision): when b was started; down is non-nil while a
	// restart is pending and closed when it ends; attempt counts the restarts in a
	// row, nextTry is when the next one is due, lastErr the last one's failure.
	started time.Time
	down    chan struct{}
	attempt int
	nextTry time.Time
	lastErr error
}

// Open returns a registry over cfg (nil means config.Default(): every session on
// the local driver) with opts. It reads no environment variable and no config file:
// the caller resolves settings (berth's CLI applies flags > BERTH_* environment >
// config file > defaults) and passes the result as cfg and opts; only the default
// launcher, when it later looks for a third-party driver's executable, searches
// $BERTH_PLUGIN_PATH first (package backends; see WithLauncher), and the mount
// policy (CheckMounts), when Acquire meets a rule with mounts, looks up which host
// directories to protect besides the state dir (other users' default state dirs,
// plugin socket dirs; package internal/hostpaths reads the host's environment and
// /etc/passwd for that, never a setting of this registry). It checks that the
// state dir (WithStateDir, else cfg.StateDir) can be written, and creates nothing:
// the state dir, its store (schema version, owner id) and lock dir are made by the
// first call that needs them. The registry keeps cfg: do not change it while the
// registry is open (its calls remember what cfg's rules say of the sessions they
// saw). The registry knows the drivers cfg was checked
// against (cfg.KnownDrivers) and those of WithDriver and WithPlugin. ctx is not
// kept. Errors (each wrapping backend.ErrInvalid and naming the input): an option's
// own error, no state dir, a state dir that cannot be written, no berth binary
// (os.Executable failed and WithBerthBinary was not given).
func Open(ctx context.Context, cfg *config.Config, opts ...Option) (*Registry, error) {
	var o options
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if cfg == nil {
		cfg = config.Default()
	}
	log := o.logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	known := slices.Clone(cfg.KnownDrivers)
	for name := range o.plugins {
		if !slices.Contains(known, name) {
			known = append(known, name)
		}
	}
	for name := range o.inProcess {
		if !slices.Contains(known, name) {
			known = append(known, name)
		}
	}
	sort.Strings(known)

	bin := o.berthBinary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return nil, backend.Errorf(backend.ErrInvalid, "finding the berth binary: %w; pass registry.WithBerthBinary", err)
		}
	}
	stateDir := o.stateDir
	if stateDir == "" {
		stateDir = cfg.StateDir
	}
	if stateDir == "" {
		return nil, backend.Errorf(backend.ErrInvalid, "registry.Open: no state dir; pass registry.WithStateDir(DIR) or set state_dir in the config")
	}
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, stateDirError(stateDir, err.Error())
	}
	if err := checkStateDir(stateDir); err != nil {
		return nil, err
	}

	agentSrc := cfg.AgentPath
	if agentSrc == "" {
		agentSrc = bin
	}
	r := &Registry{
		cfg:       cfg,
		stateDir:  stateDir,
		log:       log,
		known:     known,
		inProcess: o.inProcess,
		launch:    o.launch,
		prepare:   o.prepare,
		onPull:    o.onPull,
		onSandbox: o.onSandbox,
		onPool:    o.onPool,
		poolKick:  make(chan struct{}, 1),
		supervise: o.supervise,
		store:     newStore(filepath.Join(stateDir, StoreFile), o.storeTimeout),
		drivers:   map[string]*driverEntry{},
		clock:     o.clock,
		offset:    o.clockOffset,
		grace:     o.grace,
		agentSrc:  agentSrc,
	}
	r.life, r.endLife = context.WithCancel(context.Background())
	if r.clock == nil {
		r.clock = time.Now
	}
	if r.grace <= 0 {
		r.grace = DefaultOrphanGrace
	}
	if r.launch == nil {
		r.launch = defaultLaunch(bin, stateDir, cfg, o.plugins, log)
	}
	if r.prepare == nil {
		r.prepare = defaultPrepareAgent(stateDir, agentSrc)
	}
	return r, nil
}

// Config returns the config Open was given (config.Default() for nil); its Path is
// the config file, or "" for the built-in one. Do not modify it.
func (r *Registry) Config() *config.Config { return r.cfg }

// StateDir returns the resolved, absolute state dir.
func (r *Registry) StateDir() string { return r.stateDir }

// ClockOffset returns the offset at which retention is judged (WithClockOffset; 0
// for none).
func (r *Registry) ClockOffset() time.Duration { return r.offset }

// OrphanGrace returns the grace period of Prune (WithOrphanGrace, default
// DefaultOrphanGrace).
func (r *Registry) OrphanGrace() time.Duration { return r.grace }

// Owner returns the installation's owner id (32 hex digits), creating the state dir
// and store on first use.
func (r *Registry) Owner() (string, error) {
	if err := r.ensure(); err != nil {
		return "", err
	}
	return r.owner, nil
}

// ensure creates the state dir, its lock dir and the store (once per Registry). On
// failure it removes whatever it created.
func (r *Registry) ensure() error {
	r.initMu.Lock()
	defer r.initMu.Unlock()
	if r.owner != "" {
		return nil
	}
	made, err := mkdirTracked(r.stateDir)
	if err != nil {
		return stateDirError(r.stateDir, err.Error())
	}
	madeLocks := false
	fail := func(err error) error {
		if madeLocks {
			os.Remove(filepath.Join(r.stateDir, "locks"))
		}
		removeDirs(made)
		return err
	}
	if err := os.Mkdir(filepath.Join(r.stateDir, "locks"), 0o700); err == nil {
		madeLocks = true
	} else if !errors.Is(err, os.ErrExist) {
		return fail(stateDirError(r.stateDir, err.Error()))
	}
	owner, err := r.store.init()
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			err = stateDirError(r.stateDir, err.Error())
		}
		return fail(err)
	}
	r.owner = owner
	r.writeStateMarker()
	return nil
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// Explanation is what Explain reports about a session.
type Explanation struct {
	// Session is the session name asked about.
	Session string
	// Rule is the matching rule; RuleIndex its position from 0; Position its
	// "file:line:col" (or "(built-in default)").
	Rule      *config.Rule
	RuleIndex int
	Position  string
	// Driver and Isolation are the rule's.
	Driver    string
	Isolation config.Isolation
	// Sandbox is the sandbox name; Spec the full spec (labels included, except
	// LabelCreated which is set at create time); SpecHash its LabelSpecHash.
	Sandbox  string
	Spec     backend.SandboxSpec
	SpecHash string
}

// Explain says which rule matches session, which driver runs it and what its
// sandbox spec is, without starting any driver. Errors: those of Config.Match, and
// state dir errors (the owner id is needed for the sandbox name).
func (r *Registry) Explain(session string) (Explanation, error) {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return Explanation{}, err
	}
	rule, idx, err := r.cfg.Match(session)
	if err != nil {
		return Explanation{}, err
	}
	owner, err := r.Owner()
	if err != nil {
		return Explanation{}, err
	}
	spec := rule.Spec(owner, session)
	return Explanation{
		Session: session, Rule: rule, RuleIndex: idx, Position: rule.Pos(),
		Driver: rule.Driver, Isolation: rule.Isolation,
		Sandbox: spec.Name, Spec: spec, SpecHash: spec.Labels[backend.LabelSpecHash],
	}, nil
}

// Lease is a session's sandbox, ready for execs.
type Lease struct {
	// Session is the session name.
	Session string
	// Driver is the driver's name (Registry.Backend returns the driver).
	Driver string
	// Sandbox is the sandbox name.
	Sandbox string
	// Rule is the matching scope rule.
	Rule *config.Rule
	// Direct is set when the call reached the sandbox's running agent without its
	// driver's lifecycle (the session's recorded sandbox answered on its socket, or
	// through its driver's DialAgent).
	Direct bool
	// Created is set when this call created the sandbox, clear when it adopted one;
	// a sandbox claimed from a warm pool counts as created.
	Created bool
	// Pooled is set when the sandbox is a warm pool member that the session claimed
	// (this call, or an earlier one): its name is the member's, not the session's.
	Pooled bool
	// Drift is set when the sandbox's LabelSpecHash differs from the rule's current
	// spec (the config changed since it was created).
	Drift bool
	// Recreated is set when the session had a sandbox before and this call had to
	// create a new, empty one: retention removed the old one (idle_ttl with
	// idle_action "remove", max_age) or it vanished from its driver. Files written
	// there are gone; RecreatedReason says why. Callers should tell the user.
	Recreated       bool
	RecreatedReason string
	// Moved is set when the session's rule now maps it back to a sandbox it had before
	// (adopted with its files) instead of the one it used last, which keeps running
	// until berth prune removes it; MovedReason says which. Callers should tell the
	// user.
	Moved       bool
	MovedReason string
}

// pending is an acquired sandbox whose lock is still held and whose record is not
// yet written.
type pending struct {
	lease    *Lease
	b        backend.TerminalBackend
	caps     backend.Capabilities
	files    backend.AgentFiles
	spec     backend.SandboxSpec
	driver   string
	dir      string
	madeDir  bool
	lock     *flock.Held // the lock of the session's own sandbox name (lockName)
	lockName string
	rec      record
	released bool
	// member is set when the sandbox is a pool member (acquireMember): its lock,
	// and for a new claim its pool entry. client is the member's agent client when
	// the claim dialled it (kept in the Registry's agentCache).
	member *claimed
	client *agent.Client
	// refill, set by a claim, kicks RunPools after PoolRefillDelay; the call's end
	// kicks it sooner (sessionConn.end).
	refill *time.Timer
}

func (r *Registry) lockPath(sandbox string) string {
	return filepath.Join(r.stateDir, "locks", sandbox+".lock")
}

// acquire resolves session, takes its sandbox's lock, and creates, adopts or starts
// the sandbox through its driver (the slow path of every call; open has applied the
// mount policy to the rule). On error it holds no lock and has left nothing behind.
func (r *Registry) acquire(ctx context.Context, session string) (*pending, error) {
	rule, _, err := r.cfg.Match(session)
	if err != nil {
		return nil, err
	}
	if err := r.ensure(); err != nil {
		return nil, err
	}
	spec := rule.Spec(r.owner, session)
	lock, err := flock.Lock(ctx, r.lockPath(spec.Name))
	if err != nil {
		return nil, fmt.Errorf("session %q: %w", session, err)
	}
	p := &pending{spec: spec, lock: lock, lockName: spec.Name, driver: rule.Driver, dir: r.sandboxDir(rule.Driver, spec.Name)}
	if ok, err := r.acquireMember(ctx, p, session, rule); err != nil || ok {
		if err != nil {
			r.release(p, true)
			return nil, err
		}
		return p, nil
	}
	if err := r.createIn(ctx, p, session, rule); err != nil {
		r.release(p, true)
		return nil, err
	}
	return p, nil
}

// createIn is acquire's work under the sandbox's lock: expiry of the session's own
// sandbox, the agent files, the image, the driver's Create, and the lease and record
// it leads to.
func (r *Registry) createIn(ctx context.Context, p *pending, session string, rule *config.Rule) error {
	name := p.spec.Name
	b, err := r.driver(ctx, rule.Driver)
	if err != nil {
		return fmt.Errorf("session %q: %w", session, err)
	}
	if p.caps, err = r.capabilities(ctx, b); err != nil {
		return fmt.Errorf("session %q: driver %s: %w", session, rule.Driver, err)
	}
	if p.caps, err = RuntimeCapabilities(p.caps, rule); err != nil {
		return fmt.Errorf("session %q: %w", session, err)
	}
	p.b = b
	old, recorded, err := r.store.get(session)
	if err != nil {
		return fmt.Errorf("session %q: %w", session, err)
	}
	hadOld := recorded && old.Sandbox == name && old.Driver == rule.Driver
	if hadOld {
		if old, err = r.expireOwn(ctx, b, rule, old); err != nil {
			return fmt.Errorf("session %q: %w", session, err)
		}
	}
	// A claimed pool member that is gone (acquireMember found it so, and the pool
	// had none to give) is replaced like the session's own sandbox would be.
	wasMember := recorded && old.Pooled && old.Driver == rule.Driver
	moved := recorded && !hadOld && !wasMember && old.Removed.IsZero()
	if moved && old.Driver != rule.Driver {
		r.markDriver(old.Driver) // so that prune finds the sandbox left behind
	}
	p.madeDir = !fileExists(p.dir)
	if err := os.MkdirAll(filepath.Dir(p.dir), 0o700); err != nil {
		return stateDirError(r.stateDir, err.Error())
	}
	if p.files, err = r.prepare(p.dir); err != nil {
		return r.dropDir(p, fmt.Errorf("session %q: preparing the agent for sandbox %s: %w", session, name, err))
	}
	// What the driver holds of the name before the create: whether an image must be
	// pulled, whether a sandbox there after a failed create is this call's, and
	// whether one is there whose host-side files are gone (stranded).
	pre, preErr := b.Inspect(ctx, name)
	if err := ctx.Err(); err != nil {
		return r.dropDir(p, fmt.Errorf("session %q: %w", session, err))
	}
	existed := !errors.Is(preErr, backend.ErrNotFound) // or the driver could not say
	stranded := ""
	if preErr == nil && p.madeDir && p.caps.HasAgent() && pre.Labels[backend.LabelOwner] == r.owner {
		// Its agent holds a token that went with its host dir: nothing can reach it
		// (a create abandoned by an earlier berth, a host dir deleted by hand).
		if err := r.removeStranded(ctx, p, "its host-side files (agent token and socket dir) were gone"); err != nil {
			return r.dropDir(p, fmt.Errorf("session %q: %w", session, err))
		}
		existed = false
		stranded = fmt.Sprintf("its sandbox %s on driver %s could not be reached (its host-side files, the agent's token and socket dir, were gone); it was removed and this one is new and empty", name, rule.Driver)
	}
	if errors.Is(preErr, backend.ErrNotFound) || stranded != "" {
		if err := r.pullImage(ctx, b, rule, session, name); err != nil {
			return r.dropDir(p, err)
		}
	}
	now := r.stamp()
	p.spec.Labels[backend.LabelCreated] = now.Format(time.RFC3339)
	var sb backend.Sandbox
	for attempt := 0; ; attempt++ {
		sb, b, err = r.createDetached(ctx, rule.Driver, b, backend.CreateRequest{Spec: p.spec, Agent: p.files})
		p.b = b
		if err == nil {
			break
		}
		cctx, cancel := detached(ctx, cleanupBound)
		doing := r.createDoing(cctx, b, name, hadOld && old.Removed.IsZero(), err)
		cancel()
		err = fmt.Errorf("session %q: %s on driver %s: %w", session, doing, rule.Driver, err)
		cleared, removedOld := r.clearFailedCreate(ctx, p, existed)
		if removedOld && attempt == 0 && ctx.Err() == nil {
			// An unrecorded sandbox of ours that could not be adopted (its agent
			// holds a token that is not its host dir's, or does not answer): no
			// session had used it, and it is gone now; make it anew.
			r.log.Warn("an unused sandbox of the session's name could not be adopted; removed it to make a new one", "session", session, "sandbox", name, "error", err)
			existed = false
			stranded = fmt.Sprintf("its sandbox %s on driver %s, which no call had used, could not be adopted (%v); it was removed and this one is new and empty", name, rule.Driver, err)
			continue
		}
		if !cleared {
			return err // a sandbox that may use the host dir may be there: the dir stays
		}
		return r.dropDir(p, err)
	}
	if o := sb.Labels[backend.LabelOwner]; o != "" && o != r.owner {
		return backend.Errorf(backend.ErrConflict, "session %q: driver %s returned sandbox %s of owner %s, not ours (%s); refusing to use it", session, rule.Driver, name, o, r.owner)
	}
	p.lease, p.rec = r.leaseOf(session, rule, p, sb, now)
	switch {
	case stranded != "" && !sb.Adopted:
		p.lease.Recreated, p.lease.RecreatedReason = true, stranded
		r.log.Warn("session's sandbox could not be reached; created a new one", "session", session, "sandbox", name, "reason", stranded)
	case (hadOld || wasMember) && !sb.Adopted:
		p.lease.Recreated, p.lease.RecreatedReason = true, recreatedReason(old, rule.Driver, sb)
		r.log.Warn("session's sandbox was gone; created a new one", "session", session, "sandbox", name, "reason", p.lease.RecreatedReason)
	case hadOld && sb.EndReason != "":
		r.log.Warn("session's sandbox had ended; started it again with its files", "session", session, "sandbox", name, "reason", endCause(sb))
	case moved && !sb.Adopted:
		p.lease.Recreated, p.lease.RecreatedReason = true, movedReason(old, rule, name)
	case moved:
		p.lease.Moved, p.lease.MovedReason = true, movedBackReason(old, rule, name)
	}
	if !sb.Adopted {
		cause := CreateNew
		switch {
		case moved:
			cause = CreateMoved
		case hadOld || wasMember || stranded != "":
			cause = CreateRecreated
		}
		r.event(SandboxEvent{Action: EventCreate, Driver: rule.Driver, Sandbox: name, Cause: cause})
	}
	if recorded && !hadOld {
		r.log.Warn("session moves to another sandbox; the old one is left for prune", "session", session,
			"old_driver", old.Driver, "old_sandbox", old.Sandbox, "driver", rule.Driver, "sandbox", name)
	}
	return nil
}

// createDoing says what a failed Create of sandbox was doing, for its error: creating
// a new sandbox, or starting (adopting) the one that exists. A driver's Create does
// both; a sandbox that is there after the failure was there before (a failed create
// leaves nothing behind), so the driver's Inspect tells, and when it cannot, the
// session's record does (recorded says it names the sandbox, not removed). A name
// held by something not ours (ErrConflict) was a create.
func (r *Registry) createDoing(ctx context.Context, b backend.TerminalBackend, sandbox string, recorded bool, err error) string {
	existed := recorded
	if !errors.Is(err, backend.ErrConflict) {
		if sb, ierr := b.Inspect(ctx, sandbox); ierr == nil {
			return fmt.Sprintf("starting its existing sandbox %s (%s)", sandbox, sb.State)
		} else if errors.Is(ierr, backend.ErrNotFound) {
			existed = false
		}
	} else {
		existed = false
	}
	if existed {
		return fmt.Sprintf("starting its existing sandbox %s", sandbox)
	}
	return fmt.Sprintf("creating sandbox %s", sandbox)
}

// leaseOf makes the lease and the record of session on sb, which the driver has just
// created or adopted at now: the creation time is the sandbox's (its LabelCreated,
// else the runtime's) for an adopted one, the spec hash the sandbox's, and drift
// their difference from the rule's current spec.
func (r *Registry) leaseOf(session string, rule *config.Rule, p *pending, sb backend.Sandbox, now time.Time) (*Lease, record) {
	want := p.spec.Labels[backend.LabelSpecHash]
	have := sb.Labels[backend.LabelSpecHash]
	if have == "" {
		have = want
	}
	// A new sandbox's time is LabelCreated's (RFC 3339: whole seconds), which is
	// what a later adoption (a restart after a stop) reads back: the time stays the
	// same across a stop and start.
	created := now.Truncate(time.Second)
	if t, err := time.Parse(time.RFC3339, sb.Labels[backend.LabelCreated]); sb.Adopted && err == nil {
		created = t
	} else if sb.Adopted && !sb.CreatedAt.IsZero() {
		created = sb.CreatedAt.UTC()
	}
	lease := &Lease{
		Session: session, Driver: rule.Driver, Sandbox: p.spec.Name, Rule: rule,
		Created: !sb.Adopted, Drift: sb.Adopted && have != want,
	}
	if lease.Drift {
		r.log.Warn("sandbox differs from its rule's current spec (drift)", "session", session, "sandbox", p.spec.Name, "rule", rule.Pos())
	}
	rec := record{
		Session: session, Driver: rule.Driver, Sandbox: p.spec.Name, Scope: rule.Glob,
		SpecHash: have, Created: created, LastUsed: now, Agent: p.caps.Agent,
	}
	return lease, rec
}

// pull makes sure the rule's image is there, by the rule's pull policy, when sandbox
// does not exist yet and the driver pulls images; a sandbox that exists is adopted
// as it is, whatever its image. A driver without ImagePuller (or whose plugin
// reports ErrUnsupported) is left to Create, which reports a missing image itself.
func (r *Registry) pull(ctx context.Context, b backend.TerminalBackend, rule *config.Rule, session, sandbox string) error {
	if _, ok := b.(backend.ImagePuller); rule.Image == "" || !ok {
		return nil
	}
	if _, err := b.Inspect(ctx, sandbox); !errors.Is(err, backend.ErrNotFound) {
		return nil // there (Create adopts it) or an error that Create reports
	}
	return r.pullImage(ctx, b, rule, session, sandbox)
}

// pullImage is pull for a sandbox that the caller knows is not there.
func (r *Registry) pullImage(ctx context.Context, b backend.TerminalBackend, rule *config.Rule, session, sandbox string) error {
	puller, ok := b.(backend.ImagePuller)
	if rule.Image == "" || !ok {
		return nil
	}
	var progress func(backend.PullProgress)
	if r.onPull != nil {
		progress = func(p backend.PullProgress) {
			r.onPull(PullEvent{Session: session, Driver: rule.Driver, Image: rule.Image, PullProgress: p})
		}
	}
	err := puller.PullImage(ctx, rule.Image, rule.Pull, progress)
	if err == nil || errors.Is(err, backend.ErrUnsupported) {
		return nil
	}
	return fmt.Errorf("session %q: image %s for sandbox %s (pull = %q, %s): %w", session, rule.Image, sandbox, rule.Pull, rule.Pos(), err)
}

// dropDir removes the sandbox dir that acquire made, and returns err.
func (r *Registry) dropDir(p *pending, err error) error {
	if p.madeDir {
		os.RemoveAll(p.dir)
	}
	return err
}

// undo removes a sandbox that this call created (and its dir); adopted sandboxes
// are left alone.
func (r *Registry) undo(p *pending) {
	if p.lease == nil || !p.lease.Created {
		return
	}
	if p.member != nil && p.member.entry.Sandbox != "" {
		// A claimed member that served no call: the session's record as it was
		// before the claim, and the member never handed to anyone again.
		if err := r.store.poolUntake(p.lease.Session, p.lease.Driver, p.lease.Sandbox, p.member.prev); err != nil {
			r.log.Error("undoing a claim after a failed call", "session", p.lease.Session, "sandbox", p.lease.Sandbox, "error", err)
		}
		r.agents.forget(sbKey{p.lease.Driver, p.lease.Sandbox})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.b.Remove(ctx, p.lease.Sandbox); err != nil {
		r.log.Error("removing a sandbox after a failed call", "sandbox", p.lease.Sandbox, "error", err)
		return
	}
	r.event(SandboxEvent{Action: EventRemove, Driver: p.lease.Driver, Sandbox: p.lease.Sandbox, Cause: RemoveFailedCreate})
	os.RemoveAll(p.dir)
}

// release drops p's lock; failed releases remove the busy marker when no record
// names the sandbox on its driver, and the lock file when no record names a sandbox
// of its name on any driver.
func (r *Registry) release(p *pending, failed bool) {
	if p.released {
		return
	}
	p.released = true
	removeLock, removeMemberLock := false, false
	if !failed && p.member != nil && p.lockName != p.spec.Name {
		// A claim: the session's record names its member, so nothing is named
		// after the session's own sandbox name; its lock file goes (flock makes a
		// waiter that still holds it start over on a new file).
		removeLock = true
	}
	if failed {
		onDriver, anyDriver := r.recorded(p.driver, p.spec.Name)
		if !onDriver {
			os.Remove(r.busyPath(p.driver, p.spec.Name))
		}
		removeMemberLock = !anyDriver
		if p.lockName != p.spec.Name {
			_, anyDriver = r.recorded(p.driver, p.lockName)
		}
		removeLock = !anyDriver
	}
	if p.member != nil {
		p.member.lock.Unlock(removeMemberLock && p.member.entry.Sandbox != "" && !fileExists(p.dir))
	}
	p.lock.Unlock(removeLock)
}

// recorded reports whether a record names sandbox on driver, and on any driver (both
// true when the store cannot be read).
func (r *Registry) recorded(driver, sandbox string) (onDriver, anyDriver bool) {
	recs, err := r.store.all()
	if err != nil {
		return true, true
	}
	for _, rec := range recs {
		if rec.Sandbox == sandbox {
			anyDriver = true
			onDriver = onDriver || rec.Driver == driver
		}
	}
	return onDriver, anyDriver
}

// Acquire returns session's sandbox, ready for execs: the recorded sandbox when its
// agent answers (Lease.Direct, no driver started), else created or adopted (and
// started) by its driver, and records session → sandbox with its last use in the
// store. It holds the sandbox's lock (STATE/locks/SANDBOX.lock, an flock shared with
// other processes) while it changes anything. Errors: a bad session name or no
// matching rule (ErrInvalid); the driver cannot be started or configured; the
// driver's Create error (ErrConflict when the name is held by something not ours,
// ErrUnavailable, ...), wrapped with the session and sandbox; an agent that does not
// answer as it should (see Exec). A failed Acquire leaves the store unchanged and no
// new sandbox behind.
//
// Before it uses the session's recorded sandbox, Acquire applies the rule's
// idle_ttl and max_age to it (and to nothing else): an idle sandbox with
// idle_action "stop" is stopped and started again, one with "remove" or past
// max_age is removed (its record marked so, even when the call then fails) and
// replaced, and the Lease says Recreated with the reason. The same holds for a
// recorded sandbox that its driver no longer has.
func (r *Registry) Acquire(ctx context.Context, session string) (*Lease, error) {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return nil, err
	}
	c, err := r.open(ctx, session, openCreate)
	if err != nil {
		return nil, err
	}
	if err := c.commit(); err != nil {
		c.fail()
		return nil, err
	}
	c.done()
	return c.lease, nil
}

// Exec starts req in session's sandbox (see Acquire for how it is reached, created
// and expired), with DefaultExecEnv added for the variables that neither req nor the
// rule's env sets. A session whose recorded sandbox's agent answers is served
// without starting its driver; otherwise the lifecycle runs first, the session's
// record is written only once the exec has started, and when the exec fails to start
// in a sandbox that this call created, the sandbox is removed again and the store is
// left unchanged. Last use is touched when Wait returns. Until then the exec holds a
// shared flock on STATE/locks/SANDBOX.DRIVER.busy, so no berth process counts the
// sandbox as idle; call Wait for every started exec.
//
// Errors: those of Acquire; the agent's (ErrInvalid for a missing req.Dir, ...); a
// sandbox whose agent socket was replaced from inside it (ErrConflict), whose agent
// is of an older berth (ErrUnsupported), or whose agent accepts but does not answer
// within the config's agent_timeout (ErrTimeout): each names the session and the
// way out (berth stop, berth exec --recreate, berth rm).
func (r *Registry) Exec(ctx context.Context, session string, req backend.ExecRequest) (backend.Process, *Lease, error) {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return nil, nil, err
	}
	if err := backend.CheckExecText(req); err != nil {
		return nil, nil, fmt.Errorf("session %q: %w", session, err)
	}
	if err := backend.CheckArgv(req); err != nil { // before a sandbox is made for it
		return nil, nil, fmt.Errorf("session %q: %w", session, err)
	}
	for attempt := 0; ; attempt++ {
		c, err := r.open(ctx, session, openCreate)
		if err != nil {
			return nil, nil, err
		}
		req := req
		req.Env = withDefaultEnv(c.lease.Rule, req.Env)
		var proc backend.Process
		if c.client != nil {
			proc, err = c.client.Exec(ctx, req)
		} else if ex, ok := c.b.(backend.Execer); ok {
			proc, err = ex.Exec(ctx, c.lease.Sandbox, req)
		} else {
			err = backend.Errorf(backend.ErrUnsupported, "driver %s runs no berth agent and does not implement Exec", c.lease.Driver)
		}
		if err != nil {
			lost := attempt == 0 && c.lost(err)
			c.fail()
			if lost {
				continue // a kept connection had gone: nothing ran; once more
			}
			return nil, nil, c.callErr("exec", err)
		}
		if c.p != nil {
			callTrace(ctx).started(c.lease.Driver, c.lease.Sandbox)
		}
		if err := c.commit(); err != nil {
			proc.Signal(9)
			proc.Wait()
			c.fail()
			return nil, nil, err
		}
		phase.Mark("started")
		return &callProcess{Process: proc, c: c}, c.lease, nil
	}
}

// callProcess ends its call (sessionConn.done) when Wait returns: last use touched,
// busy marker let go, connection closed.
type callProcess struct {
	backend.Process
	c    *sessionConn
	once sync.Once
}

// Wait waits for the exec (see backend.Process) and ends the call; a failure to
// record the last use is logged, not returned. When the driver's plugin crashed
// during an exec through it, the error (ErrUnavailable) says so.
func (p *callProcess) Wait() (backend.ExecResult, error) {
	res, err := p.Process.Wait()
	phase.Mark("ended")
	p.once.Do(p.c.done)
	if err != nil {
		err = p.c.runErr("exec", err)
	}
	return res, err
}

// lockRecord takes the lock of session's recorded sandbox and re-reads the record
// under it. ok is false (and no lock held) when the session has no record.
func (r *Registry) lockRecord(ctx context.Context, session string) (rec record, lock *flock.Held, ok bool, err error) {
	for {
		rec, ok, err = r.store.get(session)
		if err != nil || !ok {
			return rec, nil, ok, err
		}
		lock, err = flock.Lock(ctx, r.lockPath(rec.Sandbox))
		if err != nil {
			return rec, nil, false, err
		}
		again, ok2, err := r.store.get(session)
		if err != nil || !ok2 {
			lock.Unlock(false)
			return rec, nil, false, err
		}
		if again.Sandbox == rec.Sandbox {
			return again, lock, true, nil
		}
		lock.Unlock(false) // moved meanwhile: lock the new sandbox
	}
}

// errNoSession is in the errors of calls on a session that the store does not
// record (with backend.ErrNotFound).
var errNoSession = errors.New("no sandbox recorded")

// noSessionError says that a session has no recorded sandbox; it is both
// backend.ErrNotFound and errNoSession.
type noSessionError struct{ session string }

func (e noSessionError) Error() string {
	return fmt.Sprintf("session %q has no sandbox (see berth sessions)", e.session)
}

func (e noSessionError) Is(target error) bool {
	return target == backend.ErrNotFound || target == errNoSession
}

func noSession(session string) error { return noSessionError{session} }

// CloseSession applies the on_close policy of session's rule to its sandbox: keep
// does nothing, stop stops it, remove removes it, forgets the session and deletes
// its host dir (as RemoveSession). Sessions of shared rules ignore a single
// session's close (nil). Like backend Stop and Remove, it is idempotent: a session
// with nothing to close (no record, a removed or stopped sandbox) succeeds, and
// creates nothing when there is no store yet. Errors: a bad session name or no
// matching rule (ErrInvalid); the driver's error.
func (r *Registry) CloseSession(ctx context.Context, session string) error {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return err
	}
	rule, _, err := r.cfg.Match(session)
	if err != nil {
		return err
	}
	if rule.Isolation == config.IsolationShared {
		r.log.Debug("close of a shared session ignored", "session", session, "rule", rule.Pos())
		return nil
	}
	if !fileExists(r.store.path) {
		return nil // no store: no session has anything to close
	}
	if err := r.ensure(); err != nil {
		return err
	}
	switch rule.Retention.OnClose {
	case config.OnCloseRemove:
		return nothingToDo(r.removeSession(ctx, session, RemoveClose))
	case config.OnCloseStop:
		return r.stopSession(ctx, session, "closing")
	}
	return nil
}

// StopSession stops session's sandbox whatever its rule's on_close says: every
// process in it ends (the agent asks them, then they are killed), its files stay
// where the driver keeps them (Capabilities.StopStart), and the session's next call
// starts it again, with the agent binary of the berth that makes that call (the way
// to move a sandbox onto a new berth's agent). For a shared sandbox every session on
// it is stopped. Stopping a stopped sandbox, or a session without one, succeeds.
// Errors: a bad session name (ErrInvalid); the driver's.
func (r *Registry) StopSession(ctx context.Context, session string) error {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return err
	}
	if err := r.ensure(); err != nil {
		return err
	}
	return r.stopSession(ctx, session, "stopping")
}

// stopSession stops session's recorded sandbox under its lock; doing says what for
// in errors. A session without a record succeeds.
func (r *Registry) stopSession(ctx context.Context, session, doing string) error {
	rec, lock, ok, err := r.lockRecord(ctx, session)
	if err != nil {
		return err
	}
	if !ok {
		return nil
	}
	defer lock.Unlock(false)
	b, err := r.driver(ctx, rec.Driver)
	if err != nil {
		return fmt.Errorf("%s session %q: %w", doing, session, err)
	}
	if _, err := r.again(ctx, rec.Driver, "stop sandbox "+rec.Sandbox, b, func(b backend.TerminalBackend) error { return b.Stop(ctx, rec.Sandbox, 0) }); err != nil {
		return fmt.Errorf("%s session %q: stopping sandbox %s: %w", doing, session, rec.Sandbox, err)
	}
	r.agents.forget(sbKey{rec.Driver, rec.Sandbox}) // its agent is gone
	return nil
}

// RemoveSession removes session's sandbox whatever on_close says, forgets every
// session recorded on it (for a shared sandbox: all of them) and deletes its host dir,
// STATE/sandboxes/DRIVER/SANDBOX. A sandbox made by an earlier version has its dir at
// STATE/sandboxes/SANDBOX, which every driver's sandbox of that name used: that dir is
// deleted only when no other driver has a sandbox of the name that may still use it,
// and left to Prune otherwise. A session without a record may still have a sandbox: a
// call that was abandoned before it wrote the record (a killed berth process) leaves
// the sandbox its rule maps the session to; when no record names that name and the
// rule's driver holds a sandbox of ours there, it is removed with its host dir (the
// rule's driver is started for this). Like backend Remove it is idempotent: a session
// with nothing to remove succeeds (nil), and nothing is created when there is no store
// yet. Errors: a bad session name (ErrInvalid); a driver that cannot be started; the
// driver's Remove error (the store is then unchanged).
func (r *Registry) RemoveSession(ctx context.Context, session string) error {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return err
	}
	if !fileExists(r.store.path) {
		return nil
	}
	if err := r.ensure(); err != nil {
		return err
	}
	err = r.removeSession(ctx, session, RemoveAsked)
	if !errors.Is(err, errNoSession) {
		return err
	}
	if _, _, err := r.cfg.Match(session); err != nil {
		return nil // no rule maps it to a sandbox: nothing to remove
	}
	_, err = r.removeUnrecorded(ctx, session, "removing", RemoveAsked)
	return err
}

// nothingToDo turns removeSession's "no record" (errNoSession) into success.
func nothingToDo(err error) error {
	if errors.Is(err, errNoSession) {
		return nil
	}
	return err
}

// removeSession removes session's recorded sandbox (see RemoveSession); a session
// without a record is noSession (ErrNotFound and errNoSession). cause is the
// SandboxEvent's.
func (r *Registry) removeSession(ctx context.Context, session, cause string) error {
	rec, lock, ok, err := r.lockRecord(ctx, session)
	if err != nil {
		return err
	}
	if !ok {
		return noSession(session)
	}
	removed := false
	defer func() { lock.Unlock(removed) }()
	b, err := r.driver(ctx, rec.Driver)
	if err != nil {
		return fmt.Errorf("removing session %q: %w", session, err)
	}
	if _, err := r.again(ctx, rec.Driver, "remove sandbox "+rec.Sandbox, b, func(b backend.TerminalBackend) error { return b.Remove(ctx, rec.Sandbox) }); err != nil {
		return fmt.Errorf("removing session %q: sandbox %s: %w", session, rec.Sandbox, err)
	}
	r.event(SandboxEvent{Action: EventRemove, Driver: rec.Driver, Sandbox: rec.Sandbox, Cause: cause})
	r.agents.forget(sbKey{rec.Driver, rec.Sandbox}) // its agent is gone
	if _, err := r.store.forgetSandbox(rec.Driver, rec.Sandbox); err != nil {
		return fmt.Errorf("removing session %q: sandbox %s is removed, but forgetting it failed: %w", session, rec.Sandbox, err)
	}
	r.removeHostFiles(rec.Driver, rec.Sandbox)
	os.RemoveAll(filepath.Dir(r.outputPath(session, "x"))) // its full-output files
	removed = true
	return nil
}

// Recreate removes session's sandbox so that the next Acquire, Exec or Shell of the
// session creates a new one from its rule's current spec: the remedy for drift (the
// config changed since the sandbox was made), and the way to start over. The
// recorded sandbox is removed from the driver that holds it, even when the rule now
// names another driver; with no record, a sandbox of ours of the rule's name that the
// rule's driver holds is removed when no record names it (one that is not ours, or
// that other sessions of a shared rule use, is left alone). Files, processes, jobs and
// shell-mode state in it are gone; for a sandbox that several sessions share
// (isolation "shared"), every session on it starts over. It reports whether there was
// a sandbox to remove. Errors: a bad session name or no matching rule (ErrInvalid); a
// driver that cannot be started, or its Remove error (nothing is forgotten then).
func (r *Registry) Recreate(ctx context.Context, session string) (bool, error) {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return false, err
	}
	if err := r.ensure(); err != nil {
		return false, err
	}
	err = r.removeSession(ctx, session, RemoveRecreate)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, backend.ErrNotFound) {
		return false, err
	}
	return r.removeUnrecorded(ctx, session, "recreating", RemoveRecreate)
}

// removeUnrecorded removes the sandbox that session's rule maps it to when no
// record names it and it is ours (its owner label): what a call that was abandoned
// before its record was written may have left (a killed berth process, a create an
// earlier berth let go of half-way), and deletes its host files when no record names
// a sandbox of that name on the driver. doing says what for in errors, cause is the
// SandboxEvent's. It reports whether there was a sandbox to remove. Errors: no rule
// matches the session (ErrInvalid); the driver cannot be started, or its Inspect or
// Remove error.
func (r *Registry) removeUnrecorded(ctx context.Context, session, doing, cause string) (bool, error) {
	rule, _, err := r.cfg.Match(session)
	if err != nil {
		return false, err
	}
	name := rule.Spec(r.owner, session).Name
	lock, err := flock.Lock(ctx, r.lockPath(name))
	if err != nil {
		return false, fmt.Errorf("%s session %q: %w", doing, session, err)
	}
	unrecorded := false
	defer func() { lock.Unlock(unrecorded) }()
	if _, anyDriver := r.recorded(rule.Driver, name); anyDriver {
		// A shared sandbox that other sessions use, one recorded meanwhile, or one
		// of that name on another driver: not this call's to clear.
		return false, nil
	}
	unrecorded = true
	b, err := r.driver(ctx, rule.Driver)
	if err != nil {
		return false, fmt.Errorf("%s session %q: %w", doing, session, err)
	}
	sb, err := b.Inspect(ctx, name)
	switch {
	case errors.Is(err, backend.ErrNotFound):
	case err != nil:
		return false, fmt.Errorf("%s session %q: sandbox %s: %w", doing, session, name, err)
	case sb.Labels[backend.LabelOwner] != r.owner:
		return false, nil // not ours: never touched
	default:
		if err := b.Remove(ctx, name); err != nil {
			return false, fmt.Errorf("%s session %q: sandbox %s: %w", doing, session, name, err)
		}
		r.event(SandboxEvent{Action: EventRemove, Driver: rule.Driver, Sandbox: name, Cause: cause})
		r.agents.forget(sbKey{rule.Driver, name})
		r.removeHostFiles(rule.Driver, name)
		return true, nil
	}
	r.removeHostFiles(rule.Driver, name)
	return false, nil
}

// SessionInfo is one row of Sessions.
type SessionInfo struct {
	// Session, Driver, Sandbox and Scope (the rule's glob) are as recorded.
	Session string
	Driver  string
	Sandbox string
	Scope   string
	// State is the driver's state (created, running, stopped), "removed" when
	// retention removed the sandbox (RemovedReason says why; the next exec creates a
	// new one and says so), "missing" when the driver no longer has it for another
	// reason, or "unknown" when it could not be asked (see Error).
	State string
	// RemovedReason is why retention removed the sandbox (State "removed"), or "".
	RemovedReason string
	// Created is the sandbox's creation time (for a claimed warm pool member, the
	// claim's); LastUsed the session's last use (UTC).
	Created  time.Time
	LastUsed time.Time
	// Pooled is set when the sandbox is a warm pool member the session claimed.
	Pooled bool
	// Drift is set when the sandbox no longer matches the session's rule (spec hash,
	// driver or sandbox name changed); DriftReason says how.
	Drift       bool
	DriftReason string
	// Error is why State is unknown, or "".
	Error string
}

// Session states that Sessions reports beside backend.State values.
const (
	StateMissing = "missing"
	StateRemoved = "removed"
	StateUnknown = "unknown"
)

// Sessions lists every recorded session, sorted by name, joined with its driver's
// Inspect of the sandbox. A driver that cannot be reached makes its rows "unknown"
// (with Error), not the call fail. It creates nothing when there is no store yet.
func (r *Registry) Sessions(ctx context.Context) ([]SessionInfo, error) {
	if !fileExists(r.store.path) {
		return nil, nil
	}
	if err := r.ensure(); err != nil {
		return nil, err
	}
	recs, err := r.store.all()
	if err != nil {
		return nil, err
	}
	out := make([]SessionInfo, 0, len(recs))
	for _, rec := range recs {
		si := SessionInfo{
			Session: rec.Session, Driver: rec.Driver, Sandbox: rec.Sandbox, Scope: rec.Scope,
			Created: rec.Created, LastUsed: rec.LastUsed, State: StateUnknown, Pooled: rec.Pooled,
		}
		have := rec.SpecHash
		if b, err := r.driver(ctx, rec.Driver); err != nil {
			si.Error = err.Error()
		} else if sb, err := b.Inspect(ctx, rec.Sandbox); errors.Is(err, backend.ErrNotFound) {
			si.State = StateMissing
			if !rec.Removed.IsZero() {
				si.State, si.RemovedReason = StateRemoved, rec.RemovedReason
			}
		} else if err != nil {
			si.Error = err.Error()
		} else {
			si.State = string(sb.State)
			if h := sb.Labels[backend.LabelSpecHash]; h != "" {
				have = h
			}
		}
		rule, _, err := r.cfg.Match(rec.Session)
		switch {
		case err != nil:
			si.Drift, si.DriftReason = true, "no scope rule matches the session any more"
		case rule.Driver != rec.Driver:
			si.Drift, si.DriftReason = true, fmt.Sprintf("its rule (%s) now uses driver %s", rule.Pos(), rule.Driver)
		case rec.Pooled:
			if have != rule.PoolHash(r.owner) {
				si.Drift, si.DriftReason = true, fmt.Sprintf("the sandbox's spec differs from its rule (%s)", rule.Pos())
			}
		default:
			spec := rule.Spec(r.owner, rec.Session)
			if spec.Name != rec.Sandbox {
				si.Drift, si.DriftReason = true, fmt.Sprintf("its rule (%s) now maps it to sandbox %s", rule.Pos(), spec.Name)
			} else if have != spec.Labels[backend.LabelSpecHash] {
				si.Drift, si.DriftReason = true, fmt.Sprintf("the sandbox's spec differs from its rule (%s)", rule.Pos())
			}
		}
		out = append(out, si)
	}
	return out, nil
}

// DriverStatus is one row of Drivers.
type DriverStatus struct {
	// Name is the driver's name.
	Name string
	// Info is what the driver reported (zero when Err is set).
	Info backend.Info
	// Err is why the driver could not be started, configured or asked; nil when healthy.
	Err error
}

// Drivers starts (or reuses) every known driver and reports its Info, sorted by
// name. A driver that fails is reported with Err, not as the call's error.
func (r *Registry) Drivers(ctx context.Context) ([]DriverStatus, error) {
	if err := r.ensure(); err != nil {
		return nil, err
	}
	var out []DriverStatus
	for _, name := range r.known {
		st := DriverStatus{Name: name}
		if b, err := r.driver(ctx, name); err != nil {
			st.Err = err
		} else if st.Info, err = backend.InfoOf(ctx, b); err != nil {
			st.Err = fmt.Errorf("driver %s: %w", name, err)
		}
		out = append(out, st)
	}
	return out, nil
}

// Backend returns the driver name, started and configured (once per Registry). The
// Registry owns it: do not Close it. Errors: an unknown driver (ErrInvalid), a
// driver that cannot be started or configured; when the config has a driver block
// for it, those errors start with the block's "FILE:LINE:COL: " (a block that does
// not decode against the driver's schema is a *config.Error with the offending
// attribute's position).
func (r *Registry) Backend(ctx context.Context, driver string) (backend.TerminalBackend, error) {
	if err := r.ensure(); err != nil {
		return nil, err
	}
	return r.driver(ctx, driver)
}

type exiter interface{ Exited() bool }
type killer interface{ Kill() }

func closeDriver(b backend.TerminalBackend) {
	b.Close()
	if k, ok := b.(killer); ok {
		k.Kill()
	}
}

// driver returns the started and configured driver name, starting it on first use
// and again when its plugin has exited.
func (r *Registry) driver(ctx context.Context, name string) (backend.TerminalBackend, error) {
	r.drvMu.Lock()
	if r.closed {
		r.drvMu.Unlock()
		return nil, backend.Errorf(backend.ErrUnavailable, "driver %s: the registry is closed", name)
	}
	e := r.drivers[name]
	if e == nil {
		e = &driverEntry{}
		r.drivers[name] = e
	}
	r.drvMu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if r.supervise != nil {
		if x, ok := e.b.(exiter); ok && x.Exited() {
			r.crashNoticed(name, e) // before supervision's goroutine sees it
		}
		if err := r.awaitRestart(ctx, name, e); err != nil {
			return nil, err
		}
	}
	if e.b != nil {
		if x, ok := e.b.(exiter); !ok || !x.Exited() {
			return e.b, nil
		}
		r.log.Warn("driver plugin exited; starting it again", "driver", name)
		closeDriver(e.b)
		e.b = nil
	}
	b, err := r.startDriver(ctx, name)
	if err != nil {
		return nil, err
	}
	r.drvMu.Lock()
	closed := r.closed
	r.drvMu.Unlock()
	if closed {
		closeDriver(b)
		return nil, backend.Errorf(backend.ErrUnavailable, "driver %s: the registry is closed", name)
	}
	e.b = b
	r.supervised(name, e, b)
	return b, nil
}

func (r *Registry) startDriver(ctx context.Context, name string) (backend.TerminalBackend, error) {
	if !slices.Contains(r.known, name) {
		return nil, backend.Errorf(backend.ErrInvalid, "driver %q is not known; known drivers: %v", name, r.known)
	}
	var b backend.TerminalBackend
	if f := r.inProcess[name]; f != nil {
		b = f()
	} else {
		var err error
		if b, err = r.launch(ctx, name); err != nil {
			return nil, r.atBlock(name, fmt.Errorf("starting driver %s: %w", name, err))
		}
	}
	if err := r.configure(ctx, name, b); err != nil {
		closeDriver(b)
		return nil, err
	}
	r.log.Debug("driver ready", "driver", name)
	return b, nil
}

func (r *Registry) configure(ctx context.Context, name string, b backend.TerminalBackend) error {
	block := r.cfg.Drivers[name]
	c, ok := b.(backend.Configurer)
	var schema []backend.ConfigField
	var err error
	if ok {
		schema, err = c.ConfigSchema(ctx)
		if errors.Is(err, backend.ErrUnsupported) {
			ok = false
		} else if err != nil {
			return r.atBlock(name, fmt.Errorf("driver %s: reading its config schema: %w", name, err))
		}
	}
	if !ok {
		if block != nil {
			if _, err := config.DecodeDriverConfig(name, block.Body, nil); err != nil {
				return err
			}
		}
		return nil
	}
	js, err := r.cfg.DriverConfig(name, schema)
	if err != nil {
		return err
	}
	dir := filepath.Join(r.stateDir, "drivers", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return stateDirError(r.stateDir, err.Error())
	}
	if err := c.Configure(ctx, backend.DriverSetup{StateDir: dir, Owner: r.owner, Config: js}); err != nil {
		return r.atBlock(name, fmt.Errorf("configuring driver %s: %w", name, err))
	}
	return nil
}

// atBlock prefixes err with the position of the config's driver block for driver
// ("FILE:LINE:COL: "), when there is one: the launch and Configure errors of a
// driver that has a block are about that block (its plugin, sha256, start_timeout
// and the driver's own keys).
func (r *Registry) atBlock(driver string, err error) error {
	if b := r.cfg.Drivers[driver]; b != nil && b.Range.Filename != "" {
		return fmt.Errorf("%s: %w", b.Pos(), err)
	}
	return err
}

// Close ends every driver this Registry started (closing in-process ones, killing
// plugins) and closes its agent connections (execs still running on them lose their
// client, and their trees are killed). Sandboxes keep running. Later calls that run
// something in a sandbox (Acquire, Exec, Shell, the Job calls, CopyIn, CopyOut), even
// on a sandbox whose agent answers, and calls that need a driver fail with
// ErrUnavailable ("the registry is closed"); Config, StateDir, Explain and Sessions'
// store read still answer.
func (r *Registry) Close() error {
	r.endLife()
	r.makerMu.Lock()
	if r.maker != nil {
		r.maker.Unlock(true)
		r.maker = nil
	}
	r.makerMu.Unlock()
	r.agents.closeAll()
	r.drvMu.Lock()
	r.closed = true
	entries := r.drivers
	r.drivers = map[string]*driverEntry{}
	r.drvMu.Unlock()
	for _, e := range entries {
		e.mu.Lock()
		if e.b != nil {
			closeDriver(e.b)
			e.b = nil
		}
		e.mu.Unlock()
	}
	return nil
}
