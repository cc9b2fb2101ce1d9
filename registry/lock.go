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
				go func() { <-done; f.Close() }()
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
			f.Close() // removed or replaced while we waited: lock the new file
			continue
		}
		return &fileLock{f: f, path: path}, nil
	}
}

// unlock releases the lock; with remove it first deletes the lock file (safe: waiters
// notice and lock the path afresh).
func (l *fileLock) unlock(remove bool) {
	if remove {
		os.Remove(l.path)
	}
	l.f.Close()
}
