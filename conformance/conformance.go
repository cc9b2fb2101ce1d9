package conformance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry"
)

// T is the test interface the cases are written against. *testing.T satisfies it;
// RunAll supplies its own implementation. FailNow, Fatal, Fatalf, SkipNow, Skip and
// Skipf end the calling goroutine (runtime.Goexit), so, as with *testing.T, call them
// only from the goroutine running the case. Context is cancelled just before the
// Cleanup functions run; Cleanup functions run last registered first.
type T interface {
	Helper()
	Log(args ...any)
	Logf(format string, args ...any)
	Error(args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Skipf(format string, args ...any)
	FailNow()
	SkipNow()
	Failed() bool
	Skipped() bool
	Name() string
	Cleanup(f func())
	Context() context.Context
	TempDir() string
}

var _ T = (*testing.T)(nil)

// Case is one conformance case.
type Case struct {
	// Group is the case's group: lifecycle, idempotence, exec, tty, isolation,
	// resources, terminal, retention or recovery.
	Group string
	// Name is the case's name inside its group (lower case, words joined by "-").
	Name string
	// Requires says in words what the case needs beyond a driver ("Capabilities.TTY",
	// "a registry"); empty when it needs nothing more. For listings only: Needs decides.
	Requires string
	// Needs reports whether a driver with these capabilities can run the case, and if
	// not, why (the skip reason). nil means every driver can.
	Needs func(backend.Capabilities) (ok bool, reason string)
	// Serial cases never run beside another case: they change process-wide state (the
	// host environment) or measure time. Run runs them first, one at a time, and then
	// the others, of every group, in parallel; RunAll runs every case one after another.
	Serial bool
	// Run runs the case. It fails through t and skips through t with a reason.
	Run func(t T, h *Harness)

	// registry marks cases that run through a registry (Options.OpenRegistry): they
	// reach agents as a registry does, so they have no @dial copy.
	registry bool
}

// FullName returns "group/name", the name that Filter matches and that Run gives the
// case's subtest.
func (c Case) FullName() string { return c.Group + "/" + c.Name }

// applies reports whether the case can run with caps, and the skip reason if not.
func (c Case) applies(caps backend.Capabilities) (bool, string) {
	if c.Needs == nil {
		return true, ""
	}
	return c.Needs(caps)
}

// applies is c.applies with the capabilities under test (h.Info's); a case skipped
// only because Options.Runtime lacks what the driver's default runtime has says so,
// naming the runtime and its kernel.
func (h *Harness) applies(c Case) (bool, string) {
	ok, reason := c.applies(h.Info.Capabilities)
	if ok || h.Options.Runtime == "" {
		return ok, reason
	}
	if dflt, _ := c.applies(h.driverCaps); dflt {
		reason = fmt.Sprintf("runtime %s (kernel %s) lacks what the driver's default runtime has: %s; see docs/gvisor.md", h.Options.Runtime, h.kernel, reason)
	}
	return false, reason
}

// Options configures a run of the suite. Only AgentBinary (or PrepareAgent) is
// required; the rest have defaults.
type Options struct {
	// AgentBinary is the static berth-cli (berth's full binary, cmd/berth-cli; not the
	// thin front cmd/berth) or berth-agent that the default PrepareAgent installs as
	// the sandboxes' agent (built with CGO_ENABLED=0). Required when PrepareAgent is nil.
	AgentBinary string
	// StateDir is where agent copies and per-sandbox agent directories go
	// (StateDir/agent/..., StateDir/sandboxes/NAME/...). Default: t.TempDir() of the
	// test passed to Run; a temporary directory removed at the end for RunAll.
	StateDir string
	// Owner is the owner id put in every sandbox's LabelOwner. When the driver was
	// configured with a DriverSetup.Owner, pass the same value. Default: "conformance-"
	// and 16 random hex digits, new for each run.
	Owner string
	// Image is the image reference for drivers with FSIsolationImage. It must hold a
	// POSIX sh (with kill, printf, pwd and test) and cat, chmod, env, grep, head, seq,
	// sleep (fractions allowed), stty, dd and touch, as busybox has them (grep must
	// know -z). Ignored by drivers without their own filesystem.
	Image string
	// Runtime is the OCI runtime of every sandbox the suite makes
	// (backend.SandboxSpec.Runtime, and runtime in the registry cases' rules), one
	// the driver lists in Capabilities.Runtimes; the cases then branch on that
	// runtime's capabilities (Capabilities.ForRuntime). Default "": the engine's
	// default runtime.
	Runtime string
	// Capabilities, when set, is the driver's documented set of Linux capabilities
	// that a sandbox keeps (names with or without CAP_); isolation/capabilities-dropped
	// then checks that the bounding set is exactly that. When nil, the case checks only
	// that no capability reaching the host is kept.
	Capabilities []string
	// PrepareAgent makes the agent files of one sandbox under stateDir. Default (nil):
	// DefaultPrepareAgent(AgentBinary), i.e. agent.Install(stateDir, AgentBinary) and
	// agent.PrepareSandbox(stateDir/sandboxes/NAME, ...).
	PrepareAgent func(stateDir, sandboxName string) (backend.AgentFiles, error)
	// OpenRegistry opens a registry, over the driver under test, with the given config
	// text (HCL with scope blocks whose driver is the driver's Info.Name). The registry
	// cases call it; it must give the registry its own state dir, except when the
	// text sets state_dir (pool/drift-drains reopens a state dir with a changed
	// config): then that one. It should close the registry in t.Cleanup. When nil
	// those cases skip.
	OpenRegistry func(t T, configHCL string) (*registry.Registry, error)
	// RestartRuntime, when set, stops and starts the driver's runtime (dockerd,
	// containerd) and returns once it answers again. recovery/runtime-restart runs
	// only with it (serially), and skips with that reason otherwise: give it only a
	// runtime of the test's own, never a shared daemon.
	RestartRuntime func(ctx context.Context) error
	// DriverConfig is HCL put at the top of every config file that the registry
	// cases write, for the driver's own block (`driver "NAME" { ... }`): the registry
	// configures the driver from it, and so do the berth processes that the recovery
	// cases start with that config file. Empty: no block (the driver's defaults).
	DriverConfig string
	// BerthEnv is added to the environment of the berth processes that the recovery
	// cases start with AgentBinary (for example DOCKER_HOST=unix:///...), after the
	// test's own environment without BERTH_* and the registry's BERTH_STATE_DIR and
	// BERTH_CONFIG.
	BerthEnv []string
	// RemoveUnowned, when set, removes the sandbox name with the runtime's own tools
	// although it carries no owner label. retention/reconcile-leaves-others plants
	// such a sandbox (an empty owner id) to check that reconcile leaves it alone, and
	// removes it with the driver when the runtime kept the empty label (docker); a
	// runtime that drops empty labels (containerd) leaves a sandbox that the driver,
	// rightly, refuses to remove, and the case then calls this. Without it such a
	// runtime's run reports the sandbox it could not remove as a cleanup error.
	RemoveUnowned func(ctx context.Context, name string) error
	// CaseTimeout bounds one case under RunAll (its context is cancelled then, and the
	// case fails). Default 5 minutes. Run leaves timing to go test -timeout.
	CaseTimeout time.Duration
	// OnCase, when set, is called by RunAll after each case with its report (for
	// progress output).
	OnCase func(CaseReport)
	// Groups, when non-empty, limits Run to the cases of these groups (the names of
	// Cases: lifecycle, idempotence, exec, tty, isolation, resources, terminal,
	// retention, pool, recovery, exec-dial, tty-dial, terminal-dial); Run logs the groups
	// it leaves out and fails on a name that is no group. A driver's own CI uses it to
	// run each path once (for example the plugin suite only for the groups whose
	// calls cross the plugin protocol). RunAll ignores it: pass it a Filter.
	Groups []string
}

// DefaultCaseTimeout is RunAll's per-case timeout when Options.CaseTimeout is zero.
const DefaultCaseTimeout = 5 * time.Minute

// forRuntime returns info with the capabilities of the sandboxes of runtime
// (Options.Runtime) in place of the driver's, so that every case branches on what
// those sandboxes have. Error: a runtime the driver does not list.
func forRuntime(info backend.Info, runtime string) (backend.Info, error) {
	if runtime == "" {
		return info, nil
	}
	caps, ok := info.Capabilities.ForRuntime(runtime)
	if !ok {
		return info, fmt.Errorf("driver %s does not offer runtime %q (its runtimes: %v); register it with the engine (docs/gvisor.md) or drop the runtime", info.Name, runtime, info.Capabilities.RuntimeNames())
	}
	info.Capabilities = caps
	return info, nil
}

// Harness is what a case gets: the driver under test, its Info, the owner id and the
// options, with helpers that create sandboxes and remove them when the case ends.
// It is safe for concurrent use by cases running in parallel.
type Harness struct {
	// Backend is the driver under test.
	Backend backend.TerminalBackend
	// Info is Backend.Info, read once at the start of the run, with the capabilities
	// of Options.Runtime's sandboxes (Capabilities.ForRuntime) in place of the
	// driver's when a runtime is set.
	Info backend.Info
	// Owner is the LabelOwner value of every sandbox the suite creates.
	Owner string
	// RunID is a random hex id of this run, the value of every sandbox's RunLabel.
	RunID string
	// Options are the run's options with defaults filled in.
	Options Options

	// driverCaps are the driver's own capabilities (its default runtime's), kernel
	// the kernel of Options.Runtime ("" without one).
	driverCaps backend.Capabilities
	kernel     string

	// reach is how the cases' execs reach sandboxes; files the agent files that
	// Create prepared, by sandbox name (shared by the copies withReach makes).
	reach   Reach
	filesMu *sync.Mutex
	files   map[string]backend.AgentFiles
}

// RunLabel is the user label every sandbox of a suite run carries, with Harness.RunID
// as its value.
const RunLabel = "conformance.run"

// newHarness fills in the defaults of opts and returns the harness.
func newHarness(b backend.TerminalBackend, info backend.Info, opts Options, stateDir string) *Harness {
	if opts.StateDir == "" {
		opts.StateDir = stateDir
	}
	if opts.Owner == "" {
		opts.Owner = NewOwner()
	}
	if opts.PrepareAgent == nil {
		opts.PrepareAgent = DefaultPrepareAgent(opts.AgentBinary)
	}
	if opts.CaseTimeout <= 0 {
		opts.CaseTimeout = DefaultCaseTimeout
	}
	h := &Harness{Backend: b, Info: info, Owner: opts.Owner, RunID: randHex(8), Options: opts,
		filesMu: &sync.Mutex{}, files: map[string]backend.AgentFiles{}}
	h.driverCaps, _ = info.Capabilities.ForRuntime("")
	for _, r := range info.Capabilities.Runtimes {
		if r.Name == opts.Runtime {
			h.kernel = r.Kernel
		}
	}
	if caps, err := forRuntime(info, opts.Runtime); err == nil {
		h.Info = caps
	}
	return h
}

// Spec returns the spec of a sandbox called name with every berth label set
// (LabelOwner = h.Owner, LabelSession "conformance/" + t.Name(), LabelScope
// "conformance", LabelCreated now, LabelSpecHash a hex sha256), RunLabel, and
// Options.Image.
func (h *Harness) Spec(t T, name string) backend.SandboxSpec {
	sum := sha256.Sum256([]byte(name + "\x00" + h.RunID))
	return backend.SandboxSpec{
		Name:    name,
		Image:   h.Options.Image,
		Runtime: h.Options.Runtime,
		Labels: map[string]string{
			backend.LabelOwner:    h.Owner,
			backend.LabelSession:  "conformance/" + t.Name(),
			backend.LabelScope:    "conformance",
			backend.LabelCreated:  time.Now().UTC().Format(time.RFC3339),
			backend.LabelSpecHash: hex.EncodeToString(sum[:]),
			RunLabel:              h.RunID,
		},
	}
}

// ruleLines returns the image and runtime attributes of the registry cases' scope
// rules (Options.Image, Options.Runtime), each on its own line indented by two
// spaces, "" for those unset.
func (h *Harness) ruleLines() string {
	var b strings.Builder
	if h.Options.Image != "" {
		fmt.Fprintf(&b, "  image = %s\n", strconv.Quote(h.Options.Image))
	}
	if h.Options.Runtime != "" {
		fmt.Fprintf(&b, "  runtime = %s\n", strconv.Quote(h.Options.Runtime))
	}
	return b.String()
}

// SandboxName returns a new unique sandbox name: "bconf-" and 12 random hex digits.
func SandboxName() string { return "bconf-" + randHex(6) }

// AgentFiles prepares the agent files of sandbox name under stateDir with
// Options.PrepareAgent (DefaultPrepareAgent when the caller gave none).
func (h *Harness) AgentFiles(stateDir, name string) (backend.AgentFiles, error) {
	f, err := h.Options.PrepareAgent(stateDir, name)
	if err == nil {
		h.recordFiles(name, f)
	}
	return f, err
}

// Create prepares the agent files of spec.Name under Options.StateDir, calls
// Backend.Create, and registers a cleanup that removes the sandbox (whether or not
// Create succeeded: a failed Create must leave nothing, and removing nothing succeeds).
// A failure to prepare the agent files is fatal.
func (h *Harness) Create(t T, spec backend.SandboxSpec) (backend.Sandbox, error) {
	t.Helper()
	return h.CreateIn(t, h.Options.StateDir, spec)
}

// CreateIn is Create with the agent files prepared under stateDir instead of
// Options.StateDir.
func (h *Harness) CreateIn(t T, stateDir string, spec backend.SandboxSpec) (backend.Sandbox, error) {
	t.Helper()
	files, err := h.AgentFiles(stateDir, spec.Name)
	if err != nil {
		t.Fatalf("preparing agent files for sandbox %s under %s: %v", spec.Name, stateDir, err)
	}
	h.removeOnCleanup(t, spec.Name)
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	return h.Backend.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files})
}

// removeOnCleanup registers a cleanup that removes sandbox name and reports an error
// when that fails.
func (h *Harness) removeOnCleanup(t T, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
		defer cancel()
		if err := h.Backend.Remove(ctx, name); err != nil {
			t.Errorf("cleanup: Remove(%s): %v", name, err)
		}
	})
}

// NewSandbox creates a uniquely named sandbox with the full berth labels (Spec), checks
// that it runs, and removes it when the case ends. Any failure is fatal. It returns the
// sandbox's name.
func (h *Harness) NewSandbox(t T) string {
	t.Helper()
	return h.NewSandboxWith(t, nil)
}

// NewSandboxWith is NewSandbox with a function that may change the spec before Create.
func (h *Harness) NewSandboxWith(t T, edit func(*backend.SandboxSpec)) string {
	t.Helper()
	spec := h.Spec(t, SandboxName())
	if edit != nil {
		edit(&spec)
	}
	sb, err := h.Create(t, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.Name, err)
	}
	if sb.State != backend.StateRunning {
		t.Fatalf("Create(%s) returned state %q, want %q", spec.Name, sb.State, backend.StateRunning)
	}
	return spec.Name
}

// Timeouts of single driver calls made by the harness and the cases.
const (
	createTimeout = 2 * time.Minute
	callTimeout   = time.Minute
)

// Filter selects cases by their FullName ("group/name"): a case runs when Run is nil
// or matches, and Skip is nil or does not match. Cases that the filter leaves out are
// not in the report.
type Filter struct {
	// Run, when set, selects only the cases whose FullName it matches (--run).
	Run *regexp.Regexp
	// Skip, when set, leaves out the cases whose FullName it matches (--skip).
	Skip *regexp.Regexp
}

// Match reports whether the filter selects c.
func (f Filter) Match(c Case) bool {
	name := c.FullName()
	if f.Run != nil && !f.Run.MatchString(name) {
		return false
	}
	if f.Skip != nil && f.Skip.MatchString(name) {
		return false
	}
	return true
}

// Cases returns every case of the suite, grouped and in a fixed order: lifecycle,
// idempotence, exec, tty, isolation, resources, terminal, retention, pool, recovery, then
// the copies of the exec, tty and terminal cases that run through the driver's
// AgentDialer (groups exec-dial, tty-dial, terminal-dial; they skip for drivers that
// offer one way only). The slice is new on each call.
func Cases() []Case {
	var all []Case
	all = append(all, lifecycleCases()...)
	all = append(all, idempotenceCases()...)
	all = append(all, execCases()...)
	all = append(all, ttyCases()...)
	all = append(all, isolationCases()...)
	all = append(all, hardeningIsolationCases()...)
	all = append(all, resourcesCases()...)
	all = append(all, terminalCases()...)
	all = append(all, retentionCases()...)
	all = append(all, poolCases()...)
	all = append(all, recoveryCases()...)
	all = append(all, abandonCases()...)
	all = append(all, dialVariants(all)...)
	return all
}

// List returns the cases that f selects, in Cases order.
func List(f Filter) []Case {
	var out []Case
	for _, c := range Cases() {
		if f.Match(c) {
			out = append(out, c)
		}
	}
	return out
}

// Run runs the suite against b under go test: one subtest per group, and inside it one
// per case, so every case's test name ends in "group/name" (select with
// -run 'TestX/exec/'). Serial cases run first, one after another and alone (within
// this run); then every other case, of every group, runs in parallel (t.Parallel:
// -test.parallel bounds how many at once). Run returns when all are done, so the
// caller may close b with defer. A case whose needed capability b lacks is skipped with the reason.
//
// The caller configures b beforehand (Configurer) with Options.Owner if it has one.
func Run(t *testing.T, b backend.TerminalBackend, opts Options) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	info, err := backend.InfoOf(ctx, b)
	cancel()
	if err == nil {
		_, err = forRuntime(info, opts.Runtime)
	}
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	h := newHarness(b, info, opts, t.TempDir())
	t.Logf("conformance: driver %s %s, runtime %q, owner %s, run %s, state dir %s", info.Name, info.Version, opts.Runtime, h.Owner, h.RunID, h.Options.StateDir)
	cases, err := selectGroups(Cases(), opts.Groups)
	if err != nil {
		t.Fatal(err)
	}
	if len(opts.Groups) > 0 {
		t.Logf("conformance: running groups %s only (Options.Groups)", strings.Join(opts.Groups, ", "))
	}
	var groups [][]Case
	for i := 0; i < len(cases); {
		j := i
		for j < len(cases) && cases[j].Group == cases[i].Group {
			j++
		}
		groups = append(groups, cases[i:j])
		i = j
	}
	// The groups run side by side (t.Run from a goroutine each, as testing allows), so
	// that no group waits for the slowest case of the one before: on a runtime that
	// takes seconds per sandbox (Kubernetes) that wait was a third of the suite. The
	// serial cases take turns first, group by group (turn[k] is closed when group k-1's
	// are done); every other case waits for the last turn, after t.Parallel.
	turn := make([]chan struct{}, len(groups)+1)
	for k := range turn {
		turn[k] = make(chan struct{})
	}
	close(turn[0])
	allSerial := turn[len(groups)]
	var wg sync.WaitGroup
	for k, groupCases := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ran := false
			defer func() {
				if !ran {
					// -run left the group out: its function never ran, so pass
					// its turn on here (the later groups wait for it).
					<-turn[k]
					close(turn[k+1])
				}
			}()
			t.Run(groupCases[0].Group, func(t *testing.T) {
				ran = true
				func() {
					defer close(turn[k+1])
					<-turn[k]
					for _, c := range groupCases {
						if c.Serial {
							t.Run(c.Name, func(t *testing.T) {
								if ok, reason := h.applies(c); !ok {
									t.Skip(reason)
								}
								c.Run(t, h)
							})
						}
					}
				}()
				for _, c := range groupCases {
					if c.Serial {
						continue
					}
					t.Run(c.Name, func(t *testing.T) {
						if ok, reason := h.applies(c); !ok {
							t.Skip(reason)
						}
						t.Parallel()
						<-allSerial
						c.Run(t, h)
					})
				}
			})
		}()
	}
	wg.Wait()
	if left := h.leftovers(t.Context()); len(left) > 0 {
		t.Errorf("sandboxes of this run left behind after every case's cleanup (now removed): %v", left)
	}
}

// NewOwner returns a new owner id for Options.Owner and the driver's
// DriverSetup.Owner: "conformance-" and 16 random hex digits, what Run uses when
// Options.Owner is empty. Give each run its own: runs that share an owner (two test
// processes on one engine or cluster) see, reconcile and prune each other's sandboxes.
func NewOwner() string { return "conformance-" + randHex(8) }

// selectGroups returns the cases of the named groups (all of them for none), in
// their order. Error: a name that is no group of cases.
func selectGroups(cases []Case, groups []string) ([]Case, error) {
	if len(groups) == 0 {
		return cases, nil
	}
	var known []string
	for _, c := range cases {
		if !slices.Contains(known, c.Group) {
			known = append(known, c.Group)
		}
	}
	for _, g := range groups {
		if !slices.Contains(known, g) {
			return nil, fmt.Errorf("conformance: Options.Groups names %q, which is no group of the suite (groups: %s)", g, strings.Join(known, ", "))
		}
	}
	var out []Case
	for _, c := range cases {
		if slices.Contains(groups, c.Group) {
			out = append(out, c)
		}
	}
	return out, nil
}

// leftovers lists the sandboxes of this run that still exist, removes them, and
// returns their names (or the List error as the only element).
func (h *Harness) leftovers(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, createTimeout)
	defer cancel()
	sbs, err := h.Backend.List(ctx, map[string]string{RunLabel: h.RunID})
	if err != nil {
		return []string{"List: " + err.Error()}
	}
	var names []string
	for _, sb := range sbs {
		names = append(names, sb.Name)
		_ = h.Backend.Remove(ctx, sb.Name)
	}
	return names
}

// makeStateDir creates a temporary state dir for RunAll.
func makeStateDir() (string, func(), error) {
	dir, err := os.MkdirTemp("", "berth-conformance-")
	if err != nil {
		return "", func() {}, err
	}
	dir, err = filepath.EvalSymlinks(dir)
	if err != nil {
		return "", func() {}, err
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}
