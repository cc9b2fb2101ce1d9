package local_test

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry"
)

// TestIdleUseByAnotherRegistry: a long-lived registry whose own last use of a
// session is past idle_ttl does not stop the sandbox when another registry (another
// process: a berth command) used the session since. On the direct path the first
// registry's own last use stands in for the last-use file only while it proves the
// session not idle; past that, the slow path reads the file, which decides.
func TestIdleUseByAnotherRegistry(t *testing.T) {
	t.Parallel()
	var shift atomic.Int64 // the registries' clock offset, in nanoseconds
	open := localRegistries(t, t.TempDir(), "scope \"*\" {\n  retention {\n    idle_ttl = \"1h\"\n  }\n}\n",
		registry.WithClock(func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }))
	exec := func(r *registry.Registry, argv ...string) (string, int) {
		t.Helper()
		var out bytes.Buffer
		p, lease, err := r.Exec(context.Background(), "idle:1", backend.ExecRequest{Argv: argv, Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if lease.Recreated {
			t.Errorf("%q: the sandbox was recreated (%s)", argv, lease.RecreatedReason)
		}
		return strings.TrimSpace(out.String()), res.ExitCode
	}
	long := open()
	// A process that a stop of the sandbox would end.
	pid, code := exec(long, "sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!")
	if code != 0 || pid == "" {
		t.Fatalf("starting a background sleep: exit %d, output %q", code, pid)
	}
	exec(long, "true") // a direct call: long now knows its own last use
	other := open()
	shift.Add(int64(50 * time.Minute))
	exec(other, "true")
	shift.Add(int64(20 * time.Minute)) // 70 minutes after long's use, 20 after other's
	if out, code := exec(long, "kill", "-0", pid); code != 0 {
		t.Errorf("the background sleep is gone (kill -0: exit %d, %q): the sandbox was stopped although another registry used it 20 minutes ago (idle_ttl 1h)", code, out)
	}
	exec(long, "kill", pid)
}
