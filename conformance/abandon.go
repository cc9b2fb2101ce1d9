package conformance

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/registry"
)

// abandonCases are the cases of a create that its caller abandons (a client of berth
// serve that goes away during a new session's first exec, a cancelled context): it is
// finished or undone as one unit, never left half (a sandbox whose host-side files,
// the agent's token and socket dir, are gone), and whatever an earlier berth left so
// is recovered by the next call and removed by berth rm.
func abandonCases() []Case {
	g := "recovery"
	reg := "a registry opened by RegistryOpener (Options.OpenRegistry)"
	return []Case{
		{Group: g, Name: "abandoned-first-exec", Requires: reg, Run: caseAbandonedFirstExec},
		{Group: g, Name: "stranded-sandbox-recreated", Requires: reg + ", Capabilities.Agent", Needs: needAgent, Run: caseStrandedRecreated},
		{Group: g, Name: "rm-unrecorded-sandbox", Requires: reg, Run: caseRemoveUnrecorded},
	}
}

// abandonPoints are the moments at which caseAbandonedFirstExec cancels the context
// of a new session's first exec, each ordered by an event of the call (a
// registry.CallTrace hook) or of the runtime (the sandbox shows up in the driver's
// Inspect while the driver's Create runs).
var abandonPoints = []string{"create-start", "mid-create", "create-done", "agent-ready", "started"}

// A new session's first exec whose caller goes away at any of abandonPoints leaves
// either nothing or a whole sandbox (never one without its host dir), the next exec
// of the session works, and berth rm then leaves neither sandbox nor host dir.
func caseAbandonedFirstExec(t T, h *Harness) {
	id := randHex(4)
	r, _ := h.retentionRegistry(t, id)
	for _, point := range abandonPoints {
		session := "conf-keep-" + id + ":" + point
		removeSessionOnCleanup(t, r, session)
		name := explain(t, r, session).Name
		b := h.registryDriver(t, r)
		abandonFirstExec(t, r, b, session, name, point)
		h.checkWhole(t, r, b, name, "after the first exec of session "+session+" was abandoned at "+point)
		out, lease := regExec(t, r, session, "echo second")
		if out != "second\n" || lease.Sandbox != name {
			t.Fatalf("abandoned at %s: the next exec of session %s said %q in sandbox %s, want \"second\" in %s", point, session, out, lease.Sandbox, name)
		}
		h.checkWhole(t, r, b, name, "after the next exec of session "+session)
		h.removeAndCheck(t, r, b, session, name)
	}
}

// abandonFirstExec runs session's first exec and cancels its context at point.
func abandonFirstExec(t T, r *registry.Registry, b backend.TerminalBackend, session, name, point string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	callCtx, abandon := context.WithCancel(ctx)
	defer abandon()
	var watch sync.WaitGroup
	defer watch.Wait()
	callDone := make(chan struct{})
	defer close(callDone)
	tr := &registry.CallTrace{}
	switch point {
	case "create-start":
		tr.CreateStart = func(string, string) { abandon() }
	case "mid-create":
		// Cancelled as soon as the runtime has the sandbox, while Create still
		// runs (it waits for the agent then), or when the call ends.
		tr.CreateStart = func(string, string) {
			watch.Add(1)
			go func() {
				defer watch.Done()
				wctx, stop := context.WithCancel(ctx)
				defer stop()
				go func() {
					select {
					case <-callDone:
						stop()
					case <-wctx.Done():
					}
				}()
				testwait.For(wctx, testwait.Limit, func() bool {
					ictx, icancel := context.WithTimeout(wctx, callTimeout)
					defer icancel()
					_, err := b.Inspect(ictx, name)
					return err == nil
				})
				abandon()
			}()
		}
	case "create-done":
		tr.CreateDone = func(string, string, error) { abandon() }
	case "agent-ready":
		tr.AgentReady = func(string, string) { abandon() }
	case "started":
		tr.Started = func(string, string) { abandon() }
	}
	var stdout, stderr testwait.Buffer
	p, _, err := r.Exec(registry.WithCallTrace(callCtx, tr), session, backend.ExecRequest{
		Argv: []string{"sh", "-c", "echo first; exec sleep 600"}, Stdout: &stdout, Stderr: &stderr})
	if err == nil {
		abandon() // the exec started before the cancel reached it: end it now
		p.Wait()
	}
}

// registryDriver returns the registry's driver under test.
func (h *Harness) registryDriver(t T, r *registry.Registry) backend.TerminalBackend {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	b, err := r.Backend(ctx, h.Info.Name)
	if err != nil {
		t.Fatalf("the registry's driver %s: %v", h.Info.Name, err)
	}
	return b
}

// hostDir is the host dir that r keeps for sandbox name on the driver under test
// (the agent's token and socket dir).
func (h *Harness) hostDir(r *registry.Registry, name string) string {
	return filepath.Join(r.StateDir(), "sandboxes", h.Info.Name, name)
}

// checkWhole fails when the driver holds sandbox name while its host dir is gone
// (for drivers with berth's agent: nothing could reach it).
func (h *Harness) checkWhole(t T, r *registry.Registry, b backend.TerminalBackend, name, when string) {
	t.Helper()
	if !h.Info.Capabilities.HasAgent() {
		return
	}
	state := sandboxState(t, b, name)
	_, err := os.Stat(h.hostDir(r, name))
	if state != "missing" && err != nil {
		t.Fatalf("%s: the driver holds sandbox %s (%s) but its host dir %s is gone (%v): no call can reach its agent", when, name, state, h.hostDir(r, name), err)
	}
}

// removeAndCheck removes session and checks that neither its sandbox nor its host
// dir is left.
func (h *Harness) removeAndCheck(t T, r *registry.Registry, b backend.TerminalBackend, session, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	if err := r.RemoveSession(ctx, session); err != nil {
		t.Fatalf("RemoveSession(%s): %v", session, err)
	}
	if st := sandboxState(t, b, name); st != "missing" {
		t.Errorf("after RemoveSession(%s) the driver still holds its sandbox %s (%s)", session, name, st)
	}
	if _, err := os.Stat(h.hostDir(r, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after RemoveSession(%s) its host dir %s is left (%v)", session, h.hostDir(r, name), err)
	}
}

// A sandbox of ours whose host dir is gone (recorded or not), or whose agent holds a
// token other than its host dir's (a create that an earlier berth let go of half-way,
// then a call that made the dir anew), cannot be reached: the next exec removes it
// and makes a new one, and says so (Lease.Recreated).
func caseStrandedRecreated(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	b := h.registryDriver(t, r)
	next := func(session, name, why string) {
		t.Helper()
		out, lease := regExec(t, r, session, "echo again")
		if out != "again\n" || !lease.Recreated || lease.RecreatedReason == "" || lease.Sandbox != name {
			t.Errorf("%s: the next exec of session %s said %q (recreated %v, reason %q, sandbox %s); want \"again\" in a new %s with a notice",
				why, session, out, lease.Recreated, lease.RecreatedReason, lease.Sandbox, name)
		}
		h.removeAndCheck(t, r, b, session, name)
	}

	// Recorded, its host dir deleted.
	s := "conf-keep-" + id + ":nodir"
	removeSessionOnCleanup(t, r, s)
	_, lease := regExec(t, r, s, "echo first")
	if err := os.RemoveAll(h.hostDir(r, lease.Sandbox)); err != nil {
		t.Fatal(err)
	}
	next(s, lease.Sandbox, "a recorded sandbox whose host dir was deleted")

	// Unrecorded, its host dir deleted.
	s = "conf-keep-" + id + ":lostdir"
	removeSessionOnCleanup(t, r, s)
	spec := explain(t, r, s)
	h.plant(t, r, spec, clk.Now(), nil)
	if err := os.RemoveAll(h.hostDir(r, spec.Name)); err != nil {
		t.Fatal(err)
	}
	next(s, spec.Name, "an unrecorded sandbox whose host dir was deleted")

	// Unrecorded, its host dir made anew (another token).
	s = "conf-keep-" + id + ":rekeyed"
	removeSessionOnCleanup(t, r, s)
	spec = explain(t, r, s)
	h.plant(t, r, spec, clk.Now(), nil)
	if err := os.RemoveAll(h.hostDir(r, spec.Name)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PrepareAgent(h.Info.Name, spec.Name); err != nil {
		t.Fatal(err)
	}
	next(s, spec.Name, "an unrecorded sandbox whose host dir holds another token")
}

// berth rm of a session without a record removes the sandbox of ours that its rule
// maps it to (left by a call that was abandoned before it recorded the session) and
// its host dir; a sandbox of that name that is not ours stays.
func caseRemoveUnrecorded(t T, h *Harness) {
	id := randHex(4)
	r, clk := h.retentionRegistry(t, id)
	b := h.registryDriver(t, r)
	s := "conf-keep-" + id + ":unrecorded"
	spec := explain(t, r, s)
	h.plant(t, r, spec, clk.Now(), nil)
	h.removeAndCheck(t, r, b, s, spec.Name)

	s = "conf-keep-" + id + ":theirs"
	spec = explain(t, r, s)
	h.plant(t, r, spec, clk.Now(), func(sp *backend.SandboxSpec) { sp.Labels[backend.LabelOwner] = "conformance-other-" + id })
	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	if err := r.RemoveSession(ctx, s); err != nil {
		t.Fatalf("RemoveSession(%s) with another owner's sandbox of its name: %v", s, err)
	}
	if st := sandboxState(t, b, spec.Name); st == "missing" {
		t.Errorf("RemoveSession(%s) removed sandbox %s of another owner", s, spec.Name)
	}
}
