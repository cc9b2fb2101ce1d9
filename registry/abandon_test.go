package registry_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
)

// runtimeFinishes is a driver whose runtime finishes a create that its client gave
// up on, as dockerd does with a container whose API request was cancelled: Create
// runs the local driver's Create to its end whatever ctx says, and then returns
// ctx's error when ctx ended meanwhile. onCreate, when set, runs as Create begins.
type runtimeFinishes struct {
	*local.Driver
	onCreate atomic.Pointer[func()]
}

func (d *runtimeFinishes) Create(ctx context.Context, req backend.CreateRequest) (backend.Sandbox, error) {
	if f := d.onCreate.Load(); f != nil {
		(*f)()
	}
	sb, err := d.Driver.Create(context.WithoutCancel(ctx), req)
	if err == nil && ctx.Err() != nil {
		return backend.Sandbox{}, ctx.Err()
	}
	return sb, err
}

// A new session's first exec that its caller abandons at any phase of the create
// (as Create begins, when it has returned, once the agent answers, once the command
// started) leaves no sandbox without its host dir; the next exec works, in the same
// sandbox name, and RemoveSession leaves neither sandbox nor host dir. Before creates
// ran detached, the abandon at Create's start left the local sandbox's agent running
// with its host dir (token, socket) deleted, and every later exec failed.
func TestAbandonedFirstExecFinishesOrUndoes(t *testing.T) {
	state := t.TempDir()
	drv := &runtimeFinishes{Driver: local.New(local.WithStateDir(filepath.Join(state, "drivers", "local")))}
	t.Cleanup(func() { drv.Driver.Close() })
	ctx := t.Context()
	r, err := registry.Open(ctx, nil, registry.WithStateDir(state),
		registry.WithDriver(local.Name, func() backend.TerminalBackend { return drv }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })

	for _, point := range []string{"create-start", "create-done", "agent-ready", "started"} {
		t.Run(point, func(t *testing.T) {
			session := "abandon:" + point
			ex, err := r.Explain(session)
			if err != nil {
				t.Fatal(err)
			}
			name, dir := ex.Sandbox, filepath.Join(state, "sandboxes", local.Name, ex.Sandbox)
			t.Cleanup(func() { r.RemoveSession(context.Background(), session) })

			callCtx, abandon := context.WithCancel(ctx)
			defer abandon()
			tr := &registry.CallTrace{}
			switch point {
			case "create-start":
				f := func() { abandon() }
				drv.onCreate.Store(&f)
				defer drv.onCreate.Store(nil)
			case "create-done":
				tr.CreateDone = func(string, string, error) { abandon() }
			case "agent-ready":
				tr.AgentReady = func(string, string) { abandon() }
			case "started":
				tr.Started = func(string, string) { abandon() }
			}
			var out testwait.Buffer
			p, _, err := r.Exec(registry.WithCallTrace(callCtx, tr), session, backend.ExecRequest{Argv: []string{"sh", "-c", "echo first; exec sleep 600"}, Stdout: &out})
			if err == nil {
				abandon()
				p.Wait()
			}
			drv.onCreate.Store(nil)

			_, ierr := drv.Inspect(ctx, name)
			_, derr := os.Stat(dir)
			if ierr == nil && derr != nil {
				t.Fatalf("abandoned at %s: sandbox %s is there but its host dir %s is gone (%v)", point, name, dir, derr)
			}

			var second testwait.Buffer
			p, lease, err := r.Exec(ctx, session, backend.ExecRequest{Argv: []string{"echo", "second"}, Stdout: &second})
			if err != nil {
				t.Fatalf("abandoned at %s: the next exec: %v", point, err)
			}
			if res, err := p.Wait(); err != nil || res.ExitCode != 0 || second.String() != "second\n" || lease.Sandbox != name {
				t.Fatalf("abandoned at %s: the next exec: %+v %v %q in %s", point, res, err, second.String(), lease.Sandbox)
			}
			if err := r.RemoveSession(ctx, session); err != nil {
				t.Fatal(err)
			}
			if _, err := drv.Inspect(ctx, name); !errors.Is(err, backend.ErrNotFound) {
				t.Errorf("after RemoveSession the sandbox is there: %v", err)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("after RemoveSession the host dir is there: %v", err)
			}
		})
	}
}

// failsAfter is a driver whose Create makes the sandbox (the local driver's Create)
// and then fails all the same, as a plugin that crashes before it answers, or a
// runtime that answers with an error after it made the container: with failCreate
// set every Create does; with failAdopt set only a Create that adopts does (as the
// docker driver's Create fails when the running container's agent refuses the host
// dir's token).
type failsAfter struct {
	*local.Driver
	failCreate, failAdopt atomic.Bool
}

func (d *failsAfter) Create(ctx context.Context, req backend.CreateRequest) (backend.Sandbox, error) {
	sb, err := d.Driver.Create(ctx, req)
	if err == nil && (d.failCreate.Load() || d.failAdopt.Load() && sb.Adopted) {
		return backend.Sandbox{}, backend.Errorf(backend.ErrUnavailable, "the answer to the create of %s was lost", req.Spec.Name)
	}
	return sb, err
}

// A Create that fails after the driver made the sandbox leaves nothing: the sandbox
// is removed before its host dir goes (before, the dir went and the sandbox stayed,
// unreachable). An unrecorded sandbox that a Create fails to adopt is removed and
// made anew in the same call, which says so.
func TestFailedCreateClearsWhatItMade(t *testing.T) {
	state := t.TempDir()
	drv := &failsAfter{Driver: local.New(local.WithStateDir(filepath.Join(state, "drivers", "local")))}
	ctx := t.Context()
	r, err := registry.Open(ctx, nil, registry.WithStateDir(state),
		registry.WithDriver(local.Name, func() backend.TerminalBackend { return drv }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ex, err := r.Explain("lost:1")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "sandboxes", local.Name, ex.Sandbox)
	t.Cleanup(func() { drv.Driver.Remove(context.Background(), ex.Sandbox) })

	drv.failCreate.Store(true)
	if _, err := r.Acquire(ctx, "lost:1"); err == nil || !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("Acquire with a Create that fails after making the sandbox: %v, want ErrUnavailable", err)
	}
	drv.failCreate.Store(false)
	if _, err := drv.Inspect(ctx, ex.Sandbox); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("the failed create left sandbox %s: %v", ex.Sandbox, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed create left its host dir: %v", err)
	}

	// An unrecorded sandbox of ours that cannot be adopted.
	files, err := r.PrepareAgent(local.Name, ex.Sandbox)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Driver.Create(ctx, backend.CreateRequest{Spec: ex.Spec, Agent: files}); err != nil {
		t.Fatal(err)
	}
	drv.failAdopt.Store(true)
	lease, err := r.Acquire(ctx, "lost:1")
	if err != nil {
		t.Fatalf("Acquire of a session whose unrecorded sandbox cannot be adopted: %v", err)
	}
	if !lease.Created || !lease.Recreated || lease.RecreatedReason == "" {
		t.Errorf("lease %+v, want a new sandbox with a Recreated notice", lease)
	}
	if err := r.RemoveSession(ctx, "lost:1"); err != nil {
		t.Fatal(err)
	}
}
