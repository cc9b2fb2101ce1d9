package docker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
)

// A sandbox whose container the engine ended (killed here, as a crash or the OOM
// killer would end it) is stopped with EndReason Error and its exit; Create starts
// it again and says why the run before ended; berth's own Stop leaves no reason.
func TestEndReason(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := conformance.SandboxName()
	req := f.request(name)
	sb, err := f.d.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if sb.EndReason != "" {
		t.Errorf("a new sandbox has EndReason %q", sb.EndReason)
	}
	if err := f.api.ContainerKill(ctx, name, "KILL"); err != nil {
		t.Fatal(err)
	}
	waitC, errC := f.api.ContainerWait(ctx, name, container.WaitConditionNotRunning)
	select {
	case <-waitC:
	case err := <-errC:
		t.Fatal(err)
	}
	got, err := f.d.Inspect(ctx, name)
	if err != nil || got.State != backend.StateStopped || got.EndReason != backend.EndError || !strings.Contains(got.EndMessage, "signal 9 (exit status 137)") {
		t.Errorf("Inspect of a killed container: %+v %v; want stopped, EndReason Error, killed by signal 9", got, err)
	}
	again, err := f.d.Create(ctx, req)
	if err != nil || !again.Adopted || again.State != backend.StateRunning || again.EndReason != backend.EndError {
		t.Errorf("Create of a killed container: %+v %v; want it started again (adopted) with why the run before ended", again, err)
	}
	if err := f.d.Stop(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := f.d.Inspect(ctx, name); err != nil || got.State != backend.StateStopped || got.EndReason != "" {
		t.Errorf("Inspect after berth's Stop: %+v %v; want stopped without an EndReason", got, err)
	}
}
