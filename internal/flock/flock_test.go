package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// waitBlocked returns once some process waits in flock for the file path names now
// (a "->" entry in /proc/locks on its inode), so that tests can order "a waiter
// waits" before "the holder lets go" without sleeping.
func waitBlocked(t *testing.T, path string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf(":%d", st.Ino)
	if _, err := os.Stat("/proc/locks"); err != nil {
		t.Skipf("no /proc/locks: %v", err)
	}
	testwait.Until(t, "a waiter in /proc/locks", func() bool {
		b, _ := os.ReadFile("/proc/locks")
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			// "N: -> FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END"
			if len(f) >= 7 && f[1] == "->" && f[2] == "FLOCK" && strings.HasSuffix(f[6], suffix) {
				return true
			}
		}
		return false
	})
}

// sameFile reports whether h holds the file that its path names now.
func sameFile(t *testing.T, h *Held) bool {
	t.Helper()
	ok, err := current(h.f, h.path)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// A waiter blocked on a lock file that its holder deletes as it unlocks locks the
// re-created file, the one that path names, and excludes everyone else.
func TestWaiterRelocksAfterRemove(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.lock")
	h, err := Lock(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Held, 1)
	go func() {
		h2, err := Lock(context.Background(), p)
		if err != nil {
			t.Error(err)
		}
		got <- h2
	}()
	waitBlocked(t, p) // the waiter has opened the old file and waits on it
	h.Unlock(true)
	h2 := <-got
	if h2 == nil {
		t.FailNow()
	}
	defer h2.Unlock(true)
	if !sameFile(t, h2) {
		t.Fatal("the waiter holds a lock on a file that the path no longer names")
	}
	if _, ok, err := TryLock(p); err != nil || ok {
		t.Errorf("TryLock while the waiter holds the lock: %v, %v; want contended", ok, err)
	}
}

// Many holders that each delete the lock file as they unlock never overlap.
func TestRemoveExcludes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.lock")
	var inside, total atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				h, err := Lock(context.Background(), p)
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					t.Error("two holders at once")
				}
				total.Add(1)
				inside.Add(-1)
				h.Unlock(true)
			}
		})
	}
	wg.Wait()
	if total.Load() != 8*200 {
		t.Errorf("%d locks taken, want %d", total.Load(), 8*200)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock file left after Unlock(true): %v", err)
	}
}

func TestLockCancel(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.lock")
	h, err := Lock(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		h2, err := Lock(ctx, p)
		if err == nil {
			h2.Unlock(false)
		}
		got <- err
	}()
	waitBlocked(t, p)
	cancel()
	err = <-got
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), p) {
		t.Errorf("cancelled wait: %v; want context.Canceled naming %s", err, p)
	}
	h.Unlock(false)
	// The abandoned wait lets go of the lock once it gets it: a new Lock succeeds.
	h3, err := Lock(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	h3.Unlock(true)
}

func TestTryLock(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.lock")
	h, ok, err := TryLock(p)
	if err != nil || !ok {
		t.Fatalf("TryLock of a free lock: %v, %v", ok, err)
	}
	if _, ok, err := TryLock(p); err != nil || ok {
		t.Errorf("TryLock of a held lock: %v, %v; want contended", ok, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Lock(ctx, p); !errors.Is(err, context.Canceled) {
		t.Errorf("Lock of a held lock with a done ctx: %v", err)
	}
	h.Unlock(false)
	h2, ok, err := TryLock(p)
	if err != nil || !ok {
		t.Fatalf("TryLock after Unlock: %v, %v", ok, err)
	}
	h2.Unlock(false)
}

// A released lock is free at once even while another descriptor of its open file
// description exists, as one does in a child that another goroutine is forking (a dup
// stands in for the child's copy): Unlock unlocks, not just closes.
func TestUnlockWithForkedCopy(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.lock")
	h, err := Lock(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	copyFD, err := unix.Dup(int(h.f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(copyFD)
	h.Unlock(false)
	h2, ok, err := TryLock(p)
	if err != nil || !ok {
		t.Fatalf("TryLock after Unlock, with a forked copy open: %v, %v; want the lock", ok, err)
	}
	h2.Unlock(false)
}

func TestSymlinkRefused(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.lock")
	if err := os.Symlink(filepath.Join(dir, "target"), p); err != nil {
		t.Fatal(err)
	}
	if _, err := Lock(t.Context(), p); !errors.Is(err, unix.ELOOP) || !strings.Contains(err.Error(), p) {
		t.Errorf("Lock of a symlink: %v; want ELOOP naming the path", err)
	}
	if _, _, err := TryLock(p); !errors.Is(err, unix.ELOOP) {
		t.Errorf("TryLock of a symlink: %v; want ELOOP", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "target")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("symlink target created: %v", err)
	}
	p2 := filepath.Join(dir, "new.lock")
	h, err := Lock(t.Context(), p2)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unlock(true)
	if fi, err := os.Stat(p2); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("lock file mode: %v, %v; want no group/other bits", fi.Mode(), err)
	}
}
