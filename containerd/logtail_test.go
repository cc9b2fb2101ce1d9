package containerd

import (
	"os"
	"strings"
	"testing"
)

// A crash report of the agent's Go runtime (testdata/agent-crash.log: a real one,
// written through debug.SetCrashOutput by an agent under a pids limit of 12) is shown
// from its start, with the cause named, not by its last 2 KiB of goroutine stacks.
func TestFormatAgentLogCrash(t *testing.T) {
	b, err := os.ReadFile("testdata/agent-crash.log")
	if err != nil {
		t.Fatal(err)
	}
	got := formatAgentLog(string(b))
	for _, want := range []string{"berth-agent: starting", "runtime stack:", "runtime.newosproc", "pids limit"} {
		if !strings.Contains(got, want) {
			t.Errorf("formatAgentLog(crash) lacks %q:\n%s", want, got)
		}
	}
	if len(got) > 2500 {
		t.Errorf("formatAgentLog(crash) is %d bytes long", len(got))
	}
	if got := formatAgentLog("a\nagent: listening: boom\n"); got != "; agent log: a\nagent: listening: boom" {
		t.Errorf("formatAgentLog(plain) = %q", got)
	}
	if got := formatAgentLog(" \n"); got != "" {
		t.Errorf("formatAgentLog(blank) = %q", got)
	}
}
