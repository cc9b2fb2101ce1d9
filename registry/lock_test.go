package registry

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A released busy marker is free at once even while another descriptor of its open
// file description exists, as one does in a child that another goroutine is forking (a
// dup stands in for the child's copy): it is unlocked, not just closed. (The create
// lock's counterpart is internal/flock's TestUnlockWithForkedCopy.)
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

}
