package registry

import (
	"errors"
	"fmt"
	"os"

	"github.com/berth-sh/berth/internal/flock"
	"golang.org/x/sys/unix"
)

// busyMarker is a shared flock on a sandbox's busy marker (holdBusy). The sandbox's
// create lock itself is a *flock.Held (flock.Lock, flock.TryLock).
type busyMarker struct {
	f    *os.File
	path string
}

// unlock releases the marker's lock (LOCK_UN before close, see flock.Release); with
// remove it first deletes the marker file. A nil marker does nothing.
func (b *busyMarker) unlock(remove bool) {
	if b == nil {
		return
	}
	if remove {
		os.Remove(b.path)
	}
	flock.Release(b.f)
}

// holdBusy takes a shared flock on path (creating it) and returns it; it marks a
// sandbox as having an exec in flight for as long as it is held. Callers hold the
// sandbox's create lock (flock.Lock), under which alone busy files are checked and
// deleted, so the shared lock is never contended and the file is never swapped.
//
// created reports whether this call made the file: a caller whose exec then fails
// to start deletes it again with unlock(true) (still under the create lock, so no
// other exec holds it), leaving the state dir as it was.
func holdBusy(path string) (l *busyMarker, created bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	created = err == nil
	if errors.Is(err, os.ErrExist) {
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	}
	if err != nil {
		return nil, false, fmt.Errorf("opening busy marker %s: %w", path, err)
	}
	if err := flock.Flock(f, unix.LOCK_SH); err != nil {
		f.Close()
		if created {
			os.Remove(path)
		}
		return nil, false, fmt.Errorf("locking busy marker %s: %w", path, err)
	}
	return &busyMarker{f: f, path: path}, created, nil
}

// isBusy reports whether any process holds a shared lock on the busy marker path
// (an exec in flight). A missing file is not busy. Call it with the sandbox's
// create lock held.
func isBusy(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("opening busy marker %s: %w", path, err)
	}
	defer f.Close()
	err = flock.Flock(f, unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking busy marker %s: %w", path, err)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN) // at once, not at close (see flock.Release)
	return false, nil
}
