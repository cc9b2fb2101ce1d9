package conformance

import (
	"context"
	"sync"

	"github.com/berth-sh/berth/backend"
)

func idempotenceCases() []Case {
	g := "idempotence"
	return []Case{
		{Group: g, Name: "create-twice-adopts", Run: caseCreateTwiceAdopts},
		{Group: g, Name: "concurrent-create-one-sandbox", Run: caseConcurrentCreate},
	}
}

// A second Create of the same name adopts the running sandbox: Adopted, same ID, and
// it is not restarted (a background process lives on).
func caseCreateTwiceAdopts(t T, h *Harness) {
	spec := h.Spec(t, SandboxName())
	first, err := h.Create(t, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.Name, err)
	}
	if first.Adopted {
		t.Errorf("first Create reported Adopted")
	}
	mark := newMarker()
	if out, err := h.exec(t, spec.Name, backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 & echo started"}, Env: []string{mark}}); err != nil || out.Stdout != "started\n" {
		t.Fatalf("starting a background sleep: %v %s", err, out.describe())
	}
	second, err := h.Create(t, spec)
	if err != nil {
		t.Fatalf("second Create(%s): %v", spec.Name, err)
	}
	if !second.Adopted || second.ID != first.ID || second.Name != spec.Name || second.State != backend.StateRunning {
		t.Errorf("second Create: adopted %v id %q name %q state %q, want true %q %q running", second.Adopted, second.ID, second.Name, second.State, first.ID, spec.Name)
	}
	if ps := h.markedAlive(t, spec.Name, mark); len(ps) == 0 {
		t.Errorf("the background sleep started before the second Create is gone: adopting restarted the sandbox")
	}
	if sbs := h.list(t, map[string]string{RunLabel: h.RunID, backend.LabelSpecHash: spec.Labels[backend.LabelSpecHash]}); len(sbs) != 1 {
		t.Errorf("List after two Creates of one name: %v, want exactly one sandbox", names(sbs))
	}
}

// concurrentCreates is how many goroutines create the same sandbox at once.
const concurrentCreates = 8

// Concurrent Creates of one name yield one sandbox: every call succeeds with the same
// ID and exactly one of them created it.
func caseConcurrentCreate(t T, h *Harness) {
	spec := h.Spec(t, SandboxName())
	files, err := h.AgentFiles(h.Options.StateDir, spec.Name)
	if err != nil {
		t.Fatalf("preparing agent files: %v", err)
	}
	h.removeOnCleanup(t, spec.Name)

	ctx, cancel := context.WithTimeout(t.Context(), createTimeout)
	defer cancel()
	var wg sync.WaitGroup
	results := make([]backend.Sandbox, concurrentCreates)
	errs := make([]error, concurrentCreates)
	start := make(chan struct{})
	for i := range concurrentCreates {
		wg.Go(func() {
			<-start
			results[i], errs[i] = h.Backend.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files})
		})
	}
	close(start)
	wg.Wait()

	created := 0
	var id string
	for i := range concurrentCreates {
		if errs[i] != nil {
			t.Errorf("Create #%d: %v", i, errs[i])
			continue
		}
		r := results[i]
		if !r.Adopted {
			created++
		}
		if id == "" {
			id = r.ID
		} else if r.ID != id {
			t.Errorf("Create #%d returned ID %q, another returned %q", i, r.ID, id)
		}
		if r.State != backend.StateRunning {
			t.Errorf("Create #%d returned state %q, want running", i, r.State)
		}
	}
	if created != 1 && !t.Failed() {
		t.Errorf("%d of %d concurrent Creates reported creating the sandbox (Adopted false), want exactly 1", created, concurrentCreates)
	}
	if sbs := h.list(t, map[string]string{RunLabel: h.RunID, backend.LabelSpecHash: spec.Labels[backend.LabelSpecHash]}); len(sbs) != 1 {
		t.Errorf("List after concurrent Creates: %v, want exactly one sandbox", names(sbs))
	}
	if out := h.run(t, spec.Name, "sh", "-c", "echo ok"); out.ExitCode != 0 || out.Stdout != "ok\n" {
		t.Errorf("exec after concurrent Creates: %s", out.describe())
	}
}
