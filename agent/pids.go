package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/berth-sh/berth/backend"
)

// forkFailed is the error of a fork+exec of what (a command's name) that failed
// with err for a reason of the agent's, not the command's (no memory, no pids):
// ErrUnavailable, and for EAGAIN the pids cgroup's use and what to do about it.
func forkFailed(what string, err error) error {
	if errors.Is(err, syscall.EAGAIN) {
		if u := pidsUsage(); u != "" {
			return backend.Errorf(backend.ErrUnavailable, "starting %s: %w: %s; end the processes that fill it or raise pids in the rule's resources block", what, err, u)
		}
	}
	return backend.Errorf(backend.ErrUnavailable, "starting %s: %w", what, err)
}

// pidsUsage describes the agent's own pids cgroup as "N of M processes and threads
// in use (the sandbox's pids limit)", read from pids.current and pids.max (cgroup v1
// and v2 name them alike), or "" when the agent cannot read them or there is no
// limit. It is what a fork that failed with EAGAIN appends to its error, so that the
// user (and a failing test) sees whether the limit was reached.
func pidsUsage() string {
	for _, cur := range cgroupFiles("pids", "pids.current", "pids.current") {
		c, err := os.ReadFile(cur)
		if err != nil {
			continue
		}
		m, err := os.ReadFile(filepath.Join(filepath.Dir(cur), "pids.max"))
		if err != nil {
			continue
		}
		limit := strings.TrimSpace(string(m))
		if limit == "max" {
			return ""
		}
		return fmt.Sprintf("%s of %s processes and threads in use (the sandbox's pids limit)", strings.TrimSpace(string(c)), limit)
	}
	return ""
}
