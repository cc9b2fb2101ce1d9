package testwait

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestForSeesTheEvent(t *testing.T) {
	var n atomic.Int32
	if !For(context.Background(), 0, func() bool { return n.Add(1) == 5 }) {
		t.Fatal("For did not see cond hold")
	}
	if n.Load() != 5 {
		t.Errorf("cond called %d times, want 5", n.Load())
	}
}

func TestForLimitAndContext(t *testing.T) {
	if For(context.Background(), 20*time.Millisecond, func() bool { return false }) {
		t.Error("For reported a cond that never holds")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if For(ctx, time.Hour, func() bool { return false }) {
		t.Error("For with a done context reported success")
	}
	// The last check comes after the limit: an event at the very end is seen.
	start := time.Now()
	if !For(context.Background(), 30*time.Millisecond, func() bool { return time.Since(start) >= 30*time.Millisecond }) {
		t.Error("For missed an event at its limit")
	}
}

type fakeT struct{ failed string }

func (f *fakeT) Helper()                           {}
func (f *fakeT) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestUntilFailsSayingWhat(t *testing.T) {
	old := Limit
	Limit = 20 * time.Millisecond
	defer func() { Limit = old }()
	var f fakeT
	Until(&f, "the moon", func() bool { return false })
	if f.failed != "timed out after 20ms waiting for the moon" {
		t.Errorf("failure %q", f.failed)
	}
	f = fakeT{}
	Until(&f, "now", func() bool { return true })
	if f.failed != "" {
		t.Errorf("failure %q for a cond that holds", f.failed)
	}
}

func TestBufferWaitFor(t *testing.T) {
	var b Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.WaitFor(t, "ready")
	}()
	// Written in pieces, so that the waiter may see "rea" first; whenever it
	// looks, it returns only once the whole word is there.
	for _, s := range []string{"starting\n", "rea", "dy\n"} {
		fmt.Fprint(&b, s)
	}
	<-done
	if got := b.String(); got != "starting\nready\n" || b.Len() != len(got) {
		t.Errorf("String %q, Len %d", got, b.Len())
	}
}

type fatalRecorder struct{ msg string }

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestBufferWaitForTimesOut(t *testing.T) {
	old := Limit
	Limit = 10 * time.Millisecond
	defer func() { Limit = old }()
	var b Buffer
	b.Write([]byte("other"))
	var f fatalRecorder
	b.WaitFor(&f, "never")
	if !strings.Contains(f.msg, `"never"`) || !strings.Contains(f.msg, `"other"`) {
		t.Errorf("failure %q, want it to name what was awaited and what the buffer held", f.msg)
	}
}
