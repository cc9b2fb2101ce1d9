package testimage

import (
	"os"
	"testing"
)

// RunscStartHint says how to get gVisor's runsc for the tests.
const RunscStartHint = "build gVisor's runsc and register it with the test daemons: sudo scripts/runtimes.sh stop; then eval \"$(sudo scripts/runtimes.sh)\", which exports BERTH_RUNSC (docs/gvisor.md)"

// RequireRunsc returns $BERTH_RUNSC, the runsc wrapper that scripts/runtimes.sh
// writes (runsc-berth: runsc with the flags berth needs), when it is an executable
// file. Otherwise it fails the test under CI (CI=true), where a missing runtime is an
// error, and skips it elsewhere, with RunscStartHint.
func RequireRunsc(t testing.TB) string {
	t.Helper()
	path := os.Getenv("BERTH_RUNSC")
	msg := "BERTH_RUNSC is not set"
	if path != "" {
		fi, err := os.Stat(path)
		if err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return path
		}
		msg = "BERTH_RUNSC=" + path + " is not an executable file"
	}
	Missing(t, msg+"; "+RunscStartHint)
	return ""
}

// Missing fails the test under CI (CI=true), where a missing runtime is an error,
// and skips it elsewhere, with msg.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
