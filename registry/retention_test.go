package registry

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
)

// fakeClock is a WithClock clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Now().UTC().Truncate(time.Second)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

const retentionRules = `
scope "idle-stop:*" {
  retention {
    idle_ttl = "1h"
  }
}
scope "idle-rm:*" {
  retention {
    idle_ttl    = "1h"
    idle_action = "remove"
  }
}
scope "old:*" {
  retention {
    max_age = "2h"
  }
}
scope "pool:*" {
  isolation = "shared"
  name      = "pool"
  retention {
    idle_ttl    = "1h"
    idle_action = "remove"
  }
}
scope "*" {
}
`

// openClock opens a registry of e with clock c.
func (e *env) openClock(c *fakeClock) *Registry {
	e.t.Helper()
	r, err := e.openWith(nil, WithClock(c.Now))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { r.Close() })
	return r
}

// driver returns the fixture driver the registry r started (the last one made).
func (e *env) lastDriver() *hostDriver {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.drivers) == 0 {
		e.t.Fatal("no driver started")
	}
	return e.drivers[len(e.drivers)-1]
}

// longExec starts `cat` with stdin open in session: an exec that runs until the
// returned function closes its stdin (and waits for it).
func longExec(t *testing.T, r *Registry, session string) func() {
	t.Helper()
	p, _, err := r.Exec(context.Background(), session, backend.ExecRequest{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		p.CloseStdin()
		if _, err := p.Wait(); err != nil {
			t.Error(err)
		}
	}
}

func prune(t *testing.T, r *Registry, dry bool) *PruneReport {
	t.Helper()
	rep, err := r.Prune(context.Background(), PruneOptions{DryRun: dry})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// actionFor returns the report's action about sandbox, failing when there is none.
func actionFor(t *testing.T, rep *PruneReport, sandbox string) PruneAction {
	t.Helper()
	for _, a := range rep.Actions {
		if a.Sandbox == sandbox {
			return a
		}
	}
	t.Fatalf("prune report has no action for sandbox %s: %+v", sandbox, rep.Actions)
	return PruneAction{}
}

func TestIdleStopOnExec(t *testing.T) {
	e := newEnv(t, retentionRules)
	clk := newClock()
	r := e.openClock(clk)
	run(t, r, "idle-stop:1", "sh", "-c", "echo kept > file")
	d := e.lastDriver()
	clk.Advance(59 * time.Minute)
	run(t, r, "idle-stop:1", "true")
	if n := d.stops.Load(); n != 0 {
		t.Fatalf("a sandbox used 59 minutes ago (idle_ttl 1h) was stopped %d times", n)
	}
	clk.Advance(61 * time.Minute)
	out, lease := run(t, r, "idle-stop:1", "cat", "file")
	if d.stops.Load() != 1 {
		t.Errorf("an exec after 61 idle minutes (idle_ttl 1h, idle_action stop) stopped the sandbox %d times, want 1", d.stops.Load())
	}
	if out != "kept\n" || lease.Recreated || lease.Created {
		t.Errorf("after an idle stop: output %q, recreated %v, created %v; want the file intact in the same sandbox", out, lease.Recreated, lease.Created)
	}
}

// TestIdleUseByAnotherRegistry: a long-lived registry that last used a session
// itself an hour ago does not take the session for idle when another registry (a
// berth command, another process) used it since. The first registry's own last use
// only stands in for the last-use file while it proves the session not idle
// (store.getForCall); past that, the file decides.
func TestIdleUseByAnotherRegistry(t *testing.T) {
	e := newEnv(t, retentionRules)
	clk := newClock()
	long := e.openClock(clk)
	run(t, long, "idle-stop:1", "sh", "-c", "echo kept > file")
	other := e.openClock(clk)
	clk.Advance(50 * time.Minute)
	run(t, other, "idle-stop:1", "true")
	clk.Advance(20 * time.Minute) // 70 minutes after long's use, 20 after other's
	out, lease := run(t, long, "idle-stop:1", "cat", "file")
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, d := range e.drivers {
		if n := d.stops.Load(); n != 0 {
			t.Errorf("driver %d stopped the sandbox %d times; it was used 20 minutes ago (idle_ttl 1h)", i, n)
		}
	}
	if out != "kept\n" || lease.Recreated || lease.Created {
		t.Errorf("output %q, recreated %v, created %v; want the file intact in the same sandbox", out, lease.Recreated, lease.Created)
	}
}

func TestIdleRemoveRecreates(t *testing.T) {
	e := newEnv(t, retentionRules)
	clk := newClock()
	r := e.openClock(clk)
	_, first := run(t, r, "idle-rm:1", "sh", "-c", "echo gone > file")
	if first.Recreated {
		t.Error("the first exec of a session says recreated")
	}
	clk.Advance(2 * time.Hour)
	var out bytes.Buffer
	p, lease, err := r.Exec(context.Background(), "idle-rm:1", backend.ExecRequest{Argv: []string{"sh", "-c", "cat file 2>/dev/null || echo none"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait()
	if !lease.Recreated || !lease.Created || !strings.Contains(lease.RecreatedReason, "idle since") {
		t.Errorf("exec after idle removal: recreated %v created %v reason %q; want recreated with the idle reason", lease.Recreated, lease.Created, lease.RecreatedReason)
	}
	if out.String() != "none\n" {
		t.Errorf("the recreated sandbox still has the old file: %q", out.String())
	}
	if lease.Sandbox != first.Sandbox {
		t.Errorf("recreated sandbox is named %s, was %s", lease.Sandbox, first.Sandbox)
	}
	rec := records(t, r)["idle-rm:1"]
	if !rec.Removed.IsZero() || rec.RemovedReason != "" {
		t.Errorf("the record still says removed after the recreate: %+v", rec)
	}
	// Used just now: not recreated again.
	if _, again := run(t, r, "idle-rm:1", "true"); again.Recreated {
		t.Error("a second exec right after the recreate says recreated")
	}
}

// TestClockOffsetRecordsNoFuture: a registry with WithClockOffset judges retention
// ahead (an exec of an idle session recreates its sandbox, a dry-run prune reports
// what would expire), but what it records stays on its clock: the new sandbox's
// creation label, the session's last use and the removal time are never later than
// the clock, so a look ahead leaves no time in the future behind.
func TestClockOffsetRecordsNoFuture(t *testing.T) {
	e := newEnv(t, retentionRules)
	clk := newClock()
	r := e.openClock(clk)
	run(t, r, "idle-rm:1", "true")
	run(t, r, "idle-stop:1", "true")
	ahead, err := e.openWith(nil, WithClock(clk.Now), WithClockOffset(96*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer ahead.Close()
	rep, err := ahead.Prune(context.Background(), PruneOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.At.Equal(clk.Now().Add(96 * time.Hour)) {
		t.Errorf("the dry run was judged at %v, want the clock plus the offset", rep.At)
	}
	would := 0
	for _, a := range rep.Actions {
		if a.Action == PruneRemove || a.Action == PruneStop {
			would++
		}
	}
	if would != 2 {
		t.Errorf("a dry run 96h ahead: %d sandboxes would expire, want both: %+v", would, rep.Actions)
	}
	_, lease := run(t, ahead, "idle-rm:1", "true")
	if !lease.Recreated {
		t.Errorf("exec 96h ahead of an idle_ttl 1h remove session: %+v, want recreated", lease)
	}
	run(t, ahead, "idle-stop:1", "true")
	now := clk.Now()
	for _, s := range []string{"idle-rm:1", "idle-stop:1"} {
		rec := records(t, r)[s]
		if rec.LastUsed.After(now) || rec.Created.After(now) {
			t.Errorf("%s after an exec 96h ahead: last use %v, created %v; want neither after the clock %v", s, rec.LastUsed, rec.Created, now)
		}
		sb, err := e.lastDriver().Inspect(context.Background(), rec.Sandbox)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := time.Parse(time.RFC3339, sb.Labels[backend.LabelCreated]); err != nil || c.After(now) {
			t.Errorf("%s's sandbox label %s = %q, want no time after the clock %v", s, backend.LabelCreated, sb.Labels[backend.LabelCreated], now)
		}
	}
	// Without the offset the sessions were just used: nothing is due.
	run(t, r, "idle-rm:1", "true")
	if _, again := run(t, r, "idle-rm:1", "true"); again.Recreated {
		t.Error("an exec without offset right after the look-ahead recreated the sandbox again")
	}
	// A real prune ahead records the removal at the clock's time.
	if _, err := ahead.Prune(context.Background(), PruneOptions{}); err != nil {
		t.Fatal(err)
	}
	if rec := records(t, r)["idle-rm:1"]; rec.Removed.IsZero() || rec.Removed.After(now) {
		t.Errorf("removal recorded at %v, want set and not after the clock %v", rec.Removed, now)
	}
}

func TestPruneIdleRemoveAndNextExec(t *testing.T) {
	e := newEnv(t, retentionRules)
	clk := newClock()
	r := e.openClock(clk)
	_, lease := run(t, r, "idle-rm:1", "true")
	run(t, r, "idle-stop:1", "true")
	stopName := config.SandboxName(mustOwner(t, r), "idle-stop:1")

	clk.Advance(30 * time.Minute)
	rep := prune(t, r, false)
	if a := actionFor(t, rep, lease.Sandbox); a.Action != PruneKeep || a.Cause != CauseRecorded {
		t.Errorf("prune 30 minutes after use: %+v, want keep/recorded", a)
	}
	clk.Advance(time.Hour)
	before := e.storeHash()
	dry := prune(t, r, true)
	if a := actionFor(t, dry, lease.Sandbox); a.Action != PruneRemove || a.Cause != CauseIdle || a.Done || !strings.Contains(a.Reason, "idle since") {
		t.Errorf("dry run: %+v, want remove/idle, not done, reason with idle since", a)
	}
	if a := actionFor(t, dry, stopName); a.Action != PruneStop || a.Cause != CauseIdle {
		t.Errorf("dry run for the idle_action stop sandbox: %+v", a)
	}
	if e.storeHash() != before || !slices.Contains(e.sandboxes(), lease.Sandbox) {
		t.Fatal("a dry run changed the store or removed the sandbox")
	}
	rep = prune(t, r, false)
	if a := actionFor(t, rep, lease.Sandbox); a.Action != PruneRemove || !a.Done || a.Error != "" {
		t.Errorf("prune: %+v, want remove done", a)
	}
	if a := actionFor(t, rep, stopName); a.Action != PruneStop || !a.Done {
		t.Errorf("prune of the idle_action stop sandbox: %+v", a)
	}
	if slices.Contains(e.sandboxes(), lease.Sandbox) {
		t.Fatal("prune reported remove but the sandbox is still there")
	}
	infos, err := r.Sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Session == "idle-rm:1" && (in.State != StateRemoved || !strings.Contains(in.RemovedReason, "idle since")) {
			t.Errorf("sessions after the idle removal: %+v, want state removed with the reason", in)
		}
		if in.Session == "idle-stop:1" && in.State != string(backend.StateStopped) {
			t.Errorf("sessions after the idle stop: %+v", in)
		}
	}
	// A second prune finds nothing more to do about the stopped one.
	if a := actionFor(t, prune(t, r, false), stopName); a.Action != PruneKeep {
		t.Errorf("second prune of a stopped idle sandbox: %+v, want keep", a)
	}
	_, again := run(t, r, "idle-rm:1", "true")
	if !again.Recreated || !strings.Contains(again.RecreatedReason, "idle since") {
		t.Errorf("next exec after prune removed the sandbox: recreated %v (%q)", again.Recreated, again.RecreatedReason)
	}
}

func mustOwner(t *testing.T, r *Registry) string {
	t.Helper()
	o, err := r.Owner()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// An exec in flight, in this registry or another one on the same state dir, keeps
// a sandbox from being idle however old its last use; once it ends, the idle time
// counts from its end.
func TestRunningExecIsNotIdle(t *testing.T) {
	e := newEnv(t, retentionRules)
	clk := newClock()
	r := e.openClock(clk)
	other := e.openClock(clk) // stands for another berth process: flocks are per open file
	stop := longExec(t, r, "idle-rm:1")
	name := config.SandboxName(mustOwner(t, r), "idle-rm:1")
	clk.Advance(3 * time.Hour)
	for i, reg := range []*Registry{r, other} {
		if a := actionFor(t, prune(t, reg, false), name); a.Action != PruneKeep || a.Cause != CauseInUse {
			t.Errorf("registry %d: prune with an exec in flight: %+v, want keep/in-use", i, a)
		}
	}
	// An ordinary exec in the session does not expire it either.
	if _, l := run(t, other, "idle-rm:1", "true"); l.Recreated {
		t.Error("an exec beside a running one recreated the sandbox")
	}
	stop()
	clk.Advance(30 * time.Minute)
	if a := actionFor(t, prune(t, other, false), name); a.Action != PruneKeep {
		t.Errorf("prune 30 minutes after the long exec ended: %+v, want keep", a)
	}
	clk.Advance(31 * time.Minute)
	if a := actionFor(t, prune(t, other, false), name); a.Action != PruneRemove || !a.Done {
		t.Errorf("prune 61 minutes after the long exec ended: %+v, want remove", a)
	}
}

func TestMaxAgeRemovesInUse(t *testing.T) {
	e := newEnv(t, retentionRules)
	clk := newClock()
	r := e.openClock(clk)
	stop := longExec(t, r, "old:1")
	defer stop()
	name := config.SandboxName(mustOwner(t, r), "old:1")
	clk.Advance(119 * time.Minute)
	if a := actionFor(t, prune(t, r, false), name); a.Action != PruneKeep {
		t.Errorf("prune at 119 minutes (max_age 2h): %+v", a)
	}
	clk.Advance(time.Minute)
	a := actionFor(t, prune(t, r, false), name)
	if a.Action != PruneRemove || a.Cause != CauseAge || !a.Done || !strings.Contains(a.Reason, "max_age 2h") {
		t.Errorf("prune at 2h (max_age 2h) with an exec in flight: %+v, want remove/age done", a)
	}
	if slices.Contains(e.sandboxes(), name) {
		t.Error("max_age left the sandbox")
	}
}

func TestMaxAgeOnExec(t *testing.T) {
	e := newEnv(t, retentionRules)
	clk := newClock()
	r := e.openClock(clk)
	run(t, r, "old:1", "true")
	clk.Advance(90 * time.Minute)
	run(t, r, "old:1", "true") // use does not reset the age
	clk.Advance(31 * time.Minute)
	_, l := run(t, r, "old:1", "true")
	if !l.Recreated || !strings.Contains(l.RecreatedReason, "max_age") {
		t.Errorf("exec past max_age: recreated %v %q", l.Recreated, l.RecreatedReason)
	}
	if d := e.lastDriver(); d.removes.Load() != 1 {
		t.Errorf("%d removes, want 1", d.removes.Load())
	}
}

// A shared sandbox is idle only when every session on it is.
func TestSharedIdle(t *testing.T) {
	e := newEnv(t, retentionRules)
	clk := newClock()
	r := e.openClock(clk)
	_, l := run(t, r, "pool:1", "true")
	clk.Advance(50 * time.Minute)
	run(t, r, "pool:2", "true")
	clk.Advance(20 * time.Minute) // pool:1 idle 70m, pool:2 idle 20m
	if a := actionFor(t, prune(t, r, false), l.Sandbox); a.Action != PruneKeep {
		t.Errorf("a shared sandbox one of whose sessions was used 20 minutes ago: %+v, want keep", a)
	}
	if _, l1 := run(t, r, "pool:1", "true"); l1.Recreated {
		t.Error("exec in pool:1 recreated the shared sandbox that pool:2 used recently")
	}
}

// reconcileRules has a rule for "keep:*" only: sandboxes of other sessions are
// orphans.
const reconcileRules = `
scope "keep:*" {
}
`

// plant creates a sandbox directly on the registry's driver, as a crash between
// create and record would leave it, with labels edited by edit.
func plant(t *testing.T, r *Registry, session string, created time.Time, edit func(*backend.SandboxSpec)) string {
	t.Helper()
	ctx := context.Background()
	owner := mustOwner(t, r)
	rule := &config.Rule{Glob: "keep:*", Driver: "local", Isolation: config.IsolationSession}
	spec := rule.Spec(owner, session)
	spec.Labels[backend.LabelCreated] = created.Format(time.RFC3339)
	if edit != nil {
		edit(&spec)
	}
	b, err := r.Backend(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Create(ctx, backend.CreateRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	return spec.Name
}

func TestReconcile(t *testing.T) {
	e := newEnv(t, reconcileRules)
	clk := newClock()
	r, err := e.openWith(nil, WithClock(clk.Now), WithOrphanGrace(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	now := clk.Now()
	lost := plant(t, r, "keep:lost", now, nil) // a rule maps it: adopt
	orphan := plant(t, r, "gone:1", now, nil)  // no rule: remove
	young := plant(t, r, "gone:2", now, nil)   // created later: grace
	foreign := plant(t, r, "keep:x", now, func(s *backend.SandboxSpec) {
		s.Labels[backend.LabelOwner] = "someone-else"
		s.Name = config.SandboxName("someone-else", "keep:x")
	})
	unlabelled := plant(t, r, "keep:bare", now, func(s *backend.SandboxSpec) {
		s.Labels = nil
		s.Name = config.SandboxName(mustOwner(t, r), "keep:unlabelled") // a name like ours
	})

	rep := prune(t, r, false)
	for _, n := range []string{lost, orphan, young} {
		if a := actionFor(t, rep, n); a.Action != PruneKeep || a.Cause != CauseGrace {
			t.Errorf("prune of a new unrecorded sandbox: %+v, want keep/grace", a)
		}
	}
	clk.Advance(11 * time.Minute)
	// Re-date the young one: it is "created" now.
	b, _ := r.Backend(context.Background(), "local")
	d := b.(*hostDriver)
	m, _ := d.read(young)
	m.Labels[backend.LabelCreated] = clk.Now().Format(time.RFC3339)
	d.write(young, m)

	dry := prune(t, r, true)
	if a := actionFor(t, dry, lost); a.Action != PruneAdopt || a.Done {
		t.Errorf("dry run, lost sandbox: %+v", a)
	}
	if len(records(t, r)) != 0 {
		t.Fatal("a dry run wrote records")
	}
	rep = prune(t, r, false)
	if a := actionFor(t, rep, lost); a.Action != PruneAdopt || a.Cause != CauseAdopt || !a.Done {
		t.Errorf("lost sandbox: %+v, want adopt done", a)
	}
	if a := actionFor(t, rep, orphan); a.Action != PruneRemove || a.Cause != CauseOrphan || !a.Done {
		t.Errorf("orphan: %+v, want remove/orphan done", a)
	}
	if a := actionFor(t, rep, young); a.Action != PruneKeep || a.Cause != CauseGrace {
		t.Errorf("young orphan: %+v, want keep/grace", a)
	}
	for _, a := range rep.Actions {
		if a.Sandbox == foreign || a.Sandbox == unlabelled {
			t.Errorf("prune acted on a sandbox that is not ours: %+v", a)
		}
	}
	sbs := e.sandboxes()
	for _, n := range []string{lost, young, foreign, unlabelled} {
		if !slices.Contains(sbs, n) {
			t.Errorf("sandbox %s is gone after prune", n)
		}
	}
	if slices.Contains(sbs, orphan) {
		t.Error("the orphan is still there")
	}
	if rec, ok := records(t, r)["keep:lost"]; !ok || rec.Sandbox != lost {
		t.Errorf("adopted sandbox not recorded: %+v", records(t, r))
	}
	// The adopted session goes on in the same sandbox.
	if _, l := run(t, r, "keep:lost", "true"); l.Created || l.Recreated || l.Sandbox != lost {
		t.Errorf("exec in the adopted session: %+v", l)
	}

	// --owner cleans up after a lost state dir, and nothing else.
	rep, err = r.Prune(context.Background(), PruneOptions{Owner: "someone-else"})
	if err != nil {
		t.Fatal(err)
	}
	if a := actionFor(t, rep, foreign); a.Action != PruneRemove || a.Cause != CauseOwner || !a.Done {
		t.Errorf("prune --owner: %+v", a)
	}
	if len(rep.Actions) != 1 {
		t.Errorf("prune --owner acted on more than the other owner's sandbox: %+v", rep.Actions)
	}
	sbs = e.sandboxes()
	if slices.Contains(sbs, foreign) || !slices.Contains(sbs, unlabelled) || !slices.Contains(sbs, lost) {
		t.Errorf("after prune --owner: %v", sbs)
	}
	if _, err := r.Prune(context.Background(), PruneOptions{Owner: "bad owner!"}); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), `"bad owner!"`) {
		t.Errorf("bad --owner: %v", err)
	}
}

// downDriver is a driver whose runtime is down.
type downDriver struct{ hostDriver }

func (d *downDriver) List(context.Context, map[string]string) ([]backend.Sandbox, error) {
	return nil, backend.Errorf(backend.ErrUnavailable, "runtime is down")
}

func TestPruneDriverDownAndFiles(t *testing.T) {
	e := newEnv(t, reconcileRules+`
scope "docker:*" {
  driver = "down"
}
`)
	clk := newClock()
	r, err := e.openWith([]string{"local", "down"},
		WithDriver("down", func() backend.TerminalBackend { return &downDriver{} }), WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, l := run(t, r, "keep:1", "true")
	// Files nothing references: a sandbox dir and a lock from a lost sandbox.
	stray := config.SandboxName(mustOwner(t, r), "keep:stray")
	os.MkdirAll(filepath.Join(e.stateDir, "sandboxes", "local", stray, "agent"), 0o700)
	os.WriteFile(filepath.Join(e.stateDir, "locks", stray+".lock"), nil, 0o600)

	rep := prune(t, r, false)
	if len(rep.Drivers) != 2 || rep.Drivers[0].Name != "down" || !strings.Contains(rep.Drivers[0].Error, "runtime is down") ||
		rep.Drivers[1].Name != "local" || rep.Drivers[1].Error != "" || rep.Drivers[1].Sandboxes != 1 {
		t.Errorf("drivers: %+v", rep.Drivers)
	}
	if !rep.Failed() {
		t.Error("a report with a driver down is not Failed")
	}
	if a := actionFor(t, rep, l.Sandbox); a.Action != PruneKeep {
		t.Errorf("the healthy driver's sandbox: %+v", a)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "sandboxes", "local", stray)); err != nil {
		t.Error("prune deleted sandbox files while a driver was down")
	}

	// With the down driver out of the config, the stray files go once old enough.
	e.writeConfig(reconcileRules)
	r2, err := e.openWith(nil, WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	rep = prune(t, r2, false)
	if rep.Failed() {
		t.Errorf("prune: %+v", rep)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "sandboxes", "local", stray)); err != nil {
		t.Error("prune deleted young stray files (grace)")
	}
	// Files are dated in real time: a clock ahead does not age them...
	clk.Advance(DefaultOrphanGrace + time.Minute)
	prune(t, r2, false)
	if _, err := os.Stat(filepath.Join(e.stateDir, "sandboxes", "local", stray)); err != nil {
		t.Error("prune deleted stray files that are young in real time because its clock is ahead")
	}
	// ... their modification time does.
	past := time.Now().Add(-DefaultOrphanGrace - time.Minute)
	for _, p := range []string{filepath.Join(e.stateDir, "sandboxes", "local", stray), filepath.Join(e.stateDir, "locks", stray+".lock"),
		filepath.Join(e.stateDir, "sandboxes", "local", l.Sandbox), filepath.Join(e.stateDir, "locks", l.Sandbox+".lock")} {
		if err := os.Chtimes(p, past, past); err != nil {
			t.Fatal(err)
		}
	}
	rep = prune(t, r2, false)
	deleted := 0
	for _, a := range rep.Actions {
		if a.Action == PruneDelete && a.Done && strings.Contains(a.Path, stray) {
			deleted++
		}
	}
	if deleted != 2 {
		t.Errorf("deleted %d stray paths, want 2 (dir and lock): %+v", deleted, rep.Actions)
	}
	for _, p := range []string{filepath.Join(e.stateDir, "sandboxes", "local", stray), filepath.Join(e.stateDir, "locks", stray+".lock")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists", p)
		}
	}
	// The live session's files stay.
	for _, p := range []string{filepath.Join(e.stateDir, "sandboxes", "local", l.Sandbox), filepath.Join(e.stateDir, "locks", l.Sandbox+".lock")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("prune deleted %s of a live session: %v", p, err)
		}
	}
}

// A failed exec leaves no busy marker, and a finished one leaves the sandbox idle.
func TestBusyMarker(t *testing.T) {
	e := newEnv(t, retentionRules)
	r := e.open()
	run(t, r, "idle-rm:1", "true")
	name := config.SandboxName(mustOwner(t, r), "idle-rm:1")
	if busy, err := isBusy(r.busyPath("local", name)); err != nil || busy {
		t.Errorf("after the exec ended: busy %v, %v", busy, err)
	}
	stop := longExec(t, r, "idle-rm:1")
	if busy, err := isBusy(r.busyPath("local", name)); err != nil || !busy {
		t.Errorf("during an exec: busy %v, %v", busy, err)
	}
	stop()
	if busy, _ := isBusy(r.busyPath("local", name)); busy {
		t.Error("busy after Wait")
	}
}

// A session that a config change moves to another sandbox leaves the old one
// unrecorded; prune removes it as an orphan once past the grace period, and keeps
// the new one.
func TestPruneRemovesMovedFrom(t *testing.T) {
	e := newEnv(t, `scope "x:*" {}`)
	clk := newClock()
	r := e.openClock(clk)
	_, before := run(t, r, "x:1", "true")
	e.writeConfig(`scope "x:*" {
  isolation = "shared"
  name      = "pool"
}`)
	r2 := e.openClock(clk)
	_, after := run(t, r2, "x:1", "true")
	if after.Sandbox == before.Sandbox {
		t.Fatal("the config change did not move the session")
	}
	if a := actionFor(t, prune(t, r2, false), before.Sandbox); a.Action != PruneKeep || a.Cause != CauseGrace {
		t.Errorf("prune right after the move: %+v, want keep (grace)", a)
	}
	clk.Advance(DefaultOrphanGrace)
	rep := prune(t, r2, false)
	if a := actionFor(t, rep, before.Sandbox); a.Action != PruneRemove || a.Cause != CauseOrphan || !a.Done {
		t.Errorf("prune past the grace period: %+v, want remove (orphan)", a)
	}
	if a := actionFor(t, rep, after.Sandbox); a.Action != PruneKeep || a.Cause != CauseRecorded {
		t.Errorf("prune of the session's new sandbox: %+v", a)
	}
}

// Full-output files go with their session: prune deletes the output dir of a session
// that has no sandbox any more (once old enough), and keeps a live session's.
func TestPruneOutputs(t *testing.T) {
	e := newEnv(t, reconcileRules)
	r := e.open()
	run(t, r, "keep:1", "true")
	live := filepath.Dir(r.outputPath("keep:1", "stdout"))
	gone := filepath.Dir(r.outputPath("keep:gone", "stdout"))
	past := time.Now().Add(-DefaultOrphanGrace - time.Minute)
	for _, d := range []string{live, gone} {
		os.MkdirAll(d, 0o700)
		os.WriteFile(filepath.Join(d, "x.stdout"), []byte("out"), 0o600)
		os.Chtimes(d, past, past)
	}
	young := filepath.Dir(r.outputPath("keep:young", "stdout"))
	os.MkdirAll(young, 0o700)

	dry := prune(t, r, true)
	if _, err := os.Stat(gone); err != nil {
		t.Fatal("a dry run deleted output files")
	}
	found := false
	for _, a := range dry.Actions {
		found = found || a.Path == gone && a.Action == PruneDelete && !a.Done
	}
	if !found {
		t.Errorf("dry run does not list %s for deletion: %+v", gone, dry.Actions)
	}
	prune(t, r, false)
	if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the output dir of a session without sandbox is still there: %v", err)
	}
	for _, d := range []string{live, young} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("prune deleted %s (a live session's, or too young): %v", d, err)
		}
	}
}

// Recreate removes a session's sandbox whether the store records it or not (a crash
// between create and record leaves one that only the driver knows), and reports
// whether there was one; the next Acquire creates a new one.
func TestRecreateUnrecorded(t *testing.T) {
	e := newEnv(t, reconcileRules)
	r, err := e.openWith(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	name := plant(t, r, "keep:lost", time.Now(), nil)
	b, err := r.Backend(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if removed, err := r.Recreate(ctx, "keep:lost"); err != nil || !removed {
		t.Fatalf("Recreate of an unrecorded sandbox: %v, %v; want removed", removed, err)
	}
	if _, err := b.Inspect(ctx, name); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Inspect after Recreate: %v, want not found", err)
	}
	if removed, err := r.Recreate(ctx, "keep:lost"); err != nil || removed {
		t.Errorf("second Recreate: %v, %v; want nothing to remove", removed, err)
	}
	l, err := r.Acquire(ctx, "keep:lost")
	if err != nil || !l.Created || l.Recreated {
		t.Fatalf("Acquire after Recreate: %+v, %v; want a new sandbox", l, err)
	}
	if removed, err := r.Recreate(ctx, "keep:lost"); err != nil || !removed {
		t.Errorf("Recreate of a recorded sandbox: %v, %v; want removed", removed, err)
	}
	if _, err := b.Inspect(ctx, name); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Inspect after the second Recreate: %v, want not found", err)
	}
	if _, err := r.Recreate(ctx, "no rule matches this"); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Recreate of a bad session name: %v, want ErrInvalid", err)
	}
}

// The recreate notice says why the previous sandbox ended when its driver's
// Create says so (EndReason: a Pod evicted or OOM-killed that had to be made
// anew), retention's reason when retention removed it, and that it was gone
// otherwise.
func TestRecreatedReasonEnd(t *testing.T) {
	old := record{Session: "s", Driver: "kubernetes", Sandbox: "b-1"}
	for _, c := range []struct {
		sb   backend.Sandbox
		want []string
	}{
		{backend.Sandbox{EndReason: backend.EndOOMKilled, EndMessage: "the sandbox container's agent exited with code 137"},
			[]string{"b-1 on driver kubernetes had ended (OOMKilled: out of memory, its memory limit was reached: the sandbox container's agent exited with code 137)", "new and empty"}},
		{backend.Sandbox{EndReason: backend.EndEvicted, EndMessage: "The node was low on resource: memory."},
			[]string{"had ended (Evicted by its runtime: The node was low on resource: memory.)"}},
		{backend.Sandbox{EndReason: "Shutdown"}, []string{"had ended (Shutdown)"}},
		{backend.Sandbox{}, []string{"no longer existed on driver kubernetes (removed outside berth?)"}},
	} {
		got := recreatedReason(old, "kubernetes", c.sb)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("recreatedReason for %+v = %q, want it to say %q", c.sb, got, w)
			}
		}
	}
	removed := old
	removed.RemovedReason = "idle since ..."
	if got := recreatedReason(removed, "kubernetes", backend.Sandbox{EndReason: backend.EndError}); !strings.Contains(got, "removed by retention: idle since") {
		t.Errorf("retention's removal: %q", got)
	}
}
