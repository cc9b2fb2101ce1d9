package testwait

import (
	"bytes"
	"strings"
	"sync"
	"time"
)

// Buffer is an in-memory output sink that one goroutine writes (a process's
// stdout or stderr, a log) while the test reads it from another and waits for
// what it should come to hold. The zero value is an empty Buffer ready to use;
// every method is safe for concurrent use. It grows with what is written: use it
// for test-sized output.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	// changed is closed (and cleared) by the next Write; nil when nobody waits.
	changed chan struct{}
}

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
	return len(p), nil
}

// String returns a copy of everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Len returns how many bytes have been written so far.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

// WaitFor returns once the Buffer holds sub, checking again after each Write (no
// polling). When Limit passes first it fails t (Fatalf) with what the Buffer holds.
func (b *Buffer) WaitFor(t TB, sub string) {
	t.Helper()
	timer := time.NewTimer(Limit)
	defer timer.Stop()
	for {
		b.mu.Lock()
		if strings.Contains(b.buf.String(), sub) {
			b.mu.Unlock()
			return
		}
		if b.changed == nil {
			b.changed = make(chan struct{})
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("timed out after %v waiting for %q in the output; it holds %q", Limit, sub, b.String())
			return
		}
	}
}
