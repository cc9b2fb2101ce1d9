package local

import (
	"slices"
	"testing"

	"github.com/berth-sh/berth/backend"
)

func TestDedupEnvLastWins(t *testing.T) {
	got := dedupEnv([]string{"PATH=/host", "LANG=C.UTF-8", "HOME=/h", "PATH=/spec", "X=1", "HOME=/spec-home"})
	want := []string{"LANG=C.UTF-8", "PATH=/spec", "X=1", "HOME=/spec-home"}
	if !slices.Equal(got, want) {
		t.Fatalf("dedupEnv = %q, want %q", got, want)
	}
}

// TestSpecEnvOverridesHost: a rule's env replaces an allowlisted host variable, and
// BERTH_SANDBOX stays the sandbox's name whatever the spec says.
func TestSpecEnvOverridesHost(t *testing.T) {
	t.Setenv("LANG", "host-lang")
	d := New(WithStateDir(t.TempDir()))
	m := &meta{Name: "sb", Spec: backendSpec("LANG=spec-lang", "BERTH_SANDBOX=evil", "HOME=/spec-home")}
	env := d.agentEnv(m, "/home-dir")
	for _, want := range []string{"LANG=spec-lang", "BERTH_SANDBOX=sb", "HOME=/spec-home"} {
		if !slices.Contains(env, want) {
			t.Errorf("agent env %q lacks %q", env, want)
		}
	}
	for _, bad := range []string{"LANG=host-lang", "BERTH_SANDBOX=evil", "HOME=/home-dir"} {
		if slices.Contains(env, bad) {
			t.Errorf("agent env %q still has %q", env, bad)
		}
	}
}

func backendSpec(env ...string) (s backend.SandboxSpec) {
	s.Env = env
	return s
}
