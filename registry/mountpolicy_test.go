package registry

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/hostpaths"
)

// A rule that mounts a directory holding berth's state dir is refused before any
// driver sees it, whatever the driver, with the rule's position and what
// allow_host_paths would grant; with allow_host_paths = true the sandbox is made.
// Mounts elsewhere are the driver's business.
func TestMountPolicyBeforeCreate(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "")
	parent := filepath.Dir(e.stateDir) // holds the state dir
	other := t.TempDir()
	e.writeConfig(fmt.Sprintf(`scope "safe" {
  mount {
    source = %q
    target = "/data"
  }
}

scope "bad:*" {
  mount {
    source = %q
    target = "/home"
    read_only = true
  }
}

scope "inside" {
  mount {
    source = %q
    target = "/s"
  }
}

scope "allowed" {
  allow_host_paths = true
  mount {
    source = %q
    target = "/home"
  }
}
`, other, parent, filepath.Join(e.stateDir, "sandboxes"), parent))
	r := e.open()

	for _, c := range []struct{ session, pos, rel string }{
		{"bad:1", e.config + ":8:1", "contains berth's state dir " + e.stateDir},
		{"inside", e.config + ":16:1", "lies inside berth's state dir " + e.stateDir},
	} {
		_, err := r.Acquire(ctx, c.session)
		var cerr *config.Error
		if !errors.As(err, &cerr) || !errors.Is(err, backend.ErrInvalid) {
			t.Fatalf("Acquire(%s) with a mount of the state dir: %v, want a *config.Error", c.session, err)
		}
		for _, words := range []string{c.pos, c.rel, "agent socket of every sandbox", "on the host", "allow_host_paths = true"} {
			if !strings.Contains(err.Error(), words) {
				t.Errorf("Acquire(%s): %v\nwant it to say %q", c.session, err, words)
			}
		}
	}
	if got := e.creates(); len(got) != 0 {
		t.Errorf("sandboxes created for refused rules: %v", got)
	}
	for _, s := range []string{"safe", "allowed"} {
		if _, err := r.Acquire(ctx, s); err != nil {
			t.Errorf("Acquire(%s): %v", s, err)
		}
	}
	if got := e.creates(); len(got) != 2 {
		t.Errorf("creates %v, want the safe and the allowed sandbox", got)
	}
	if !hostpaths.IsStateDir(e.stateDir) {
		t.Errorf("the state dir %s carries no marker after first use", e.stateDir)
	}

	// CheckMounts (config check) says the same, once per refused mount, and warns
	// about the allowed one.
	warnings, err := CheckMounts(r.Config(), e.stateDir)
	var cerr *config.Error
	if !errors.As(err, &cerr) || len(cerr.Diagnostics) != 2 {
		t.Errorf("CheckMounts: %v, want two diagnostics", err)
	}
	if s := config.FormatDiagnostics(warnings); len(warnings) != 1 || !strings.Contains(s, e.config+":23:1: warning:") || !strings.Contains(s, "allow_host_paths = true accepts this") {
		t.Errorf("CheckMounts warnings: %s", s)
	}
}

// The registry reads no environment for its state dir (WithStateDir sets it), yet
// its mount policy still protects the host's other berth state dirs, such as the
// invoking user's default one, which internal/hostpaths finds from the host.
func TestMountPolicyProtectsHostStateDirs(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv(config.EnvStateDir, "")
	e := newEnv(t, "")
	e.writeConfig(fmt.Sprintf("scope \"*\" {\n  mount {\n    source = %q\n    target = \"/home\"\n  }\n}\n", home))
	r := e.open()
	_, err := r.Acquire(context.Background(), "s")
	if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "contains the default berth state dir of the invoking user "+filepath.Join(home, ".local", "state", "berth")) {
		t.Errorf("Acquire with a mount of $HOME: %v, want refused for the invoking user's default state dir", err)
	}
	if got := e.creates(); len(got) != 0 {
		t.Errorf("sandboxes created: %v", got)
	}
}
