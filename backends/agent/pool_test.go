package agent

import (
	"context"
	"errors"
	"slices"
	"strings"
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

// The Pool runs execs and copies through the agent its Resolver names, keeps one
// connection per sandbox, passes the Resolver's errors on unchanged, reconnects
// after Forget, and Shutdown ends the agent.
func TestPool(t *testing.T) {
	a := startAgent(t)
	resolves := 0
	p := NewPool(func(ctx context.Context, name string) (backend.Dialer, error) {
		resolves++
		switch name {
		case "sb":
			return DialSocketDir(a.sockDir), nil
		case "stopped":
			return nil, backend.Errorf(backend.ErrConflict, "sandbox %s is stopped", name)
		}
		return nil, backend.Errorf(backend.ErrNotFound, "sandbox %s: not found", name)
	})
	defer p.Close()
	ctx := testCtx(t)
	exec := func(name, script string) (string, error) {
		var out strings.Builder
		proc, err := p.Exec(ctx, name, backend.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &out})
		if err != nil {
			return "", err
		}
		res, err := proc.Wait()
		if err == nil && res.ExitCode != 0 {
			t.Errorf("%q exited %d", script, res.ExitCode)
		}
		return out.String(), err
	}
	for i := 0; i < 3; i++ {
		if out, err := exec("sb", "echo hi"); err != nil || out != "hi\n" {
			t.Fatalf("exec %d: %q %v", i, out, err)
		}
	}
	if resolves != 1 {
		t.Errorf("3 execs resolved the sandbox %d times, want 1 (one cached connection)", resolves)
	}
	p.Forget("sb")
	if _, err := exec("sb", "true"); err != nil || resolves != 2 {
		t.Errorf("after Forget: %v, %d resolves", err, resolves)
	}
	if _, err := exec("gone", "true"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("missing sandbox: %v, want ErrNotFound", err)
	}
	if _, err := exec("stopped", "true"); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("stopped sandbox: %v, want ErrConflict", err)
	}
	if err := p.Shutdown(ctx, "sb", DialSocketDir(a.sockDir), 0); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case <-a.exited:
	case <-ctx.Done():
		t.Fatal("the agent did not exit after Pool.Shutdown")
	}
	if _, err := exec("sb", "true"); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("exec after Shutdown: %v, want ErrUnavailable", err)
	}
}
