package registry

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sh/berth/backend"
)

// pullingDriver is the fixture driver plus an ImagePuller that records its calls and
// fails for images named "missing:*".
type pullingDriver struct {
	*hostDriver
	mu    sync.Mutex
	pulls []string // "IMAGE POLICY"
}

func (d *pullingDriver) PullImage(_ context.Context, ref string, policy backend.PullPolicy, progress func(backend.PullProgress)) error {
	d.mu.Lock()
	d.pulls = append(d.pulls, ref+" "+string(policy))
	d.mu.Unlock()
	if strings.HasPrefix(ref, "missing:") {
		return backend.Errorf(backend.ErrNotFound, "no image %s in the registry", ref)
	}
	if progress != nil {
		progress(backend.PullProgress{Layer: "l1", Status: "Downloading", Current: 5, Total: 10})
		progress(backend.PullProgress{Layer: "l1", Status: "Pull complete"})
	}
	return nil
}

func TestPullBeforeCreate(t *testing.T) {
	e := newEnv(t, `
scope "img:*" {
  image = "tool:1"
  pull  = "always"
}
scope "dflt:*" {
  image = "tool:2"
}
scope "missing:*" {
  image = "missing:1"
}
scope "*" {
}
`)
	d := &pullingDriver{hostDriver: &hostDriver{}}
	var events []PullEvent
	r, err := e.openWith(nil,
		WithDriver("local", func() backend.TerminalBackend { return d }),
		WithPullProgress(func(ev PullEvent) { events = append(events, ev) }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()

	if _, err := r.Acquire(ctx, "img:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Acquire(ctx, "img:1"); err != nil { // exists: adopted, no pull
		t.Fatal(err)
	}
	if _, err := r.Acquire(ctx, "dflt:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Acquire(ctx, "main"); err != nil { // no image: no pull
		t.Fatal(err)
	}
	if got, want := strings.Join(d.pulls, ","), "tool:1 always,tool:2 missing"; got != want {
		t.Errorf("pulls %q, want %q (one per created sandbox with an image, by the rule's policy)", got, want)
	}
	if len(events) != 4 || events[0] != (PullEvent{Session: "img:1", Driver: "local", Image: "tool:1",
		PullProgress: backend.PullProgress{Layer: "l1", Status: "Downloading", Current: 5, Total: 10}}) {
		t.Errorf("pull events %+v", events)
	}

	sbs, hash := e.sandboxes(), e.storeHash()
	_, err = r.Acquire(ctx, "missing:1")
	if !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), `image missing:1`) || !strings.Contains(err.Error(), `pull = "missing"`) {
		t.Errorf("a failed pull: %v, want ErrNotFound naming the image and the policy", err)
	}
	if len(e.sandboxes()) != len(sbs) || e.storeHash() != hash {
		t.Errorf("a failed pull left a sandbox or changed the store")
	}
}
