package local_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry"
)

// TestCallsAfterStop: a long-lived registry (berth serve's, a library user's) whose
// kept connection to a session's agent went with its stop of the sandbox makes its
// next call of every kind as on a fresh start: a job starts, a copy goes in and out,
// starting the sandbox again. Calls that cannot be made twice (a job's start, a
// copy) used to fail once on the dead connection. (A stop by another process is met
// by agentCache.get once gRPC has seen the connection close, which this test cannot
// order: it is not here.)
func TestCallsAfterStop(t *testing.T) {
	t.Parallel()
	long := localRegistries(t, t.TempDir(), "")()
	ctx := context.Background()
	p, _, err := long.Exec(ctx, "kept:1", backend.ExecRequest{Argv: []string{"sh", "-c", "echo x > f"}})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing f: %+v, %v", res, err)
	}
	for _, call := range []struct {
		name string
		f    func() error
	}{
		{"job start", func() error {
			_, err := long.JobStart(ctx, "kept:1", registry.JobStartRequest{Argv: []string{"true"}})
			return err
		}},
		{"copy in", func() error { return long.CopyIn(ctx, "kept:1", ".", bytes.NewReader(make([]byte, 1024))) }}, // an empty tar stream
		{"copy out", func() error { return long.CopyOut(ctx, "kept:1", "f", io.Discard) }},
	} {
		// The kept connection is made (or found) by a call on the running sandbox.
		if _, err := long.Jobs(ctx, "kept:1"); err != nil && !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("job list before the stop: %v", err)
		}
		if err := long.CopyOut(ctx, "kept:1", "f", io.Discard); err != nil {
			t.Fatalf("copy out before the stop: %v", err)
		}
		if err := long.StopSession(ctx, "kept:1"); err != nil {
			t.Fatal(err)
		}
		if err := call.f(); err != nil {
			t.Errorf("%s after a stop: %v", call.name, err)
		}
	}
}
