// Package flock takes exclusive flock(2) locks on lock files that may be deleted while
// held.
//
// flock locks belong to the open file description, so two opens of the same path in one
// process exclude each other just as two processes do; a lock dies with the last
// descriptor of its description, at the latest with the process. A holder may delete the
// lock file as it unlocks (Unlock(true)): every Lock and TryLock checks, after locking,
// that the path still names the file it locked, and starts over on the new file if not,
// so a waiter never ends up holding the lock of a deleted file while another process
// locks a fresh one. That lets users delete lock files that are no longer needed
// instead of leaving one per name behind.
//
// Lock files are opened O_CLOEXEC|O_NOFOLLOW and created with mode 0600.
package flock

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Held is an exclusive flock held on a lock file. Release it with Unlock, once.
type Held struct {
	f    *os.File
	path string
}

// Path is the path of the lock file.
func (h *Held) Path() string { return h.path }

// Flock is flock(2) on f's descriptor with how (unix.LOCK_EX, LOCK_SH, LOCK_UN, with or
// without LOCK_NB), retried while interrupted (EINTR). A contended LOCK_NB returns
// unix.EWOULDBLOCK.
func Flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Release unlocks f's flock, if it holds one, with LOCK_UN and then closes f.
//
// Unlocking first matters: a flock belongs to the open file description, and a child
// that another goroutine is forking at this moment holds a copy of the descriptor until
// it execs (O_CLOEXEC acts only then), so a close alone could leave the lock held for
// that long.
func Release(f *os.File) {
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	f.Close()
}

// open opens (creating) the lock file path.
func open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock file %s: %w", path, err)
	}
	return f, nil
}

// current reports whether path still names the file f (which the caller has locked).
func current(f *os.File, path string) (bool, error) {
	var held, named unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &held); err != nil {
		return false, fmt.Errorf("locking %s: %w", path, err)
	}
	if err := unix.Stat(path, &named); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil // removed by its last holder
		}
		return false, fmt.Errorf("locking %s: %w", path, err)
	}
	return named.Ino == held.Ino && named.Dev == held.Dev, nil
}

// Lock takes an exclusive lock on the file path (creating it), waiting while another
// holder has it, until ctx is done. When the holder deleted the file as it unlocked
// (or it was replaced), Lock locks the file that path names now.
//
// Errors name path: opening it ("opening lock file PATH: ..."; a symlink is refused
// with ELOOP, a missing directory is fs.ErrNotExist), flock or stat failures
// ("locking PATH: ..."), and ctx ending first ("waiting for lock PATH: ...", wrapping
// ctx.Err(), so errors.Is(err, context.Canceled) or context.DeadlineExceeded holds).
// On error nothing is held. A ctx that is done before Lock has to wait waits for
// nothing; a wait that ctx ends leaves a goroutine blocked in flock until the lock is
// granted, which it then releases at once (a TryLock in that instant finds the lock
// taken).
func Lock(ctx context.Context, path string) (*Held, error) {
	for {
		f, err := open(path)
		if err != nil {
			return nil, err
		}
		err = Flock(f, unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) && ctx.Err() != nil {
			// Done already: do not leave a waiter behind that would take the lock,
			// however briefly, once its holder lets go.
			f.Close()
			return nil, fmt.Errorf("waiting for lock %s: %w", path, ctx.Err())
		}
		if errors.Is(err, unix.EWOULDBLOCK) {
			done := make(chan error, 1)
			go func() { done <- Flock(f, unix.LOCK_EX) }()
			select {
			case err = <-done:
			case <-ctx.Done():
				go func() { <-done; Release(f) }()
				return nil, fmt.Errorf("waiting for lock %s: %w", path, ctx.Err())
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		ok, err := current(f, path)
		if err != nil {
			Release(f)
			return nil, err
		}
		if !ok {
			Release(f) // removed or replaced while we waited: lock the new file
			continue
		}
		return &Held{f: f, path: path}, nil
	}
}

// TryLock is Lock without waiting: ok is false (and err nil) when another holder has
// the lock, or when the file was removed or replaced while TryLock locked it (its
// holder was just letting go of it). Errors are Lock's, without the ctx one.
func TryLock(path string) (h *Held, ok bool, err error) {
	f, err := open(path)
	if err != nil {
		return nil, false, err
	}
	if err := Flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("locking %s: %w", path, err)
	}
	if ok, err := current(f, path); err != nil || !ok {
		Release(f)
		return nil, false, err
	}
	return &Held{f: f, path: path}, true, nil
}

// Unlock releases the lock (see Release: LOCK_UN before close). With remove it first
// deletes the lock file, which is safe: waiters notice and lock the path afresh. A
// failure to delete it is ignored (the file only stays behind).
func (h *Held) Unlock(remove bool) {
	if remove {
		os.Remove(h.path)
	}
	Release(h.f)
}
