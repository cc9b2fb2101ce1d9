package conformance

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry"
)

// The pool group: warm pools through a registry (the scope rule's pool block). The
// registry fills pools with FillPools, so every case orders its events instead of
// waiting for a filler.
func poolCases() []Case {
	g := "pool"
	reg := "a registry opened by RegistryOpener (Options.OpenRegistry)"
	return []Case{
		{Group: g, Name: "claim-is-ready", Requires: reg, Run: casePoolClaim},
		{Group: g, Name: "no-files-from-another-session", Requires: reg, Run: casePoolNoCarry},
		{Group: g, Name: "racing-claims", Requires: reg, Run: casePoolRace},
		{Group: g, Name: "drift-drains", Requires: reg, Run: casePoolDrift},
		{Group: g, Name: "retention-from-claim", Requires: reg, Run: casePoolRetention},
	}
}

// poolConfig is the config of a pool case: rule "conf-pool-ID:*" on the driver
// under test with a pool of size and the env RULE_ENV=env, and (when stateDir is
// set) that state dir.
func (h *Harness) poolConfig(id string, size int, env, stateDir string) string {
	var b strings.Builder
	if stateDir != "" {
		fmt.Fprintf(&b, "state_dir = %s\n\n", strconv.Quote(stateDir))
	}
	if h.Options.DriverConfig != "" {
		b.WriteString(h.Options.DriverConfig + "\n\n")
	}
	fmt.Fprintf(&b, "scope \"conf-pool-%s:*\" {\n  driver = %s\n%s  env = { RULE_ENV = %s }\n  pool {\n    size = %d\n  }\n  retention {\n    max_age = \"1h\"\n  }\n}\n",
		id, strconv.Quote(h.Info.Name), h.ruleLines(), strconv.Quote(env), size)
	return b.String()
}

// poolRegistry opens the registry of a pool case, with a cleanup that removes its
// pools' members, and fills its pools.
func (h *Harness) poolRegistry(t T, cfg string) (*registry.Registry, *Clock) {
	t.Helper()
	if h.Options.OpenRegistry == nil {
		t.Skip(needsRegistry)
	}
	r, err := h.Options.OpenRegistry(t, cfg)
	if err != nil {
		t.Fatalf("opening a registry with config\n%s: %v", cfg, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
		defer cancel()
		if err := r.DrainPools(ctx); err != nil {
			t.Errorf("cleanup: DrainPools: %v", err)
		}
	})
	fillPools(t, r)
	return r, ClockOf(r)
}

func fillPools(t T, r *registry.Registry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	if err := r.FillPools(ctx); err != nil {
		t.Fatalf("FillPools: %v", err)
	}
}

// poolOf returns r's pool of scope, failing when there is none.
func poolOf(t T, r *registry.Registry, scope string) registry.PoolStatus {
	t.Helper()
	ps, err := r.Pools(t.Context())
	if err != nil {
		t.Fatalf("Pools: %v", err)
	}
	for _, p := range ps {
		if p.Scope == scope {
			return p
		}
	}
	t.Fatalf("no pool of scope %q among %+v", scope, ps)
	return registry.PoolStatus{}
}

// readyMembers returns the names of a pool's ready members.
func readyMembers(p registry.PoolStatus) map[string]bool {
	out := map[string]bool{}
	for _, m := range p.Members {
		if m.State == "ready" {
			out[m.Sandbox] = true
		}
	}
	return out
}

// A new session claims a ready member: the sandbox is one the pool made, running,
// with the owner's and the rule's labels, the rule's env in its execs, the session
// recorded on it without drift; and the pool is full again after a fill.
func casePoolClaim(t T, h *Harness) {
	id := randHex(4)
	r, _ := h.poolRegistry(t, h.poolConfig(id, 2, "one", ""))
	scope := "conf-pool-" + id + ":*"
	p := poolOf(t, r, scope)
	members := readyMembers(p)
	if p.Ready != 2 || len(members) != 2 {
		t.Fatalf("after FillPools the pool is %+v; want 2 ready members", p)
	}
	session := "conf-pool-" + id + ":a"
	removeSessionOnCleanup(t, r, session)
	out, lease := regExec(t, r, session, `printf %s "$RULE_ENV"`)
	if !lease.Pooled || !members[lease.Sandbox] {
		t.Fatalf("the session's first exec got sandbox %s (pooled %v); want one of the ready members %v", lease.Sandbox, lease.Pooled, members)
	}
	if out != "one" {
		t.Errorf("RULE_ENV in a claimed member = %q, want the rule's %q", out, "one")
	}
	b, err := r.Backend(t.Context(), h.Info.Name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	sb, err := b.Inspect(ctx, lease.Sandbox)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", lease.Sandbox, err)
	}
	owner, err := r.Owner()
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != backend.StateRunning || sb.Labels[backend.LabelOwner] != owner || sb.Labels[backend.LabelScope] != scope || sb.Labels[backend.LabelPool] == "" {
		t.Errorf("claimed member %s: state %s, labels %v; want running with %s=%s, %s=%s and a %s label",
			lease.Sandbox, sb.State, sb.Labels, backend.LabelOwner, owner, backend.LabelScope, scope, backend.LabelPool)
	}
	ss, err := r.Sessions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range ss {
		if s.Session == session {
			found = true
			if s.Sandbox != lease.Sandbox || !s.Pooled || s.Drift || s.Scope != scope || s.State != string(backend.StateRunning) {
				t.Errorf("Sessions row of %s: %+v; want its member, pooled, running, of scope %s, no drift", session, s, scope)
			}
		}
	}
	if !found {
		t.Errorf("Sessions has no row for %s", session)
	}
	// Its next exec stays in the member, which reconcile keeps as recorded.
	if _, again := regExec(t, r, session, "true"); again.Sandbox != lease.Sandbox || again.Created || again.Drift {
		t.Errorf("second exec of %s: %+v; want the same member, not created, no drift", session, again)
	}
	if a := prune(t, r, lease.Sandbox); a.Action != registry.PruneKeep {
		t.Errorf("Prune of the claimed member: %+v; want keep", a)
	}
	fillPools(t, r)
	p = poolOf(t, r, scope)
	if p.Ready != 2 {
		t.Errorf("after the claim and a fill the pool is %+v; want 2 ready", p)
	}
	for m := range readyMembers(p) {
		if m == lease.Sandbox {
			t.Errorf("the claimed sandbox %s is back in the pool", m)
		}
		if a := prune(t, r, m); a.Action != registry.PruneKeep || a.Cause != registry.CausePool {
			t.Errorf("Prune of ready member %s: %+v; want keep (cause %s): a member is never a leak", m, a, registry.CausePool)
		}
	}
}

// A member is never handed to a second session: what one session left in its
// sandbox is not in another's, even after the first is removed and the pool refilled.
func casePoolNoCarry(t T, h *Harness) {
	id := randHex(4)
	r, _ := h.poolRegistry(t, h.poolConfig(id, 1, "x", ""))
	a, b := "conf-pool-"+id+":a", "conf-pool-"+id+":b"
	removeSessionOnCleanup(t, r, a)
	removeSessionOnCleanup(t, r, b)
	_, la := regExec(t, r, a, "echo secret > berth-conf-pool")
	if !la.Pooled {
		t.Fatalf("session %s did not claim a member: %+v", a, la)
	}
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	if err := r.RemoveSession(ctx, a); err != nil {
		t.Fatalf("RemoveSession(%s): %v", a, err)
	}
	fillPools(t, r)
	out, lb := regExec(t, r, b, "cat berth-conf-pool 2>/dev/null || true")
	if !lb.Pooled || lb.Sandbox == la.Sandbox {
		t.Fatalf("session %s got sandbox %s (pooled %v) after %s had %s; want another member", b, lb.Sandbox, lb.Pooled, a, la.Sandbox)
	}
	if strings.Contains(out, "secret") {
		t.Errorf("session %s sees the file session %s wrote: %q", b, a, out)
	}
}

// Two sessions racing for a pool of one: one claims it, the other gets a sandbox of
// its own; never the same sandbox.
func casePoolRace(t T, h *Harness) {
	id := randHex(4)
	r, _ := h.poolRegistry(t, h.poolConfig(id, 2, "x", ""))
	const n = 4
	leases := make([]*registry.Lease, n)
	var wg sync.WaitGroup
	for i := range n {
		s := fmt.Sprintf("conf-pool-%s:%d", id, i)
		removeSessionOnCleanup(t, r, s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
			defer cancel()
			p, l, err := r.Exec(ctx, s, backend.ExecRequest{Argv: []string{"true"}})
			if err != nil {
				t.Errorf("exec in %s: %v", s, err)
				return
			}
			if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
				t.Errorf("exec in %s: %+v %v", s, res, err)
			}
			leases[i] = l
		}()
	}
	wg.Wait()
	seen := map[string]string{}
	pooled := 0
	for _, l := range leases {
		if l == nil {
			t.FailNow()
		}
		if other, dup := seen[l.Sandbox]; dup {
			t.Errorf("sessions %s and %s got the same sandbox %s", other, l.Session, l.Sandbox)
		}
		seen[l.Sandbox] = l.Session
		if l.Pooled {
			pooled++
		}
	}
	if pooled != 2 {
		t.Errorf("%d of %d racing sessions claimed from a pool of 2; want 2 (the others create their own)", pooled, n)
	}
}

// A change of the rule's spec drains the pool (its members are removed) and the
// next fill makes members of the new spec; a session that claimed a member before
// keeps it and is reported as drifted.
func casePoolDrift(t T, h *Harness) {
	id := randHex(4)
	scope := "conf-pool-" + id + ":*"
	dir := filepath.Join(t.TempDir(), "state")
	r1, _ := h.poolRegistry(t, h.poolConfig(id, 1, "old", dir))
	if r1.StateDir() != dir {
		t.Fatalf("OpenRegistry ignored the config's state_dir %s (got %s): pass it through, as RegistryOpener does", dir, r1.StateDir())
	}
	session := "conf-pool-" + id + ":a"
	removeSessionOnCleanup(t, r1, session)
	_, claimed := regExec(t, r1, session, "true")
	fillPools(t, r1)
	oldMembers := readyMembers(poolOf(t, r1, scope))
	r2, _ := h.poolRegistry(t, h.poolConfig(id, 1, "new", dir))
	p := poolOf(t, r2, scope)
	if p.Ready != 1 || p.Draining != 0 {
		t.Errorf("after the spec change and a fill the pool is %+v; want 1 ready, none draining", p)
	}
	b, err := r2.Backend(t.Context(), h.Info.Name)
	if err != nil {
		t.Fatal(err)
	}
	for m := range oldMembers {
		if readyMembers(p)[m] {
			t.Errorf("member %s of the old spec is still in the pool", m)
		}
		if st := sandboxState(t, b, m); st != "missing" {
			t.Errorf("drained member %s is %s; want it removed", m, st)
		}
	}
	out, l := regExec(t, r2, "conf-pool-"+id+":b", `printf %s "$RULE_ENV"`)
	removeSessionOnCleanup(t, r2, "conf-pool-"+id+":b")
	if !l.Pooled || out != "new" {
		t.Errorf("a new session after the change got %q (pooled %v); want a member of the new spec", out, l.Pooled)
	}
	_, again := regExec(t, r2, session, "true")
	if again.Sandbox != claimed.Sandbox || !again.Drift {
		t.Errorf("the session claimed before the change: %+v; want its member, with drift", again)
	}
}

// max_age counts from the claim, not from the member's creation.
func casePoolRetention(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.poolRegistry(t, h.poolConfig(id, 1, "x", ""))
	if clk == nil {
		t.Skip("needs a registry with an injectable clock: open it with conformance.RegistryOpener")
	}
	session := "conf-pool-" + id + ":a"
	removeSessionOnCleanup(t, r, session)
	clk.Advance(50 * time.Minute) // the member waits 50 minutes in the pool
	_, l := regExec(t, r, session, "true")
	if !l.Pooled {
		t.Fatalf("no claim: %+v", l)
	}
	clk.Advance(40 * time.Minute) // 90 minutes after the member was made, 40 after the claim
	if _, again := regExec(t, r, session, "true"); again.Sandbox != l.Sandbox || again.Recreated {
		t.Errorf("40 minutes after the claim (max_age 1h): %+v; max_age must count from the claim", again)
	}
	clk.Advance(30 * time.Minute)
	if _, later := regExec(t, r, session, "true"); !later.Recreated || later.Sandbox == l.Sandbox {
		t.Errorf("70 minutes after the claim (max_age 1h): %+v; want a new sandbox", later)
	}
}
