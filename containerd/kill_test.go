package containerd_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	taskv2 "github.com/containerd/containerd/api/runtime/task/v2"
	taskv3 "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/oci"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/containerd"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

// A berth killed between the steps of a clean-up leaves states that the next Create
// must repair: here they are made directly with the client.

// A container of ours whose snapshot is gone (an older clean-up removed the snapshot
// first and was killed before the container record) is replaced by a new sandbox.
func TestKilledCleanupContainerWithoutSnapshot(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		name := conformance.SandboxName()
		req := f.request(name)
		if _, err := f.d.Create(f.ctx, req); err != nil {
			t.Fatal(err)
		}
		f.run(name, "sh", "-c", "echo old > /root/old")
		if err := f.d.Stop(f.ctx, name, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.cli.SnapshotService(containerd.DefaultSnapshotter).Remove(f.ctx, name); err != nil {
			t.Fatal(err)
		}
		sb, err := f.d.Create(f.ctx, req)
		if err != nil {
			t.Fatalf("Create of a container whose snapshot is gone: %v", err)
		}
		if sb.Adopted || sb.State != backend.StateRunning {
			t.Errorf("Create of a container whose snapshot is gone: %+v, want a new (not adopted) running sandbox", sb)
		}
		if got := f.run(name, "sh", "-c", "cat /root/old 2>/dev/null; echo new"); got != "new\n" {
			t.Errorf("the new sandbox holds %q, want a fresh filesystem", got)
		}
		if err := f.d.Remove(f.ctx, name); err != nil {
			t.Fatal(err)
		}
		f.absent(name)
	})
}

// A snapshot of the sandbox's name without a container (a Create killed after
// preparing it, a clean-up killed between deleting the container and its snapshot)
// does not block the next Create, which removes it under its lock.
func TestKilledCreateOrphanSnapshot(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		name := conformance.SandboxName()
		req := f.request(name)
		img, err := f.cli.GetImage(f.ctx, "docker.io/"+testimage.Ref)
		if err != nil {
			t.Fatal(err)
		}
		// As Create makes it: the snapshot held by a lease until the container refers to
		// it; then the record goes, as a killed clean-up leaves it.
		lctx, done, err := f.cli.WithLease(f.ctx, leases.WithRandomID())
		if err != nil {
			t.Fatal(err)
		}
		defer done(f.ctx)
		c, err := f.cli.NewContainer(lctx, name, client.WithNewSnapshot(name, img), client.WithNewSpec(oci.WithImageConfig(img)))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(f.ctx); err != nil {
			t.Fatal(err)
		}
		sb, err := f.d.Create(f.ctx, req)
		if err != nil {
			t.Fatalf("Create over an orphan snapshot: %v", err)
		}
		if sb.Adopted {
			t.Errorf("Create over an orphan snapshot: %+v, want a new sandbox", sb)
		}
		f.run(name, "true")
		if err := f.d.Remove(f.ctx, name); err != nil {
			t.Fatal(err)
		}
		f.absent(name)
	})
}

// staleTask makes the state that a Stop or Remove killed while containerd deleted the
// task of sandbox name leaves: containerd still holds the task's shim, which has
// deleted the task. The task is killed, then deleted by asking its shim directly.
func (f *fixture) staleTask(name string) {
	f.t.Helper()
	c, err := f.cli.LoadContainer(f.ctx, name)
	if err != nil {
		f.t.Fatal(err)
	}
	tk, err := c.Task(f.ctx, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	exitC, err := tk.Wait(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := tk.Kill(f.ctx, syscall.SIGKILL); err != nil {
		f.t.Fatal(err)
	}
	<-exitC
	// The shim runs in its bundle directory, which holds its address.
	shim := shimOf(f.t, name)
	bundle, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", shim))
	if err != nil {
		f.t.Fatal(err)
	}
	version, address := 2, ""
	if b, err := os.ReadFile(filepath.Join(bundle, "bootstrap.json")); err == nil {
		var p struct {
			Version int    `json:"version"`
			Address string `json:"address"`
		}
		if err := json.Unmarshal(b, &p); err != nil {
			f.t.Fatal(err)
		}
		version, address = p.Version, p.Address
	} else if b, err := os.ReadFile(filepath.Join(bundle, "address")); err == nil {
		address = strings.TrimSpace(string(b))
	} else {
		f.t.Fatalf("the shim's bundle %s has neither bootstrap.json nor address", bundle)
	}
	conn, err := net.Dial("unix", strings.TrimPrefix(address, "unix://"))
	if err != nil {
		f.t.Fatal(err)
	}
	tc := ttrpc.NewClient(conn)
	defer tc.Close()
	if version >= 3 {
		_, err = taskv3.NewTTRPCTaskClient(tc).Delete(f.ctx, &taskv3.DeleteRequest{ID: name})
	} else {
		_, err = taskv2.NewTTRPCTaskClient(tc).Delete(f.ctx, &taskv2.DeleteRequest{ID: name})
	}
	if err != nil {
		f.t.Fatalf("deleting the task in its shim: %v", err)
	}
	if _, err := c.Task(f.ctx, nil); !cerrdefs.IsNotFound(err) {
		f.t.Fatalf("after the shim deleted the task, containerd's Task says %v, want not found", err)
	}
}

// shimOf returns the pid of the shim process of task name in the test namespace.
func shimOf(t *testing.T, name string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasSuffix(args[0], "containerd-shim-runc-v2") {
			continue
		}
		var ns, id string
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-namespace":
				ns = args[i+1]
			case "-id":
				id = args[i+1]
			}
		}
		if ns == testNamespace && id == name {
			return pid
		}
	}
	t.Fatalf("no shim process for task %s", name)
	return 0
}

// A task that containerd lists no more while it holds its shim (NewTask: "already
// exists") is cleaned up by Create, Stop and Remove: after each, the sandbox works
// again or is gone, and a new sandbox of the name can be made.
func TestKilledTaskDeleteStaleShim(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		name := conformance.SandboxName()
		req := f.request(name)
		if _, err := f.d.Create(f.ctx, req); err != nil {
			t.Fatal(err)
		}
		f.run(name, "sh", "-c", "echo kept > /root/kept")

		f.staleTask(name)
		sb, err := f.d.Create(f.ctx, req)
		if err != nil {
			t.Fatalf("Create over a stale task: %v", err)
		}
		if !sb.Adopted {
			t.Errorf("Create over a stale task: %+v, want the sandbox adopted", sb)
		}
		if got := f.run(name, "cat", "/root/kept"); got != "kept\n" {
			t.Errorf("after Create over a stale task: %q", got)
		}

		f.staleTask(name)
		if err := f.d.Stop(f.ctx, name, 0); err != nil {
			t.Fatalf("Stop of a stale task: %v", err)
		}
		if sb, err := f.d.Create(f.ctx, req); err != nil || !sb.Adopted {
			t.Fatalf("Create after Stop of a stale task: %+v %v", sb, err)
		}
		f.run(name, "true")

		f.staleTask(name)
		if err := f.d.Remove(f.ctx, name); err != nil {
			t.Fatalf("Remove of a stale task: %v", err)
		}
		f.absent(name)
		if sb, err := f.d.Create(f.ctx, req); err != nil || sb.Adopted {
			t.Fatalf("Create after Remove of a stale task: %+v %v, want a new sandbox", sb, err)
		}
		f.run(name, "true")
		if err := f.d.Remove(f.ctx, name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			t.Fatal(err)
		}
		f.absent(name)
	})
}
