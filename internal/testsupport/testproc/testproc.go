// Package testproc finds processes in /proc for berth's tests and the conformance
// suite, so that a test can wait for a process it cannot otherwise observe (one a
// sandbox started, the child of a plugin) by what it is.
package testproc

import (
	"os"
	"strconv"
	"strings"
)

// Find returns the pids under /proc for which keep returns true, in /proc's order.
// keep reads what it needs from /proc/PID itself; a process that is gone by then
// reads as nothing and should not be kept.
func Find(keep func(pid int) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if keep(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// WithArgs returns the pids whose command line is exactly args (zombies included:
// their command line reads empty, so they do not match).
func WithArgs(args ...string) []int {
	want := strings.Join(args, "\x00") + "\x00"
	return Find(func(pid int) bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		return err == nil && string(b) == want
	})
}
