package conformance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/registry"
)

func retentionCases() []Case {
	g := "retention"
	reg := "a registry opened by RegistryOpener (Options.OpenRegistry)"
	return []Case{
		{Group: g, Name: "on-close-keep", Requires: reg, Run: caseOnCloseKeep},
		{Group: g, Name: "on-close-stop", Requires: reg + ", Capabilities.StopStart", Needs: needsStopStart, Run: caseOnCloseStop},
		{Group: g, Name: "on-close-remove", Requires: reg, Run: caseOnCloseRemove},
		{Group: g, Name: "idle-remove-recreates", Requires: reg, Run: caseIdleRemove},
		{Group: g, Name: "idle-stop-keeps-files", Requires: reg + ", Capabilities.StopStart", Needs: needsStopStart, Run: caseIdleStop},
		{Group: g, Name: "running-exec-not-idle", Requires: reg, Run: caseRunningNotIdle},
		{Group: g, Name: "running-job-not-idle", Requires: reg + ", Capabilities.Jobs", Needs: needAgent, Run: caseJobNotIdle},
		{Group: g, Name: "max-age-removes-in-use", Requires: reg, Run: caseMaxAgeInUse},
		{Group: g, Name: "reconcile-leaves-others", Requires: reg, Run: caseReconcileOthers},
		{Group: g, Name: "reconcile-adopts-lost", Requires: reg, Run: caseReconcileAdopts},
		{Group: g, Name: "reconcile-grace", Requires: reg, Run: caseReconcileGrace},
	}
}

func needsStopStart(c backend.Capabilities) (bool, string) {
	if !c.StopStart {
		return false, "the driver does not keep a stopped sandbox's files (Capabilities.StopStart is false)"
	}
	return true, ""
}

// Clock is the clock RegistryOpener gives a registry (registry.WithClock): it
// starts at the real time and moves only when Advance is called, so retention cases
// never wait.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock set to the current time.
func NewClock() *Clock { return &Clock{t: time.Now().UTC()} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// clocks maps each *registry.Registry that RegistryOpener opened to its Clock.
var clocks sync.Map

// ClockOf returns the Clock of a registry opened by RegistryOpener, or nil when it
// has none (it was opened by another opener).
func ClockOf(r *registry.Registry) *Clock {
	if c, ok := clocks.Load(r); ok {
		return c.(*Clock)
	}
	return nil
}

// retentionConfig is the config of the retention cases: one rule per policy, for
// sessions "conf-POLICY-ID:*", on the driver under test.
func (h *Harness) retentionConfig(id string) string {
	image := h.ruleLines()
	var b strings.Builder
	if h.Options.DriverConfig != "" {
		b.WriteString(h.Options.DriverConfig + "\n\n")
	}
	rule := func(policy, retention string) {
		fmt.Fprintf(&b, "scope \"conf-%s-%s:*\" {\n  driver = %s\n%s  retention {\n%s  }\n}\n\n", policy, id, strconv.Quote(h.Info.Name), image, retention)
	}
	rule("keep", "    on_close = \"keep\"\n")
	rule("stop", "    on_close = \"stop\"\n")
	rule("rm", "    on_close = \"remove\"\n")
	rule("idle", "    idle_ttl = \"1h\"\n    idle_action = \"remove\"\n")
	rule("idlestop", "    idle_ttl = \"1h\"\n    idle_action = \"stop\"\n")
	rule("old", "    max_age = \"1h\"\n")
	return b.String()
}

// retentionRegistry opens the registry of a retention case and returns it with its
// clock, or skips.
func (h *Harness) retentionRegistry(t T, id string) (*registry.Registry, *Clock) {
	t.Helper()
	if h.Options.OpenRegistry == nil {
		t.Skip(needsRegistry)
	}
	cfg := h.retentionConfig(id)
	r, err := h.Options.OpenRegistry(t, cfg)
	if err != nil {
		t.Fatalf("opening a registry with config\n%s: %v", cfg, err)
	}
	clk := ClockOf(r)
	if clk == nil {
		t.Skip("needs a registry with an injectable clock: open it with conformance.RegistryOpener")
	}
	return r, clk
}

// regExec runs `sh -c script sh args...` in session through the registry (so it
// counts as use, applies expiry and may recreate) and returns its stdout and lease;
// it must exit 0.
func regExec(t T, r *registry.Registry, session, script string, args ...string) (string, *registry.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	var stdout, stderr testwait.Buffer
	p, lease, err := r.Exec(ctx, session, backend.ExecRequest{Argv: append([]string{"sh", "-c", script, "sh"}, args...), Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		t.Fatalf("exec %q in session %s: %v", script, session, err)
	}
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q in session %s: %+v %v, stdout %q, stderr %q", script, session, res, err, stdout.String(), stderr.String())
	}
	return stdout.String(), lease
}

// removeSessionOnCleanup removes session (and its sandbox) when the case ends.
func removeSessionOnCleanup(t T, r *registry.Registry, session string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
		defer cancel()
		if err := r.RemoveSession(ctx, session); err != nil && !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("cleanup: RemoveSession(%s): %v", session, err)
		}
	})
}

// startSession makes session's sandbox with a file "kept" in its working directory,
// removed when the case ends, and returns the lease.
func startSession(t T, r *registry.Registry, session string) *registry.Lease {
	t.Helper()
	removeSessionOnCleanup(t, r, session)
	_, lease := regExec(t, r, session, "echo kept > berth-conf-retention")
	return lease
}

// sandboxState returns the driver's state of sandbox, or "missing".
func sandboxState(t T, b backend.TerminalBackend, sandbox string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	sb, err := b.Inspect(ctx, sandbox)
	if errors.Is(err, backend.ErrNotFound) {
		return "missing"
	}
	if err != nil {
		t.Fatalf("Inspect(%s): %v", sandbox, err)
	}
	return string(sb.State)
}

func closeSession(t T, r *registry.Registry, session string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	if err := r.CloseSession(ctx, session); err != nil {
		t.Fatalf("CloseSession(%s): %v", session, err)
	}
}

// readBack checks that the file startSession wrote is still in session's sandbox,
// read through the registry, in the same sandbox and not recreated.
func readBack(t T, r *registry.Registry, session string, was *registry.Lease) {
	t.Helper()
	out, lease := regExec(t, r, session, "cat berth-conf-retention 2>&1 || true")
	if out != "kept\n" || lease.Recreated || lease.Created || lease.Sandbox != was.Sandbox {
		t.Errorf("session %s: reading the file back gave %q (recreated %v, created %v, sandbox %s, was %s); want it intact in the same sandbox",
			session, out, lease.Recreated, lease.Created, lease.Sandbox, was.Sandbox)
	}
}

// prune runs r.Prune and returns its action about sandbox (Action "" when none).
func prune(t T, r *registry.Registry, sandbox string) registry.PruneAction {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	rep, err := r.Prune(ctx, registry.PruneOptions{})
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	for _, d := range rep.Drivers {
		if d.Error != "" {
			t.Errorf("Prune could not reconcile driver %s: %s", d.Name, d.Error)
		}
	}
	for _, a := range rep.Actions {
		if a.Sandbox == sandbox {
			if a.Error != "" {
				t.Errorf("Prune's %s of %s failed: %s", a.Action, sandbox, a.Error)
			}
			return a
		}
	}
	return registry.PruneAction{}
}

// on_close = "keep" leaves the sandbox running with its files.
func caseOnCloseKeep(t T, h *Harness) {
	id := randHex(4)
	r, _ := h.retentionRegistry(t, id)
	s := "conf-keep-" + id + ":1"
	lease := startSession(t, r, s)
	closeSession(t, r, s)
	if st := sandboxState(t, driverOf(t, r, lease), lease.Sandbox); st != string(backend.StateRunning) {
		t.Errorf("after close with on_close keep the sandbox is %s, want running", st)
	}
	readBack(t, r, s, lease)
}

// on_close = "stop" stops the sandbox; the next exec starts it with its files.
func caseOnCloseStop(t T, h *Harness) {
	id := randHex(4)
	r, _ := h.retentionRegistry(t, id)
	s := "conf-stop-" + id + ":1"
	lease := startSession(t, r, s)
	closeSession(t, r, s)
	if st := sandboxState(t, driverOf(t, r, lease), lease.Sandbox); st != string(backend.StateStopped) {
		t.Errorf("after close with on_close stop the sandbox is %s, want stopped", st)
	}
	readBack(t, r, s, lease)
	if st := sandboxState(t, driverOf(t, r, lease), lease.Sandbox); st != string(backend.StateRunning) {
		t.Errorf("after the next exec the sandbox is %s, want running", st)
	}
}

// on_close = "remove" removes the sandbox and forgets the session; the next exec
// gets a new, empty sandbox.
func caseOnCloseRemove(t T, h *Harness) {
	id := randHex(4)
	r, _ := h.retentionRegistry(t, id)
	s := "conf-rm-" + id + ":1"
	lease := startSession(t, r, s)
	closeSession(t, r, s)
	if st := sandboxState(t, driverOf(t, r, lease), lease.Sandbox); st != "missing" {
		t.Errorf("after close with on_close remove the sandbox is %s, want it gone", st)
	}
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	infos, err := r.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Session == s {
			t.Errorf("the removed session is still recorded: %+v", in)
		}
	}
	out, again := regExec(t, r, s, "cat berth-conf-retention 2>/dev/null || echo none")
	if out != "none\n" || !again.Created {
		t.Errorf("exec after remove: %q, created %v; want a new, empty sandbox", out, again.Created)
	}
}

// idle_ttl with idle_action = "remove": with the clock past the TTL, prune removes
// the sandbox, and the next exec gets a new one and reports Recreated.
func caseIdleRemove(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	s := "conf-idle-" + id + ":1"
	lease := startSession(t, r, s)
	clk.Advance(59 * time.Minute)
	if a := prune(t, r, lease.Sandbox); a.Action != registry.PruneKeep {
		t.Errorf("prune 59 minutes after the last use (idle_ttl 1h): %+v, want keep", a)
	}
	clk.Advance(2 * time.Minute)
	a := prune(t, r, lease.Sandbox)
	if a.Action != registry.PruneRemove || a.Cause != registry.CauseIdle || !a.Done || !strings.Contains(a.Reason, "idle since") {
		t.Fatalf("prune 61 minutes after the last use: %+v, want remove (idle) done, with the idle time in the reason", a)
	}
	if st := sandboxState(t, driverOf(t, r, lease), lease.Sandbox); st != "missing" {
		t.Errorf("prune reported remove but the sandbox is %s", st)
	}
	out, again := regExec(t, r, s, "cat berth-conf-retention 2>/dev/null || echo none")
	if !again.Recreated || !strings.Contains(again.RecreatedReason, "idle") || out != "none\n" {
		t.Errorf("next exec: recreated %v (%q), output %q; want a new, empty sandbox reported as recreated", again.Recreated, again.RecreatedReason, out)
	}
}

// idle_ttl with idle_action = "stop": prune stops the sandbox; the next exec starts
// it again with its files, not recreated.
func caseIdleStop(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	s := "conf-idlestop-" + id + ":1"
	lease := startSession(t, r, s)
	clk.Advance(61 * time.Minute)
	if a := prune(t, r, lease.Sandbox); a.Action != registry.PruneStop || a.Cause != registry.CauseIdle || !a.Done {
		t.Fatalf("prune 61 minutes after the last use: %+v, want stop (idle) done", a)
	}
	if st := sandboxState(t, driverOf(t, r, lease), lease.Sandbox); st != string(backend.StateStopped) {
		t.Errorf("after an idle stop the sandbox is %s", st)
	}
	readBack(t, r, s, lease)
}

// startLong starts `sleep` in session through the registry; the returned function
// cancels it and waits for it.
func startLong(t T, r *registry.Registry, session string) (wait func() (backend.ExecResult, error), stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	p, _, err := r.Exec(ctx, session, backend.ExecRequest{Argv: []string{"sleep", "600"}})
	if err != nil {
		cancel()
		t.Fatalf("starting a long exec in session %s: %v", session, err)
	}
	var once sync.Once
	var res backend.ExecResult
	var werr error
	done := make(chan struct{})
	go func() {
		res, werr = p.Wait()
		close(done)
	}()
	wait = func() (backend.ExecResult, error) {
		<-done
		return res, werr
	}
	t.Cleanup(func() { once.Do(cancel); wait() })
	return wait, func() { once.Do(cancel) }
}

// An exec in flight (a job) keeps a sandbox from being idle however long ago it
// started; once it ends, the idle time counts from its end.
func caseRunningNotIdle(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	s := "conf-idle-" + id + ":1"
	lease := startSession(t, r, s)
	wait, cancel := startLong(t, r, s)
	clk.Advance(3 * time.Hour)
	if a := prune(t, r, lease.Sandbox); a.Action != registry.PruneKeep || a.Cause != registry.CauseInUse {
		t.Errorf("prune 3 hours into a running exec (idle_ttl 1h): %+v, want keep (in use)", a)
	}
	if st := sandboxState(t, driverOf(t, r, lease), lease.Sandbox); st != string(backend.StateRunning) {
		t.Errorf("the sandbox of a running exec is %s", st)
	}
	cancel()
	wait()
	clk.Advance(30 * time.Minute)
	if a := prune(t, r, lease.Sandbox); a.Action != registry.PruneKeep {
		t.Errorf("prune 30 minutes after the exec ended: %+v, want keep", a)
	}
	readBack(t, r, s, lease)
}

// A sandbox with a background job running is not idle: prune keeps it (in use)
// however long ago the last exec was; once the job has ended, idle_ttl applies again.
func caseJobNotIdle(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	s := "conf-idle-" + id + ":1"
	lease := startSession(t, r, s)
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	j, err := r.JobStart(ctx, s, registry.JobStartRequest{Argv: []string{"sleep", "3600"}})
	if err != nil {
		t.Fatalf("JobStart: %v", err)
	}
	clk.Advance(3 * time.Hour)
	if a := prune(t, r, lease.Sandbox); a.Action != registry.PruneKeep || a.Cause != registry.CauseInUse {
		t.Errorf("prune 3 hours after the last exec with a job running (idle_ttl 1h): %+v, want keep (in use)", a)
	}
	if err := r.JobKill(ctx, s, j.ID); err != nil {
		t.Fatalf("JobKill: %v", err)
	}
	clk.Advance(3 * time.Hour)
	if a := prune(t, r, lease.Sandbox); a.Cause != registry.CauseIdle || a.Action == registry.PruneKeep {
		t.Errorf("prune 3 hours after the job ended: %+v, want the idle action", a)
	}
}

// max_age removes a sandbox that is in use: prune removes it with an exec in
// flight, and that exec ends.
func caseMaxAgeInUse(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	s := "conf-old-" + id + ":1"
	lease := startSession(t, r, s)
	wait, _ := startLong(t, r, s)
	clk.Advance(61 * time.Minute)
	a := prune(t, r, lease.Sandbox)
	if a.Action != registry.PruneRemove || a.Cause != registry.CauseAge || !a.Done {
		t.Fatalf("prune 61 minutes after create (max_age 1h) with an exec running: %+v, want remove (age) done", a)
	}
	if st := sandboxState(t, driverOf(t, r, lease), lease.Sandbox); st != "missing" {
		t.Errorf("after max_age the sandbox is %s", st)
	}
	ended := make(chan struct{})
	go func() { wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(testwait.Limit):
		t.Errorf("the exec in the removed sandbox did not end within %v", testwait.Limit)
	}
}

// plant creates, on the registry's own driver instance, a sandbox the way a crash
// between create and record leaves one: spec edited by edit, agent files in the
// registry's state dir. It is removed when the case ends.
func (h *Harness) plant(t T, r *registry.Registry, spec backend.SandboxSpec, created time.Time, edit func(*backend.SandboxSpec)) backend.TerminalBackend {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	if spec.Labels == nil {
		spec.Labels = map[string]string{}
	}
	spec.Labels[backend.LabelCreated] = created.UTC().Format(time.RFC3339)
	if edit != nil {
		edit(&spec)
	}
	b, err := r.Backend(ctx, h.Info.Name)
	if err != nil {
		t.Fatalf("the registry's driver %s: %v", h.Info.Name, err)
	}
	files, err := r.PrepareAgent(h.Info.Name, spec.Name)
	if err != nil {
		t.Fatalf("preparing agent files for %s: %v", spec.Name, err)
	}
	h.recordFiles(spec.Name, files)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
		defer cancel()
		err := b.Remove(ctx, spec.Name)
		if err != nil && errors.Is(err, backend.ErrConflict) && spec.Labels[backend.LabelOwner] == "" && h.Options.RemoveUnowned != nil {
			err = h.Options.RemoveUnowned(ctx, spec.Name) // the runtime dropped the empty owner label
		}
		if err != nil {
			t.Errorf("cleanup: Remove(%s): %v", spec.Name, err)
		}
	})
	if _, err := b.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files}); err != nil {
		t.Fatalf("Create(%s): %v", spec.Name, err)
	}
	return b
}

// explain returns the spec the registry would give session.
func explain(t T, r *registry.Registry, session string) backend.SandboxSpec {
	t.Helper()
	ex, err := r.Explain(session)
	if err != nil {
		t.Fatalf("Explain(%s): %v", session, err)
	}
	return ex.Spec
}

// Reconcile leaves alone a sandbox labelled with another owner and one without an
// owner id whose name is one of ours, however old: prune neither reports nor
// touches them, and the registry refuses to use the second.
func caseReconcileOthers(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	old := clk.Now().Add(-24 * time.Hour)
	foreignOwner := "conformance-other-" + randHex(4)
	foreign := explain(t, r, "conf-keep-"+id+":foreign")
	foreign.Name = config.SandboxName(foreignOwner, "conf-keep-"+id+":foreign")
	b := h.plant(t, r, foreign, old, func(s *backend.SandboxSpec) { s.Labels[backend.LabelOwner] = foreignOwner })
	// The contract has no way to make a sandbox without berth.owner that a driver
	// may remove again, so "unlabelled" is an empty owner id and no other berth label,
	// under a name that our naming gives a session of a rule.
	bareSession := "conf-keep-" + id + ":bare"
	bare := backend.SandboxSpec{Name: explain(t, r, bareSession).Name, Image: h.Options.Image, Runtime: h.Options.Runtime}
	h.plant(t, r, bare, old, func(s *backend.SandboxSpec) { s.Labels = map[string]string{backend.LabelOwner: ""} })
	clk.Advance(2 * r.OrphanGrace())
	for _, name := range []string{foreign.Name, bare.Name} {
		if a := prune(t, r, name); a.Action != "" {
			t.Errorf("prune reported on a sandbox that is not ours: %+v", a)
		}
		if st := sandboxState(t, b, name); st != string(backend.StateRunning) {
			t.Errorf("after prune a sandbox that is not ours is %s, want running", st)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	if _, err := r.Acquire(ctx, bareSession); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("Acquire of a session whose sandbox name is held by a sandbox without our owner id: %v, want ErrConflict", err)
		removeSessionOnCleanup(t, r, bareSession)
	}
}

// Reconcile adopts a sandbox of ours that the store lost, when a rule still maps
// to it: it is recorded again and the session goes on in it.
func caseReconcileAdopts(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	s := "conf-keep-" + id + ":lost"
	spec := explain(t, r, s)
	removeSessionOnCleanup(t, r, s)
	h.plant(t, r, spec, clk.Now(), nil)
	h.sh(t, spec.Name, "echo kept > berth-conf-retention")
	clk.Advance(r.OrphanGrace() + time.Minute)
	a := prune(t, r, spec.Name)
	if a.Action != registry.PruneAdopt || a.Cause != registry.CauseAdopt || !a.Done {
		t.Fatalf("prune of our unrecorded sandbox that a rule maps: %+v, want adopt done", a)
	}
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	infos, err := r.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, in := range infos {
		found = found || (in.Session == s && in.Sandbox == spec.Name)
	}
	if !found {
		t.Errorf("the adopted session is not recorded: %+v", infos)
	}
	readBack(t, r, s, &registry.Lease{Sandbox: spec.Name})
}

// Reconcile leaves alone our unrecorded sandbox while it is younger than the grace
// period (it may be mid-create), and removes it after when no rule maps to it.
func caseReconcileGrace(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	// A session no rule matches: its sandbox can only be an orphan.
	owner, err := r.Owner()
	if err != nil {
		t.Fatal(err)
	}
	gone := "conf-gone-" + id + ":1"
	spec := explain(t, r, "conf-keep-"+id+":template")
	spec.Name = config.SandboxName(owner, gone)
	spec.Labels[backend.LabelSession] = gone
	b := h.plant(t, r, spec, clk.Now(), nil)
	clk.Advance(r.OrphanGrace() / 2)
	if a := prune(t, r, spec.Name); a.Action != registry.PruneKeep || a.Cause != registry.CauseGrace {
		t.Errorf("prune of our unrecorded sandbox within the grace period: %+v, want keep (grace)", a)
	}
	if st := sandboxState(t, b, spec.Name); st != string(backend.StateRunning) {
		t.Errorf("within the grace period the sandbox is %s, want running", st)
	}
	clk.Advance(r.OrphanGrace())
	if a := prune(t, r, spec.Name); a.Action != registry.PruneRemove || a.Cause != registry.CauseOrphan || !a.Done {
		t.Errorf("prune of our unrecorded sandbox past the grace period that no rule maps: %+v, want remove (orphan) done", a)
	}
	if st := sandboxState(t, b, spec.Name); st != "missing" {
		t.Errorf("after the orphan removal the sandbox is %s", st)
	}
}
