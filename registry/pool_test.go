package registry

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/flock"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

const poolRules = `
scope "task:*" {
  env = { RULE = "task" }
  pool {
    size     = 2
    max_idle = "30m"
  }
  retention {
    max_age = "1h"
  }
}
scope "*" {
}
`

// fill runs FillPools and fails the test on its error.
func fill(t *testing.T, r *Registry) {
	t.Helper()
	if err := r.FillPools(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// pool returns the status of r's pool of scope.
func poolOf(t *testing.T, r *Registry, scope string) PoolStatus {
	t.Helper()
	ps, err := r.Pools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Scope == scope {
			return p
		}
	}
	t.Fatalf("no pool of scope %q in %+v", scope, ps)
	return PoolStatus{}
}

func readyMembers(p PoolStatus) []string {
	var out []string
	for _, m := range p.Members {
		if m.State == "ready" {
			out = append(out, m.Sandbox)
		}
	}
	return out
}

// byReadiness returns a pool's ready members in the order claims take them: the
// longest ready first.
func byReadiness(p PoolStatus) []string {
	var ms []PoolMember
	for _, m := range p.Members {
		if m.State == "ready" {
			ms = append(ms, m)
		}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Ready.Before(ms[j].Ready) })
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Sandbox
	}
	return out
}

func TestPoolClaimAndRefill(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	if p := poolOf(t, r, "task:*"); p.Size != 2 || len(p.Members) != 0 {
		t.Fatalf("before any fill: %+v", p)
	}
	fill(t, r)
	p := poolOf(t, r, "task:*")
	ready := byReadiness(p)
	if p.Ready != 2 || len(ready) != 2 {
		t.Fatalf("after fill: %+v, want 2 ready", p)
	}
	for _, m := range ready {
		if !strings.HasPrefix(m, "b-") {
			t.Fatalf("member name %q", m)
		}
	}
	created := len(e.creates())

	out, lease := run(t, r, "task:1", "sh", "-c", "echo $RULE; touch mine")
	if out != "task\n" || !lease.Pooled || !lease.Created || lease.Drift || lease.Recreated {
		t.Fatalf("first exec: out %q lease %+v; want a claimed member with the rule's env", out, lease)
	}
	if lease.Sandbox != ready[0] {
		t.Fatalf("claimed %s, want the oldest ready member %s", lease.Sandbox, ready[0])
	}
	if len(e.creates()) != created {
		t.Fatalf("the claim created a sandbox: %v", e.creates())
	}
	if _, err := os.Stat(r.lockPath(config.SandboxName(mustOwner(t, r), "task:1"))); !os.IsNotExist(err) {
		t.Fatalf("the claim left the lock file of the session's own sandbox name: %v", err)
	}
	if p := poolOf(t, r, "task:*"); p.Ready != 1 {
		t.Fatalf("after the claim: %+v, want 1 ready", p)
	}
	// The session keeps its member, directly, with no drift.
	_, again := run(t, r, "task:1", "test", "-e", "mine")
	if again.Sandbox != lease.Sandbox || again.Created || !again.Pooled || again.Drift {
		t.Fatalf("second exec: %+v", again)
	}
	ss, err := r.Sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 1 || !ss[0].Pooled || ss[0].Drift || ss[0].Sandbox != lease.Sandbox || ss[0].State != "running" {
		t.Fatalf("sessions: %+v", ss)
	}
	fill(t, r)
	if p := poolOf(t, r, "task:*"); p.Ready != 2 {
		t.Fatalf("after refill: %+v", p)
	}
	// Reconcile keeps members and the claimed one; nothing is a leak.
	rep := prune(t, r, false)
	for _, a := range rep.Actions {
		if a.Sandbox != "" && a.Action != PruneKeep {
			t.Fatalf("prune acted on %s: %+v", a.Sandbox, a)
		}
	}
	for _, m := range readyMembers(poolOf(t, r, "task:*")) {
		if a := actionFor(t, rep, m); a.Cause != CausePool {
			t.Fatalf("member %s: %+v, want cause pool", m, a)
		}
	}
	if a := actionFor(t, rep, lease.Sandbox); a.Cause != CauseRecorded || len(a.Sessions) != 1 {
		t.Fatalf("claimed member: %+v", a)
	}
	// Other rules' sessions are created as before.
	if _, l := run(t, r, "main", "true"); l.Pooled {
		t.Fatalf("a session of a rule without a pool got a member: %+v", l)
	}
}

func TestPoolMissCreates(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	var mu sync.Mutex
	var events []PoolEvent
	r.onPool = func(ev PoolEvent) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}
	_, lease := run(t, r, "task:1", "true")
	if lease.Pooled || !lease.Created {
		t.Fatalf("with an empty pool: %+v, want a sandbox of its own", lease)
	}
	if lease.Sandbox != config.SandboxName(mustOwner(t, r), "task:1") {
		t.Fatalf("sandbox %s", lease.Sandbox)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0].Kind != PoolMiss || events[0].Session != "task:1" {
		t.Fatalf("events %+v, want one miss", events)
	}
}

func TestPoolConcurrentClaims(t *testing.T) {
	e := newEnv(t, strings.Replace(poolRules, "size     = 2", "size     = 4", 1))
	r := e.open()
	fill(t, r)
	members := map[string]bool{}
	for _, m := range readyMembers(poolOf(t, r, "task:*")) {
		members[m] = true
	}
	if len(members) != 4 {
		t.Fatalf("members %v", members)
	}
	const n = 8
	leases := make([]*Lease, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, l, err := r.Exec(context.Background(), fmt.Sprintf("task:%d", i), backend.ExecRequest{Argv: []string{"true"}})
			if err != nil {
				t.Error(err)
				return
			}
			p.Wait()
			leases[i] = l
		}()
	}
	wg.Wait()
	seen := map[string]string{}
	pooled := 0
	for i, l := range leases {
		if l == nil {
			t.FailNow()
		}
		if prev, dup := seen[l.Sandbox]; dup {
			t.Fatalf("sessions %s and task:%d got the same sandbox %s", prev, i, l.Sandbox)
		}
		seen[l.Sandbox] = l.Session
		if l.Pooled {
			pooled++
			if !members[l.Sandbox] {
				t.Fatalf("task:%d claimed %s, not a member", i, l.Sandbox)
			}
		}
	}
	if pooled != 4 {
		t.Fatalf("%d claims from a pool of 4 with 8 sessions racing; want 4 (the rest create)", pooled)
	}
}

func TestPoolFailedCallDropsMember(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	fill(t, r)
	ready := byReadiness(poolOf(t, r, "task:*"))
	_, _, err := r.Exec(context.Background(), "task:1", backend.ExecRequest{Argv: []string{"true"}, Dir: "/does/not/exist"})
	if err == nil {
		t.Fatal("exec with a missing cwd succeeded")
	}
	if _, ok := records(t, r)["task:1"]; ok {
		t.Fatal("a failed call recorded the session")
	}
	p := poolOf(t, r, "task:*")
	if p.Ready != 1 || len(p.Members) != 1 || p.Members[0].Sandbox != ready[1] {
		t.Fatalf("after a failed call: %+v; the claimed member must be gone, never handed out again", p)
	}
	if _, err := os.Stat(e.driverDir(ready[0])); !os.IsNotExist(err) {
		t.Fatalf("the failed call's member %s is still there (%v)", ready[0], err)
	}
	_, lease := run(t, r, "task:1", "true")
	if lease.Sandbox != ready[1] {
		t.Fatalf("next claim got %s, want %s", lease.Sandbox, ready[1])
	}
}

// storeCommits returns how many write transactions r's store has committed (bbolt's
// transaction id, which every commit raises by one).
func storeCommits(t *testing.T, r *Registry) int {
	t.Helper()
	var id int
	if err := r.store.view(func(tx *bolt.Tx) error {
		id = tx.ID()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestPoolClaimOneCommit: a claim, up to its command's result, commits the store once:
// the session's record and the end of the member's entry are one transaction, written
// before the command runs.
func TestPoolClaimOneCommit(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	fill(t, r)
	member := byReadiness(poolOf(t, r, "task:*"))[0]
	before := storeCommits(t, r)
	p, lease, err := r.Exec(context.Background(), "task:1", backend.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	// The command has started: the claim is on disk.
	rec, ok := records(t, r)["task:1"]
	if !ok || rec.Sandbox != member || !rec.Pooled || lease.Sandbox != member {
		t.Fatalf("record while the claim's command runs: %+v (recorded %v), lease %+v; want member %s", rec, ok, lease, member)
	}
	if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
		t.Fatal(res, err)
	}
	if n := storeCommits(t, r) - before; n != 1 {
		t.Fatalf("a claim committed the store %d times, want 1", n)
	}
	for _, m := range poolOf(t, r, "task:*").Members {
		if m.Sandbox == member {
			t.Fatalf("the claimed member still has a pool entry: %+v", m)
		}
	}
}

// TestPoolClaimPassesLockedMember: a claim passes over a member whose lock another
// holds (another claim of it, a drain removing it) instead of waiting for it: it
// gets the next member while that lock is still held.
func TestPoolClaimPassesLockedMember(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	fill(t, r)
	ready := byReadiness(poolOf(t, r, "task:*"))
	held, err := flock.Lock(context.Background(), r.lockPath(ready[0]))
	if err != nil {
		t.Fatal(err)
	}
	type claim struct {
		lease *Lease
		err   error
	}
	done := make(chan claim, 1)
	go func() {
		p, lease, err := r.Exec(context.Background(), "task:1", backend.ExecRequest{Argv: []string{"true"}})
		if err == nil {
			_, err = p.Wait()
		}
		done <- claim{lease, err}
	}()
	select {
	case c := <-done:
		if c.err != nil || c.lease.Sandbox != ready[1] {
			t.Errorf("claim: %+v, %v; want the next member %s", c.lease, c.err, ready[1])
		}
	case <-time.After(testwait.Limit):
		t.Errorf("the claim waited for the held lock of %s", ready[0])
		held.Unlock(false)
		<-done
	}
	held.Unlock(false)
}

// TestPoolFailedClaimRestoresRecord: a session whose sandbox is gone claims a member
// for a call that fails before its command starts: its record is the one it had
// (still naming the gone sandbox, marked removed), and the member is not handed out
// again.
func TestPoolFailedClaimRestoresRecord(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	fill(t, r)
	_, first := run(t, r, "task:1", "true")
	// Its sandbox gone, as retention or a vanished sandbox leave the record.
	if _, err := r.store.markRemoved(first.Driver, first.Sandbox, time.Now(), "removed by the test"); err != nil {
		t.Fatal(err)
	}
	old, ok := records(t, r)["task:1"]
	if !ok || old.Sandbox != first.Sandbox || old.Removed.IsZero() {
		t.Fatalf("record after markRemoved: %+v (recorded %v); want %s marked removed", old, ok, first.Sandbox)
	}
	fill(t, r)
	next := byReadiness(poolOf(t, r, "task:*"))[0]
	_, _, err := r.Exec(context.Background(), "task:1", backend.ExecRequest{Argv: []string{"true"}, Dir: "/does/not/exist"})
	if err == nil {
		t.Fatal("exec with a missing cwd succeeded")
	}
	got, ok := records(t, r)["task:1"]
	if !ok || got.Sandbox != old.Sandbox || got.Removed.IsZero() || got.Pooled != old.Pooled {
		t.Fatalf("record after the failed claim: %+v (recorded %v); want it as before: %+v", got, ok, old)
	}
	for _, m := range poolOf(t, r, "task:*").Members {
		if m.Sandbox == next {
			t.Fatalf("the failed call's member %s is still in the pool: %+v", next, m)
		}
	}
	if _, err := os.Stat(e.driverDir(next)); !os.IsNotExist(err) {
		t.Fatalf("the failed call's member %s is still there (%v)", next, err)
	}
}

func TestPoolDriftDrainsAndRefills(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	fill(t, r)
	old := byReadiness(poolOf(t, r, "task:*"))
	_, claimed := run(t, r, "task:1", "true")
	r.Close()

	e.writeConfig(strings.Replace(poolRules, `RULE = "task"`, `RULE = "task2"`, 1))
	r2 := e.open()
	if p := poolOf(t, r2, "task:*"); p.Draining != 1 || p.Ready != 0 {
		t.Fatalf("after the spec change, before a fill: %+v, want 1 draining", p)
	}
	fill(t, r2)
	p := poolOf(t, r2, "task:*")
	if p.Ready != 2 || p.Draining != 0 {
		t.Fatalf("after fill: %+v", p)
	}
	for _, m := range readyMembers(p) {
		if m == old[1] {
			t.Fatalf("old member %s kept after drift", m)
		}
	}
	if _, err := os.Stat(e.driverDir(old[1])); !os.IsNotExist(err) {
		t.Fatalf("drained member %s still exists (%v)", old[1], err)
	}
	out, l := run(t, r2, "task:2", "sh", "-c", "echo $RULE")
	if out != "task2\n" || !l.Pooled {
		t.Fatalf("new claim: %q %+v", out, l)
	}
	// The session claimed before the change keeps its sandbox and shows drift.
	_, l1 := run(t, r2, "task:1", "true")
	if l1.Sandbox != claimed.Sandbox || !l1.Drift {
		t.Fatalf("old session: %+v, want its member with drift", l1)
	}
}

func TestPoolMaxIdleAndClaimClock(t *testing.T) {
	e := newEnv(t, poolRules)
	clk := newClock()
	r := e.openClock(clk)
	fill(t, r)
	first := readyMembers(poolOf(t, r, "task:*"))
	clk.Advance(20 * time.Minute)
	fill(t, r)
	if got := readyMembers(poolOf(t, r, "task:*")); strings.Join(got, " ") != strings.Join(first, " ") {
		t.Fatalf("members replaced before max_idle: %v → %v", first, got)
	}
	// max_idle (30m) replaces both once they have waited 50 minutes.
	clk.Advance(30 * time.Minute)
	fill(t, r)
	second := readyMembers(poolOf(t, r, "task:*"))
	for _, m := range second {
		if m == first[0] || m == first[1] {
			t.Fatalf("member %s older than max_idle kept", m)
		}
	}
	// max_age (1h) counts from the claim, not from the member's creation.
	clk.Advance(25 * time.Minute) // members 25 min old: within max_idle
	_, l := run(t, r, "task:1", "true")
	if !l.Pooled {
		t.Fatalf("%+v", l)
	}
	clk.Advance(45 * time.Minute) // 70 minutes after the member was made, 45 after the claim
	_, l2 := run(t, r, "task:1", "true")
	if l2.Sandbox != l.Sandbox || l2.Recreated {
		t.Fatalf("max_age counted from the member's creation: %+v", l2)
	}
	a := actionFor(t, prune(t, r, true), l.Sandbox)
	if a.Action != PruneKeep {
		t.Fatalf("prune 45 minutes after the claim: %+v", a)
	}
	clk.Advance(20 * time.Minute) // 65 minutes after the claim
	_, l3 := run(t, r, "task:1", "true")
	if !l3.Recreated || l3.Sandbox == l.Sandbox {
		t.Fatalf("past max_age from the claim: %+v, want a new sandbox", l3)
	}
}

func TestPoolStopStartKeepsMember(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	fill(t, r)
	_, l := run(t, r, "task:1", "touch", "kept")
	if err := r.StopSession(context.Background(), "task:1"); err != nil {
		t.Fatal(err)
	}
	_, l2 := run(t, r, "task:1", "test", "-e", "kept")
	if l2.Sandbox != l.Sandbox || l2.Created || !l2.Pooled {
		t.Fatalf("after stop: %+v, want the same member started again", l2)
	}
	// Removed behind berth's back: the next call claims another member and says so.
	b, err := r.Backend(context.Background(), "local")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.StopSession(context.Background(), "task:1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(context.Background(), l.Sandbox); err != nil {
		t.Fatal(err)
	}
	_, l3 := run(t, r, "task:1", "true")
	if !l3.Recreated || l3.Sandbox == l.Sandbox || !l3.Pooled {
		t.Fatalf("after removal outside berth: %+v", l3)
	}
	// Once more with the pool empty: a sandbox of the session's own, and the
	// notice says so.
	if err := r.StopSession(context.Background(), "task:1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(context.Background(), l3.Sandbox); err != nil {
		t.Fatal(err)
	}
	_, l4 := run(t, r, "task:1", "true")
	if !l4.Recreated || l4.Pooled || l4.Moved || l4.Sandbox != config.SandboxName(mustOwner(t, r), "task:1") {
		t.Fatalf("gone member, empty pool: %+v", l4)
	}
}

func TestPruneRemovesUnknownMembers(t *testing.T) {
	e := newEnv(t, poolRules)
	clk := newClock()
	r, err := e.openWith(nil, WithClock(clk.Now), WithOrphanGrace(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	owner := mustOwner(t, r)
	rule, _, _ := r.cfg.Match("task:x")
	// A member whose entry its berth never wrote, as a crash would leave it.
	spec := rule.MemberSpec(owner, "00000000000000aa")
	spec.Labels[backend.LabelCreated] = clk.Now().Format(time.RFC3339)
	b, err := r.Backend(context.Background(), "local")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Create(context.Background(), backend.CreateRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	if a := actionFor(t, prune(t, r, false), spec.Name); a.Action != PruneKeep || a.Cause != CauseGrace {
		t.Fatalf("young unknown member: %+v", a)
	}
	// A member claimed by an earlier berth (claim, then record, in two
	// transactions) that died before recording the session.
	fill(t, r)
	m := readyMembers(poolOf(t, r, "task:*"))[0]
	if err := r.store.update(func(tx *bolt.Tx) error {
		b, e, found, err := getPool(tx, "local", m)
		if err != nil || !found {
			return fmt.Errorf("entry of %s: found %v, %v", m, found, err)
		}
		e.Claimed, e.Session = clk.Now().UTC(), "task:lost"
		return putPool(b, e)
	}); err != nil {
		t.Fatal(err)
	}
	if a := actionFor(t, prune(t, r, false), m); a.Action != PruneKeep || a.Cause != CausePool {
		t.Fatalf("member being claimed: %+v", a)
	}
	clk.Advance(11 * time.Minute)
	rep := prune(t, r, false)
	for _, name := range []string{spec.Name, m} {
		if a := actionFor(t, rep, name); a.Action != PruneRemove || a.Cause != CauseOrphan || !a.Done {
			t.Fatalf("%s past the grace period: %+v", name, a)
		}
	}
	if p := poolOf(t, r, "task:*"); p.Claiming != 0 || p.Ready != 1 {
		t.Fatalf("pool after prune: %+v", p)
	}
	if _, err := os.Stat(filepath.Join(e.driverDir(m))); !os.IsNotExist(err) {
		t.Fatalf("removed member's sandbox remains: %v", err)
	}
}

func TestPoolSchemaRaised(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	run(t, r, "main", "true")
	fill(t, r)
	v := ""
	if err := r.store.view(func(tx *bolt.Tx) error {
		v = string(tx.Bucket(bucketMeta).Get(keySchema))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if v != "2" {
		t.Fatalf("schema %q after a pool write, want 2", v)
	}
}

// A config whose rules lose their pool blocks drains the members the earlier one
// made, although no rule has a pool to fill.
func TestPoolBlockRemovedDrains(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	fill(t, r)
	old := readyMembers(poolOf(t, r, "task:*"))
	if len(old) != 2 {
		t.Fatalf("members %v", old)
	}
	r.Close()
	e.writeConfig("scope \"task:*\" {\n}\nscope \"*\" {\n}\n")
	r2 := e.open()
	ps, err := r2.Pools(context.Background())
	if err != nil || len(ps) != 1 || ps[0].Size != 0 || ps[0].Draining != 2 {
		t.Fatalf("before the round: %+v %v, want the 2 members draining", ps, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		r2.RunPools(ctx, time.Hour)
		close(done)
	}()
	<-done // returns after its one round: no rule has a pool
	cancel()
	if ps, err := r2.Pools(context.Background()); err != nil || len(ps) != 0 {
		t.Fatalf("after the round: %+v %v, want no pool", ps, err)
	}
	for _, m := range old {
		if _, err := os.Stat(e.driverDir(m)); !os.IsNotExist(err) {
			t.Fatalf("member %s still exists (%v)", m, err)
		}
	}
}

// An entry still being made by a berth that died (its maker's lock is free) is
// stale at once: the next fill drops it and fills the pool to its size, instead of
// counting it for the grace period. One whose maker lives is left alone.
func TestPoolDeadMakerEntry(t *testing.T) {
	e := newEnv(t, poolRules)
	r := e.open()
	owner := mustOwner(t, r)
	rule, _, _ := r.cfg.Match("task:x")
	reserve := func(id, maker string) string {
		spec := rule.MemberSpec(owner, id)
		ok, err := r.store.poolReserve(poolEntry{Driver: "local", Sandbox: spec.Name, ID: id, Scope: rule.Glob,
			Hash: rule.PoolHash(owner), Created: time.Now().UTC(), Maker: maker}, 2)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		return spec.Name
	}
	dead := reserve("00000000000000d1", "deadbeefdeadbeef")
	held, ok, err := flock.TryLock(r.makerLockPath("a1a1a1a1a1a1a1a1"))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	defer held.Unlock(true)
	alive := reserve("00000000000000a1", "a1a1a1a1a1a1a1a1")
	fill(t, r)
	p := poolOf(t, r, "task:*")
	states := map[string]string{}
	for _, m := range p.Members {
		states[m.Sandbox] = m.State
	}
	if _, ok := states[dead]; ok {
		t.Fatalf("the dead maker's entry is still there: %+v", p)
	}
	if states[alive] != "creating" || p.Ready != 1 {
		t.Fatalf("pool %+v: want the live maker's entry kept (creating) and one ready member", p)
	}
	if _, err := os.Stat(r.makerLockPath("deadbeefdeadbeef")); !os.IsNotExist(err) {
		t.Fatalf("the dead maker's lock file remains: %v", err)
	}
}

// A claim's refill waits for its call to end, but not for a call that runs on: the
// pool is refilled while the claiming command still runs (after PoolRefillDelay),
// and again after a call that ends at once.
func TestPoolRefillDuringLongCall(t *testing.T) {
	e := newEnv(t, "scope \"task:*\" {\n  pool {\n    size = 1\n  }\n}\nscope \"*\" {\n}\n")
	r := e.open()
	fill(t, r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		r.RunPools(ctx, time.Hour) // only claims wake it
		close(done)
	}()
	defer func() { cancel(); <-done }()
	// Its first round (which finds the pool full) is over: from here only the
	// claims below can make it fill.
	testwait.Until(t, "RunPools's first round", func() bool { return r.poolRounds.Load() >= 1 })

	fifo := filepath.Join(t.TempDir(), "hold")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	p, lease, err := r.Exec(context.Background(), "task:long", backend.ExecRequest{Argv: []string{"cat", fifo}})
	if err != nil {
		t.Fatal(err)
	}
	if !lease.Pooled {
		t.Fatalf("the long call did not claim: %+v", lease)
	}
	testwait.Until(t, "a new member while the claiming call still runs", func() bool {
		ps := poolOf(t, r, "task:*")
		return ps.Ready == 1 && !slices.Contains(readyMembers(ps), lease.Sandbox)
	})
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close() // cat reads EOF and ends
	if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
		t.Fatalf("the long call: %+v, %v", res, err)
	}

	_, short := run(t, r, "task:short", "true")
	if !short.Pooled {
		t.Fatalf("the short call did not claim: %+v", short)
	}
	testwait.Until(t, "a new member after the short call", func() bool {
		ps := poolOf(t, r, "task:*")
		return ps.Ready == 1 && !slices.Contains(readyMembers(ps), short.Sandbox)
	})
}
