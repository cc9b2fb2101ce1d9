package testimage

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
)

// StateDirMount is a mount source that exposes berth's state dir, and what a driver's
// refusal of it must say.
type StateDirMount struct {
	// Source is the mount's host path.
	Source string
	// Words must be in the error (it names the state dir and how the source relates
	// to it).
	Words string
}

// StateDirMounts returns the mounts of the state dir state that a container driver
// must refuse (internal/hostpaths' policy): its parent, the dir itself, a dir in it,
// and socketDir, a sandbox's agent socket dir inside it.
func StateDirMounts(state, socketDir string) []StateDirMount {
	return []StateDirMount{
		{filepath.Dir(state), "contains berth's state dir " + state},
		{state, "is berth's state dir " + state},
		{filepath.Join(state, "agent"), "lies inside berth's state dir " + state},
		{socketDir, "lies inside berth's state dir"},
	}
}

// CheckMountRefused fails t unless err, Create's error for a sandbox mounting m.Source,
// is ErrInvalid saying m.Words and naming allow_host_paths.
func CheckMountRefused(t testing.TB, m StateDirMount, err error) {
	t.Helper()
	if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), m.Words) || !strings.Contains(err.Error(), "allow_host_paths = true") {
		t.Errorf("Create with a mount of %s: %v, want ErrInvalid saying %q", m.Source, err, m.Words)
	}
}
