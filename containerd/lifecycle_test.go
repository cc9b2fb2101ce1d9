package containerd_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/containerd"
	"github.com/berth-sh/berth/internal/containerutil"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

// run runs argv in sandbox name and returns its stdout; it must exit 0.
func (f *fixture) run(name string, argv ...string) string {
	f.t.Helper()
	var out, errb bytes.Buffer
	p, err := f.exec(name, backend.ExecRequest{Argv: argv, Stdout: &out, Stderr: &errb})
	if err != nil {
		f.t.Fatalf("Exec %q: %v", argv, err)
	}
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 {
		f.t.Fatalf("%q: exit %d, %v; stderr %q", argv, res.ExitCode, err, errb.String())
	}
	return out.String()
}

// task returns the task of container name, or nil when it has none.
func (f *fixture) task(name string) *struct {
	pid                   uint32
	stdin, stdout, stderr string
} {
	f.t.Helper()
	r, err := f.cli.TaskService().Get(f.ctx, &tasksapi.GetRequest{ContainerID: name})
	if err != nil {
		if cerrdefs.IsNotFound(errgrpc.ToNative(err)) {
			return nil
		}
		f.t.Fatal(err)
	}
	p := r.GetProcess()
	return &struct {
		pid                   uint32
		stdin, stdout, stderr string
	}{p.GetPid(), p.GetStdin(), p.GetStdout(), p.GetStderr()}
}

// Stop deletes the task and keeps container and snapshot; the next Create adopts the
// container with a new task on the same snapshot (the files are there); a task whose
// PID 1 died is replaced the same way; Remove deletes task, container and snapshot.
// The task's stdio is null IO: no FIFOs that someone would have to drain.
func TestStopKeepsSnapshot(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		name := conformance.SandboxName()
		req := f.request(name)
		if _, err := f.d.Create(f.ctx, req); err != nil {
			t.Fatal(err)
		}
		first := f.task(name)
		if first == nil || first.pid == 0 {
			t.Fatalf("no running task after Create: %+v", first)
		}
		if first.stdin != "" || first.stdout != "" || first.stderr != "" {
			t.Errorf("the task's stdio is %+v, want null IO (no FIFOs)", first)
		}
		f.run(name, "sh", "-c", "echo kept > /root/kept")

		if err := f.d.Stop(f.ctx, name, 0); err != nil {
			t.Fatal(err)
		}
		if sb, err := f.d.Inspect(f.ctx, name); err != nil || sb.State != backend.StateStopped || sb.EndReason != "" {
			t.Errorf("after Stop: Inspect %+v %v, want stopped without an EndReason (berth stopped it)", sb, err)
		}
		if tk := f.task(name); tk != nil {
			t.Errorf("after Stop the task is still there: %+v", tk)
		}
		if _, err := f.cli.LoadContainer(f.ctx, name); err != nil {
			t.Errorf("after Stop the container is gone: %v", err)
		}
		if _, err := f.cli.SnapshotService(containerd.DefaultSnapshotter).Stat(f.ctx, name); err != nil {
			t.Errorf("after Stop the snapshot is gone: %v", err)
		}
		if _, err := f.exec(name, backend.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, backend.ErrUnavailable) {
			t.Errorf("Exec in a stopped sandbox: %v, want ErrUnavailable (no agent answers)", err)
		}
		if err := f.d.Stop(f.ctx, name, 0); err != nil {
			t.Errorf("second Stop: %v", err)
		}

		sb, err := f.d.Create(f.ctx, req)
		if err != nil || !sb.Adopted || sb.State != backend.StateRunning {
			t.Fatalf("Create after Stop: %+v %v, want adopted and running", sb, err)
		}
		second := f.task(name)
		if second == nil || second.pid == first.pid {
			t.Errorf("Create after Stop: task %+v, want a new one (the first had pid %d)", second, first.pid)
		}
		if got := f.run(name, "cat", "/root/kept"); got != "kept\n" {
			t.Errorf("the file written before Stop: %q", got)
		}

		// PID 1 killed from the host: the sandbox is stopped, and Create replaces the
		// dead task.
		c, err := f.cli.LoadContainer(f.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		tk, err := c.Task(f.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		exitC, err := tk.Wait(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Kill(f.ctx, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-exitC
		if sb, err := f.d.Inspect(f.ctx, name); err != nil || sb.State != backend.StateStopped ||
			sb.EndReason != backend.EndError || !strings.Contains(sb.EndMessage, "signal 9 (exit status 137") {
			t.Errorf("after PID 1 was killed: Inspect %+v %v, want stopped with EndReason Error, killed by signal 9", sb, err)
		}
		if sb, err := f.d.Create(f.ctx, req); err != nil || !sb.Adopted || sb.EndReason != backend.EndError {
			t.Fatalf("Create after PID 1 died: %+v %v; want adopted, with EndReason Error (why the run before ended)", sb, err)
		}
		if sb, err := f.d.Inspect(f.ctx, name); err != nil || sb.State != backend.StateRunning || sb.EndReason != "" {
			t.Errorf("Inspect once started again: %+v %v, want running without an EndReason", sb, err)
		}
		if got := f.run(name, "cat", "/root/kept"); got != "kept\n" {
			t.Errorf("the file after a new task: %q", got)
		}

		if err := f.d.Remove(f.ctx, name); err != nil {
			t.Fatal(err)
		}
		f.absent(name)
		if _, err := f.d.Inspect(f.ctx, name); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("Inspect after Remove: %v, want ErrNotFound", err)
		}
		if err := f.d.Remove(f.ctx, name); err != nil {
			t.Errorf("second Remove: %v", err)
		}
	})
}

// The OCI spec's hardening, seen from inside: seccomp filter mode, no-new-privileges,
// the hostname, and the cgroup limits (pids 512 by default, memory with swap equal,
// CPU quota).
func TestHardening(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		name := conformance.SandboxName()
		req := f.request(name)
		req.Spec.Resources = backend.Resources{CPUs: 0.5, MemoryBytes: 64 << 20}
		if _, err := f.d.Create(f.ctx, req); err != nil {
			t.Fatal(err)
		}
		status := f.run(name, "grep", "-E", "^(Seccomp|NoNewPrivs):", "/proc/self/status")
		if !strings.Contains(status, "Seccomp:\t2") || !strings.Contains(status, "NoNewPrivs:\t1") {
			t.Errorf("/proc/self/status: %q, want Seccomp 2 (filter) and NoNewPrivs 1", status)
		}
		// Network none: lo only, and up (IFF_UP|IFF_LOOPBACK; runc sets it up in a new
		// network namespace), so 127.0.0.1 works as in a Docker container.
		if got := strings.TrimSpace(f.run(name, "cat", "/sys/class/net/lo/flags")); got != "0x9" {
			t.Errorf("lo's flags %q, want 0x9 (up, loopback)", got)
		}
		// A server on 127.0.0.1 and a client that retries until it listens. The
		// client reads its message from a file: busybox nc exits at the server's end
		// of the connection (the server's stdin is /dev/null, so it ends its side at
		// once), and from a pipe it could see that before its message was there to
		// send (5 of 300 runs on the host; none of 600 with the file).
		if got := f.run(name, "timeout", "20", "sh", "-c", `echo over-lo > /tmp/msg; nc -l -p 7777 > /tmp/got & i=0; until nc 127.0.0.1 7777 < /tmp/msg 2>/dev/null; do i=$((i+1)); [ $i -lt 5000 ] || exit 1; done; wait; cat /tmp/got`); got != "over-lo\n" {
			t.Errorf("a connection over 127.0.0.1 carried %q, want \"over-lo\\n\"", got)
		}
		if h := strings.TrimSpace(f.run(name, "hostname")); h != name {
			t.Errorf("hostname %q, want the sandbox's name %q", h, name)
		}
		read, _ := f.cgroupReader(name)
		if got := read("pids", "pids.max", "pids.max"); got != strconv.Itoa(backend.DefaultPidsLimit) {
			t.Errorf("pids.max %q, want %d", got, backend.DefaultPidsLimit)
		}
		if got := read("memory", "memory.limit_in_bytes", "memory.max"); got != strconv.Itoa(64<<20) {
			t.Errorf("memory limit %q, want %d", got, 64<<20)
		}
		// v1: memory+swap equal to memory (when the kernel accounts swap); v2: no swap
		// on top.
		if got := read("memory", "memory.memsw.limit_in_bytes", "memory.swap.max"); got != strconv.Itoa(64<<20) && got != "0" && !strings.HasPrefix(got, "unreadable") {
			t.Errorf("memory+swap limit %q, want %d (v1) or 0 (v2)", got, 64<<20)
		}
		if got := read("cpu", "cpu.cfs_quota_us", "cpu.max"); got != "50000" && got != "50000 100000" {
			t.Errorf("CPU quota %q, want 50000 per 100000 µs", got)
		}
		if err := f.d.Remove(f.ctx, name); err != nil {
			t.Fatal(err)
		}
	})
}

// A sandbox without resources gets the default memory limit and CPU shares; memory
// = "unlimited" has none, and a rule's cpu_shares is honoured.
func TestDefaultLimits(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		for _, c := range []struct {
			res            backend.Resources
			memory, shares string
		}{
			{backend.Resources{}, strconv.FormatInt(containerutil.DefaultMemory(), 10), strconv.Itoa(backend.DefaultCPUShares)},
			{backend.Resources{MemoryBytes: backend.UnlimitedMemory, CPUShares: 1024}, "", "1024"},
		} {
			name := conformance.SandboxName()
			req := f.request(name)
			req.Spec.Resources = c.res
			if _, err := f.d.Create(f.ctx, req); err != nil {
				t.Fatal(err)
			}
			read, cpuV1 := f.cgroupReader(name)
			mem := read("memory", "memory.limit_in_bytes", "memory.max")
			if c.memory != "" && mem != c.memory {
				t.Errorf("%+v: memory limit %q, want %s", c.res, mem, c.memory)
			}
			// No limit: v2 says "max", v1 a huge page-rounded number.
			if n, err := strconv.ParseInt(mem, 10, 64); c.memory == "" && mem != "max" && (err != nil || n < 1<<50) {
				t.Errorf("%+v: memory limit %q, want none", c.res, mem)
			}
			// v1 keeps the shares; v2 has a cpu.weight the runtime converts them to.
			if got := read("cpu", "cpu.shares", "cpu.weight"); cpuV1 && got != c.shares {
				t.Errorf("%+v: cpu.shares %q, want %s", c.res, got, c.shares)
			}
			if err := f.d.Remove(f.ctx, name); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// cgroupReader returns a reader of the cgroup files of sandbox name's task, read on
// the host: read(controller, v1 file, v2 file) gives the file's trimmed content, or
// "unreadable: ..." when it cannot be read; cpuV1 says the cpu controller is v1's.
func (f *fixture) cgroupReader(name string) (read func(ctl, v1, v2 string) string, cpuV1 bool) {
	t := f.t
	t.Helper()
	tk := f.task(name)
	if tk == nil {
		t.Fatal("no task")
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(tk.pid)) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{} // controller ("" on v2) → directory
	for _, line := range strings.Split(string(b), "\n") {
		if fs := strings.SplitN(line, ":", 3); len(fs) == 3 {
			for _, ctl := range strings.Split(fs[1], ",") {
				if fs[1] == "" {
					dirs[""] = "/sys/fs/cgroup" + fs[2]
				} else {
					dirs[ctl] = "/sys/fs/cgroup/" + fs[1] + fs[2]
				}
			}
		}
	}
	_, cpuV1 = dirs["cpu"]
	return func(ctl, v1, v2 string) string {
		p := filepath.Join(dirs[""], v2)
		if d, ok := dirs[ctl]; ok {
			p = filepath.Join(d, v1)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return "unreadable: " + err.Error()
		}
		return strings.TrimSpace(string(b))
	}, cpuV1
}

// The snapshotter key: with "native" the image (unpacked into overlayfs only) is
// unpacked on first use, the sandbox's snapshot is a native one, and Remove deletes
// it. The image is a variant of the test image made for this run, so that its layer
// cannot be in native already: containerd 1.6 can keep a removed child's reference
// on a committed layer, which then refuses removal, so the test makes no attempt to
// empty native of what earlier runs left.
func TestSnapshotterNative(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		d := containerd.New(containerd.WithAddress(addr), containerd.WithNamespace(testNamespace), containerd.WithSnapshotter("native"))
		defer d.Close()
		marker := strconv.FormatInt(time.Now().UnixNano(), 36)
		archive, err := testimage.Variant("berth-test/native:"+marker, marker)
		if err != nil {
			t.Fatal(err)
		}
		refs, err := f.d.ImportImage(f.ctx, bytes.NewReader(archive))
		if err != nil || len(refs) != 1 {
			t.Fatalf("importing the variant %s: %v %v, want one image", marker, refs, err)
		}
		ref := refs[0]
		// Deleting the image lets containerd's garbage collector take its layers
		// (in overlayfs and native) once the sandbox is gone.
		t.Cleanup(func() {
			if err := f.cli.ImageService().Delete(context.WithoutCancel(f.ctx), "docker.io/"+ref, images.SynchronousDelete()); err != nil {
				t.Errorf("deleting %s: %v", ref, err)
			}
		})
		native := f.cli.SnapshotService("native")
		var before int
		native.Walk(f.ctx, func(ctx context.Context, info snapshots.Info) error {
			before++
			return nil
		})
		name := conformance.SandboxName()
		req := f.request(name)
		req.Spec.Image = ref
		if _, err := d.Create(f.ctx, req); err != nil {
			t.Fatalf("Create with snapshotter native: %v", err)
		}
		if info, err := native.Stat(f.ctx, name); err != nil {
			t.Errorf("no native snapshot %s: %v", name, err)
		} else if _, err := native.Stat(f.ctx, info.Parent); err != nil {
			t.Errorf("the native snapshot's parent %q (the unpacked layer): %v", info.Parent, err)
		}
		var after int
		native.Walk(f.ctx, func(ctx context.Context, info snapshots.Info) error {
			after++
			return nil
		})
		if after != before+2 {
			t.Errorf("native has %d snapshots after Create, %d before; want the layer unpacked and the sandbox's own", after, before)
		}
		var out bytes.Buffer
		p, err := f.exec(name, backend.ExecRequest{Argv: []string{"cat", "/etc/hostname", "/etc/berth-variant"}, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 || out.String() != "berth-test\n"+marker {
			t.Errorf("cat /etc/hostname /etc/berth-variant of the image: %+v %v %q, want berth-test and %s", res, err, out.String(), marker)
		}
		if err := d.Remove(f.ctx, name); err != nil {
			t.Fatal(err)
		}
		if _, err := native.Stat(f.ctx, name); !cerrdefs.IsNotFound(err) {
			t.Errorf("native snapshot %s after Remove: %v, want not found", name, err)
		}
	})
}

// Two drivers (as two berth processes would) creating the same sandbox at once both
// succeed with the one container and task: the loser of the container race adopts it,
// and whichever loses the task race waits for the winner's agent.
func TestConcurrentCreateAcrossDrivers(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		other := newDriver(addr)
		defer other.Close()
		for round := 0; round < 5; round++ {
			name := conformance.SandboxName()
			req := f.request(name)
			start := make(chan struct{})
			type result struct {
				sb  backend.Sandbox
				err error
			}
			results := make(chan result, 2)
			for _, d := range []*containerd.Driver{f.d, other} {
				go func() {
					<-start
					sb, err := d.Create(f.ctx, req)
					results <- result{sb, err}
				}()
			}
			close(start)
			adopted := 0
			var errs []error
			for i := 0; i < 2; i++ { // both, before any Fatal: the cleanup must not race a Create
				r := <-results
				if r.err != nil {
					errs = append(errs, r.err)
				}
				if r.sb.Adopted {
					adopted++
				}
			}
			if len(errs) > 0 {
				t.Fatalf("round %d: concurrent Creates: %v", round, errs)
			}
			if adopted != 1 {
				t.Errorf("round %d: %d of the two Creates adopted, want exactly one", round, adopted)
			}
			for range 2 {
				var out bytes.Buffer
				p, err := f.exec(name, backend.ExecRequest{Argv: []string{"echo", "ok"}, Stdout: &out})
				if err != nil {
					t.Fatalf("round %d: Exec: %v", round, err)
				}
				if res, err := p.Wait(); err != nil || res.ExitCode != 0 || out.String() != "ok\n" {
					t.Errorf("round %d: exec after concurrent Creates: %+v %v %q", round, res, err, out.String())
				}
			}
			if err := f.d.Remove(f.ctx, name); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Remove deletes the sandbox's lock file (STATE/drivers/containerd/locks/NAME.lock)
// under the lock: the state dir keeps no lock file per sandbox ever made. A Remove of
// a sandbox that does not exist leaves none either.
func TestRemoveDeletesLockFile(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		d := newDriver(addr)
		defer d.Close()
		state := filepath.Join(t.TempDir(), "drivers", "containerd")
		if err := d.Configure(f.ctx, backend.DriverSetup{StateDir: state, Owner: f.owner}); err != nil {
			t.Fatal(err)
		}
		name := conformance.SandboxName()
		lockPath := filepath.Join(state, "locks", name+".lock")
		if _, err := d.Create(f.ctx, f.request(name)); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(lockPath); err != nil {
			t.Fatalf("Create made no lock file %s: %v", lockPath, err)
		}
		if err := d.Remove(f.ctx, name); err != nil {
			t.Fatal(err)
		}
		f.absent(name)
		if _, err := os.Stat(lockPath); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("lock file after Remove: %v; want it deleted", err)
		}
		missing := conformance.SandboxName()
		if err := d.Remove(f.ctx, missing); err != nil {
			t.Fatal(err)
		}
		if left, _ := filepath.Glob(filepath.Join(state, "locks", "*")); len(left) > 0 {
			t.Errorf("lock files left in %s: %v", filepath.Join(state, "locks"), left)
		}
	})
}
