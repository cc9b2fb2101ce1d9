// Package testwait is the one polling helper of berth's tests (and of the
// conformance suite): wait for an observable event — a pid in /proc, a file, a
// line of output, a lock in /proc/locks — instead of sleeping for a while or
// racing a short deadline. The only clock in it is a generous safety net (Limit),
// so a loaded machine makes a test slower, never wrong; its expiry fails the test
// and says what was awaited.
package testwait

import (
	"context"
	"os"
	"time"
)

// Limit is how long Until waits before it fails: long enough that only a real
// hang reaches it on a busy machine. BERTH_TEST_WAIT (a Go duration) overrides it.
var Limit = limit()

func limit() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("BERTH_TEST_WAIT")); err == nil && d > 0 {
		return d
	}
	return 2 * time.Minute
}

// maxInterval bounds the pause between two checks; the pauses start at 1 ms and
// double, so a quick event is seen quickly and a slow one costs few checks.
const maxInterval = 50 * time.Millisecond

// TB is the part of testing.TB that Until uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Until calls cond until it returns true. When Limit passes first it fails t
// (Fatalf) with "timed out after LIMIT waiting for WHAT".
func Until(t TB, what string, cond func() bool) {
	t.Helper()
	if !For(context.Background(), Limit, cond) {
		t.Fatalf("timed out after %v waiting for %s", Limit, what)
	}
}

// For calls cond until it returns true, limit passes (Limit when limit <= 0) or
// ctx is done, and reports whether cond held. Use it where the caller reports a
// failure itself; keep limit generous: it is a safety net, not a measurement.
func For(ctx context.Context, limit time.Duration, cond func() bool) bool {
	if limit <= 0 {
		limit = Limit
	}
	deadline := time.Now().Add(limit)
	pause := time.Millisecond
	for {
		if cond() {
			return true
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			return false
		}
		t := time.NewTimer(min(pause, time.Until(deadline)))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		pause = min(2*pause, maxInterval)
	}
}
