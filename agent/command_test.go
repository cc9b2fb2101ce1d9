package agent

import (
	"slices"
	"testing"

	"github.com/berth-sh/berth/backend"
)

func TestSandboxCommand(t *testing.T) {
	got := SandboxCommand("--ready-fd", "3")
	want := []string{"/.berth/agent/berth-agent", "agent", "serve", "--socket-dir", "/.berth/run", "--ready-fd", "3"}
	if !slices.Equal(got, want) {
		t.Errorf("SandboxCommand = %q, want %q", got, want)
	}
	got = HostCommand(backend.AgentFiles{Binary: "/s/agent/berth-agent", SocketDir: "/s/run"}, "--subreaper")
	want = []string{"/s/agent/berth-agent", "agent", "serve", "--socket-dir", "/s/run", "--subreaper"}
	if !slices.Equal(got, want) {
		t.Errorf("HostCommand = %q, want %q", got, want)
	}
}
