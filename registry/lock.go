package registry

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// fileLock is an exclusive flock on a lock file. flock locks belong to the open file
// description, so two opens of the same path in one process exclude each other just
// as two processes do; the lock dies with the process that holds it.
type fileLock struct {
	f    *os.File
	path string
}

func flockRetry(fd int, how int) error {
	for {
		err := unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// lockFile takes an exclusive lock on path (creating it), waiting until ctx is done.
// After locking it checks that path still names the locked file (a holder may have
// removed it with unlock(true)) and starts over if not.
func lockFile(ctx context.Context, path string) (*fileLock, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening lock file %s: %w", path, err)
		}
		fd := int(f.Fd())
		err = flockRetry(fd, unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			done := make(chan error, 1)
			go func() { done <- flockRetry(fd, unix.LOCK_EX) }()
			select {
			case err = <-done:
			case <-ctx.Done():
				go func() { <-done; release(f) }()
				return nil, fmt.Errorf("waiting for lock %s: %w", path, ctx.Err())
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		var held, named unix.Stat_t
		if err := unix.Fstat(fd, &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if err := unix.Stat(path, &named); err != nil || named.Ino != held.Ino || named.Dev != held.Dev {
			release(f) // removed or replaced while we waited: lock the new file
			continue
		}
		return &fileLock{f: f, path: path}, nil
	}
}

// unlock releases the lock; with remove it first deletes the lock file (safe: waiters
// notice and lock the path afresh).
//
// The lock is released with LOCK_UN before the file is closed: a flock belongs to the
// open file description, and a child that another goroutine is forking at this moment
// holds a copy of the descriptor until it execs (O_CLOEXEC acts only then), so a
// close alone could leave the lock held for that long.
func (l *fileLock) unlock(remove bool) {
	if remove {
		os.Remove(l.path)
	}
	release(l.f)
}

// release unlocks f's flock, if it holds one, and closes f (see fileLock.unlock).
func release(f *os.File) {
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	f.Close()
}

// holdBusy takes a shared flock on path (creating it) and returns it; it marks a
// sandbox as having an exec in flight for as long as it is held. Callers hold the
// sandbox's create lock (lockFile), under which alone busy files are checked and
// deleted, so the shared lock is never contended and the file is never swapped.
//
// created reports whether this call made the file: a caller whose exec then fails
// to start deletes it again with unlock(true) (still under the create lock, so no
// other exec holds it), leaving the state dir as it was.
func holdBusy(path string) (l *fileLock, created bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	created = err == nil
	if errors.Is(err, os.ErrExist) {
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	}
	if err != nil {
		return nil, false, fmt.Errorf("opening busy marker %s: %w", path, err)
	}
	if err := flockRetry(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		if created {
			os.Remove(path)
		}
		return nil, false, fmt.Errorf("locking busy marker %s: %w", path, err)
	}
	return &fileLock{f: f, path: path}, created, nil
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
	err = flockRetry(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking busy marker %s: %w", path, err)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN) // at once, not at close (see fileLock.unlock)
	return false, nil
}

// tryLockFile is lockFile without waiting: ok is false when another holder has the
// lock (or the path was replaced meanwhile).
func tryLockFile(path string) (l *fileLock, ok bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("opening lock file %s: %w", path, err)
	}
	fd := int(f.Fd())
	if err := flockRetry(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("locking %s: %w", path, err)
	}
	var held, named unix.Stat_t
	if unix.Fstat(fd, &held) != nil || unix.Stat(path, &named) != nil || named.Ino != held.Ino || named.Dev != held.Dev {
		release(f)
		return nil, false, nil
	}
	return &fileLock{f: f, path: path}, true, nil
}
