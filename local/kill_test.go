package local_test

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
)

// TestTimeoutKillsSetsidChild: on local a sandbox's processes are host processes, so
// one that an exec moved to a session of its own (setsid) must still go with the
// exec's timeout, not live on the host until the session is removed.
func TestTimeoutKillsSetsidChild(t *testing.T) {
	t.Parallel()
	r := localRegistries(t, t.TempDir(), "")()
	var out bytes.Buffer
	// $! is printed after the fork: the child exists by then.
	p, _, err := r.Exec(context.Background(), "kill:1", backend.ExecRequest{
		Argv: []string{"sh", "-c", "setsid sleep 7791 & echo $!; sleep 99"}, Stdout: &out, Timeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil || !res.TimedOut {
		t.Fatalf("result %+v, %v; want timed out", res, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("output %q: the timeout passed before the script started its child", out.String())
	}
	// The result comes only after the tree is gone: no waiting here.
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil && strings.Contains(string(b), "7791") {
		t.Errorf("the exec's setsid child %d (%q) outlived its timeout on the host", pid, b)
	}
}
