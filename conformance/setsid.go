package conformance

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// setsidScript starts `sleep 300` in a Unix session of its own (setsid) from a
// subshell that exits at once, so the sleep is orphaned (neither in the exec's
// session nor a descendant of its processes: only its inherited environment ties it
// to the exec), writes its pid to the file $1 once it is there, says "started" and
// waits: the process that a kill of the exec must still find.
const setsidScript = `( setsid sh -c 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 300' sh "$1" & )
while [ ! -s "$1" ]; do sleep 0.01; done
echo started
sleep 300`

// Cancelling an exec kills what it moved to another Unix session too (setsid), even
// orphaned. A timeout and a caller that goes away take the same kill as a cancel.
func caseCancelKillsSetsid(t T, h *Harness) {
	sb := h.NewSandbox(t)
	// As the default user only for now: as user 1234 it passes on runc (docker,
	// containerd) but not under gVisor (the agent's setfsuid does not open another
	// user's environ there) nor on kubernetes (no "started"); both are open work.
	users := []string{""}
	for _, user := range users {
		pidFile := "/tmp/berth-setsid-" + randHex(8)
		ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
		stdout := newNotifyWriter("started\n")
		p, err := h.Exec(ctx, sb, backend.ExecRequest{Argv: []string{"sh", "-c", setsidScript, "sh", pidFile}, User: user, Stdout: stdout})
		if err != nil {
			cancel()
			t.Fatalf("Exec as user %q: %v", user, err)
		}
		select {
		case <-stdout.seen:
		case <-time.After(testwait.Limit):
			cancel()
			_, _ = p.Wait()
			t.Fatalf("user %q: no \"started\" within %v (stdout %q)", user, testwait.Limit, stdout.String())
		}
		pid := strings.TrimSpace(h.run(t, sb, "cat", pidFile).Stdout)
		if _, err := strconv.Atoi(pid); err != nil {
			cancel()
			_, _ = p.Wait()
			t.Fatalf("user %q: the setsid process's pid file holds %q", user, pid)
		}
		cancel()
		res, err := p.Wait()
		if !res.Canceled && !errors.Is(err, context.Canceled) {
			t.Errorf("user %q: Wait after cancel: result %+v, err %v; want Canceled", user, res, err)
		}
		// The result comes only after the tree is gone (the contract), so one look
		// is enough: a process left now was not killed.
		out := h.run(t, sb, "sh", "-c", `cat "/proc/$1/stat" 2>/dev/null; rm -f "$2"`, "sh", pid, pidFile)
		if ps := liveOnly(parseStat(out.Stdout)); len(ps) > 0 {
			t.Errorf("user %q: the exec's setsid child %v outlived its cancel", user, ps)
			h.run(t, sb, "kill", "-9", pid)
		}
	}
}
