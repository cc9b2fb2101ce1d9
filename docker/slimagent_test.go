package docker_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
)

// The stand-alone agent (cmd/berth-agent, built beside berth by testbin) serves a
// docker sandbox from its own content-hashed copy, and an upgrade while the sandbox is
// stopped (PrepareSandbox with another binary, then Create adopting and starting it)
// replaces it: after the restart the sandbox's PID 1 is the berth binary's copy.
func TestSlimAgentAndUpgrade(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	slim, err := agent.Install(f.state, filepath.Join(filepath.Dir(berthBin), backend.AgentBinaryName))
	if err != nil {
		t.Fatal(err)
	}
	if slim.Path == f.bin.Path {
		t.Fatalf("berth-agent and berth installed at the same path %s", slim.Path)
	}
	name := conformance.SandboxName()
	req := f.request(name)
	dir := filepath.Dir(req.Agent.Dir)
	if req.Agent, err = agent.PrepareSandbox(dir, slim); err != nil {
		t.Fatal(err)
	}
	check := func(want agent.Binary) {
		t.Helper()
		if _, err := f.d.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
		p, err := agent.Exec(ctx, req.Agent, backend.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Fatalf("true: %+v %v", res, err)
		}
		info, err := f.api.ContainerInspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !sameFile(t, "/proc/"+strconv.Itoa(info.State.Pid)+"/exe", want.Path) {
			t.Errorf("the sandbox's agent (pid %d) is not %s", info.State.Pid, want.Path)
		}
	}
	check(slim)
	if err := f.d.Stop(ctx, name, time.Second); err != nil {
		t.Fatal(err)
	}
	if req.Agent, err = agent.PrepareSandbox(dir, f.bin); err != nil {
		t.Fatal(err)
	}
	check(f.bin)
	if err := f.d.Remove(ctx, name); err != nil {
		t.Error(err)
	}
}

// sameFile reports whether paths a and b (links followed) are one file.
func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	sa, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	x, y := sa.Sys().(*syscall.Stat_t), sb.Sys().(*syscall.Stat_t)
	return x.Dev == y.Dev && x.Ino == y.Ino
}
