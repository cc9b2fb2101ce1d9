package server

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// spoolFiles returns how many descriptors of this process refer to files under
// dir (spool files are unlinked at once, so the directory itself is always empty).
func spoolFiles(t *testing.T, dir string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && filepath.Dir(target) == dir {
			n++
		}
	}
	return n
}

// A call that sends no stdin makes no spool file; one that does makes one, reads
// back what it wrote, and closes it; a Close before the first byte leaves none.
func TestSpoolFileOnlyWithStdin(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, spoolDir)

	empty := newSpool(state, 1<<20)
	empty.CloseWrite()
	if n, err := empty.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("Read of a spool without stdin = %d, %v; want 0, EOF", n, err)
	}
	if n := spoolFiles(t, dir); n != 0 {
		t.Fatalf("a spool without stdin holds %d files open; want none", n)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatalf("a spool without stdin made %s", dir)
	}
	empty.Close()

	sp := newSpool(state, 1<<20)
	want := bytes.Repeat([]byte("stdin "), 1000)
	if n, err := sp.Write(want); n != len(want) || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if n := spoolFiles(t, dir); n != 1 {
		t.Fatalf("a spool with stdin holds %d files open; want 1", n)
	}
	sp.CloseWrite()
	got, err := io.ReadAll(sp)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes (%v); want the %d written", len(got), err, len(want))
	}
	sp.Close()
	if n := spoolFiles(t, dir); n != 0 {
		t.Fatalf("a closed spool holds %d files open; want none", n)
	}

	closed := newSpool(state, 1<<20)
	closed.Close()
	if n, err := closed.Write([]byte("late")); n != 4 || err != nil {
		t.Fatalf("Write after Close = %d, %v; want it dropped as written", n, err)
	}
	if n := spoolFiles(t, dir); n != 0 {
		t.Fatalf("a spool written after Close holds %d files open; want none", n)
	}
}
