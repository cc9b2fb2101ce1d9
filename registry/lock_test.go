package registry

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A released lock is free at once even while another descriptor of its open file
// description exists, as one does in a child that another goroutine is forking (a dup
// stands in for the child's copy): the busy marker and the create lock are unlocked,
// not just closed.
func TestUnlockWithForkedCopy(t *testing.T) {
	dir := t.TempDir()
	busyPath := filepath.Join(dir, "s.busy")
	busy, _, err := holdBusy(busyPath)
	if err != nil {
		t.Fatal(err)
	}
	copyFD, err := unix.Dup(int(busy.f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(copyFD)
	if b, err := isBusy(busyPath); err != nil || !b {
		t.Fatalf("isBusy while held: %v, %v; want busy", b, err)
	}
	busy.unlock(false)
	if b, err := isBusy(busyPath); err != nil || b {
		t.Errorf("isBusy after unlock, with a forked copy of the descriptor open: %v, %v; want not busy", b, err)
	}

	lockPath := filepath.Join(dir, "s.lock")
	l, err := lockFile(t.Context(), lockPath)
	if err != nil {
		t.Fatal(err)
	}
	copy2, err := unix.Dup(int(l.f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(copy2)
	l.unlock(false)
	l2, ok, err := tryLockFile(lockPath)
	if err != nil || !ok {
		t.Fatalf("tryLockFile after unlock, with a forked copy open: %v, %v; want the lock", ok, err)
	}
	l2.unlock(false)
}
