package containerd_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	cerrdefs "github.com/containerd/errdefs"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/containerd"
	"github.com/berth-sh/berth/internal/containerutil"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

func TestConfigRefused(t *testing.T) {
	for _, c := range []struct{ cfg, words string }{
		{`{"address":"tcp://127.0.0.1:2375"}`, "unix socket"},
		{`{"address":"relative.sock"}`, "absolute path"},
		{`{"namespace":"no spaces"}`, "namespace"},
		{`{"namespace":"-dash"}`, "namespace"},
		{`{"snapshotter":"a/b"}`, "snapshotter"},
		{`{"runtime":"io containerd"}`, "runtime"},
		{`{"address":1}`, "config"},
		{`{"seccomp":"strict"}`, "neither \"native\", \"docker\", \"unconfined\" nor the absolute path"},
		{`{"seccomp":"profile.json"}`, "absolute path of a JSON profile"},
	} {
		d := containerd.New()
		err := d.Configure(context.Background(), backend.DriverSetup{Config: []byte(c.cfg)})
		if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), c.words) {
			t.Errorf("config %s: %v, want ErrInvalid mentioning %q", c.cfg, err, c.words)
		}
	}
	d := containerd.New(containerd.WithAddress("tcp://127.0.0.1:1"))
	if _, err := d.List(context.Background(), nil); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("WithAddress(tcp://...): List: %v, want ErrInvalid", err)
	}
	schema, err := containerd.New().ConfigSchema(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, f := range schema {
		keys = append(keys, f.Name)
	}
	if strings.Join(keys, ",") != "address,namespace,snapshotter,runtime,runtimes,seccomp" {
		t.Errorf("config keys %v, want address, namespace, snapshotter, runtime, runtimes, seccomp", keys)
	}
	// A profile file is read by Validate (config check) and at Create, not by
	// Configure: one that went missing must not lock the user out of rm and stop.
	validSpec := backend.SandboxSpec{Name: "b-validate", Image: testimage.Ref}
	for _, c := range []struct{ file, words string }{
		{"/nonexistent/profile.json", "no such file"},
		{badProfile(t, `{"defaultAction": "SCMP_ACT_ERRNO", "syscals": []}`), `unknown field "syscals"`},
		{badProfile(t, `{"syscalls": []}`), "no defaultAction"},
		{badProfile(t, `[1]`), "not an OCI seccomp object"},
		{badProfile(t, `{"defaultAction": "SCMP_ACT_ALLOW"} {"x": 1}`), "more than one JSON value"},
		{badProfile(t, `{"defaultAction": "SCMP_ACT_KILL"}`), "use SCMP_ACT_KILL_PROCESS"},
		{badProfile(t, `{"defaultAction": "SCMP_ACT_BOGUS"}`), `"SCMP_ACT_BOGUS" is not an action`},
		{badProfile(t, `{"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_Z80"]}`), `"SCMP_ARCH_Z80"`},
		{badProfile(t, `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]}`), "syscalls[0] (mkdir) action SCMP_ACT_NOTIFY"},
		{badProfile(t, `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_KILL_THREAD"}]}`), "ends only the calling thread"},
	} {
		d := containerd.New()
		cfg := `{"seccomp":"` + c.file + `"}`
		if err := d.Configure(context.Background(), backend.DriverSetup{Config: []byte(cfg)}); err != nil {
			t.Errorf("Configure(%s): %v; want the file left to Validate and Create", cfg, err)
		}
		if err := d.Validate(context.Background(), validSpec); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), c.words) || !strings.Contains(err.Error(), c.file) {
			t.Errorf("Validate of %s: %v, want ErrInvalid naming the file and mentioning %q", cfg, err, c.words)
		}
	}
	good := containerd.New(containerd.WithSeccomp(badProfile(t, `{"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86_64"], "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]}`)))
	if err := good.Validate(context.Background(), validSpec); err != nil {
		t.Errorf("Validate of a good profile: %v", err)
	}
	// A bad WithSeccomp is refused by Create before anything is made.
	d = containerd.New(containerd.WithAddress("/nonexistent/containerd.sock"), containerd.WithSeccomp("strict"))
	if _, err := d.Create(context.Background(), backend.CreateRequest{Spec: backend.SandboxSpec{Name: "x", Image: testimage.Ref}, Agent: backend.AgentFiles{Dir: "/a", SocketDir: "/s", Binary: "/a/" + backend.AgentBinaryName, Static: true}}); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "seccomp") {
		t.Errorf("WithSeccomp(strict): Create: %v, want ErrInvalid naming seccomp", err)
	}
}

// badProfile writes a seccomp profile file with content and returns its path.
func badProfile(t *testing.T, content string) string {
	p := filepath.Join(t.TempDir(), "profile.json")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDaemonDown(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nothing.sock")
	for _, addr := range []string{sock, "unix://" + sock} {
		d := containerd.New(containerd.WithAddress(addr))
		ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
		_, err := d.Inspect(ctx, "b-some-sandbox")
		cancel()
		d.Close()
		if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "runtimes.sh") {
			t.Errorf("Inspect with no daemon at %s: %v, want ErrUnavailable naming %s and how to start one", addr, err, sock)
		}
		// Refused at once, not after waiting out the context.
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Inspect with no daemon waited for its context: %v", err)
		}
	}
}

// TestInfoChecksDaemon: a configured driver's Info says that its daemon does not
// answer (ErrUnavailable, naming the address), for a missing socket at once and for a
// hung daemon within HealthTimeout; before Configure, Info only describes the driver.
func TestInfoChecksDaemon(t *testing.T) {
	testimage.CheckInfoHealth(t, containerd.Name, containerd.HealthTimeout, func(sock string) backend.TerminalBackend {
		return containerd.New(containerd.WithAddress(sock))
	})
}

// fixture is a driver on one daemon with agent files for new sandboxes, and a raw
// client on the test namespace to look behind the driver's back.
type fixture struct {
	t     *testing.T
	addr  string
	d     *containerd.Driver
	cli   *client.Client
	ctx   context.Context // in testNamespace
	state string
	bin   agent.Binary
	owner string
	mu    sync.Mutex
	files map[string]backend.AgentFiles // by sandbox name, as request made them
}

func newFixture(t *testing.T, addr string) *fixture {
	f := &fixture{t: t, addr: addr, d: newDriver(addr), state: t.TempDir(), owner: "badinput-" + filepath.Base(t.TempDir()), files: map[string]backend.AgentFiles{}}
	t.Cleanup(func() { f.d.Close() })
	var err error
	if f.cli, err = client.New(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	f.ctx = namespaces.WithNamespace(ctx, testNamespace)
	if f.bin, err = agent.Install(f.state, berthBin); err != nil {
		t.Fatal(err)
	}
	before := takeInventory(t, addr)
	t.Cleanup(func() { checkNoLeaks(t, addr, before) })
	return f
}

func (f *fixture) request(name string) backend.CreateRequest {
	files, err := agent.PrepareSandbox(filepath.Join(f.state, "sandboxes", name), f.bin)
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.files[name] = files
	f.mu.Unlock()
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.d.Remove(ctx, name); err != nil && !errors.Is(err, backend.ErrConflict) {
			f.t.Errorf("cleanup: Remove(%s): %v", name, err)
		}
	})
	return backend.CreateRequest{
		Spec:  backend.SandboxSpec{Name: name, Image: testimage.Ref, Labels: map[string]string{backend.LabelOwner: f.owner}},
		Agent: files,
	}
}

// exec starts req in sandbox name through its agent, as the host does (the
// sandbox's agent files are those request made).
func (f *fixture) exec(name string, req backend.ExecRequest) (backend.Process, error) {
	f.mu.Lock()
	files, ok := f.files[name]
	f.mu.Unlock()
	if !ok {
		f.t.Fatalf("sandbox %s was not made by the fixture", name)
	}
	return agent.Exec(f.ctx, files, req)
}

// absent fails the test when a container, task or snapshot called name exists.
func (f *fixture) absent(name string) {
	f.t.Helper()
	if _, err := f.cli.LoadContainer(f.ctx, name); !cerrdefs.IsNotFound(err) {
		f.t.Errorf("container %s: %v after a refused Create, want not found", name, err)
	}
	if _, err := f.cli.TaskService().Get(f.ctx, &tasksapi.GetRequest{ContainerID: name}); err == nil {
		f.t.Errorf("task %s exists after a refused Create", name)
	}
	if _, err := f.cli.SnapshotService(containerd.DefaultSnapshotter).Stat(f.ctx, name); !cerrdefs.IsNotFound(err) {
		f.t.Errorf("snapshot %s: %v after a refused Create, want not found", name, err)
	}
}

// The driver refuses a mount that is, contains or lies inside berth's state dir,
// which it derives from DriverSetup.StateDir (STATE/drivers/containerd), and the
// sandbox's own host dir, as defence behind the registry's check: the state dir
// holds every sandbox's agent socket.
func TestMountExposingStateDirRefused(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		if err := f.d.Configure(f.ctx, backend.DriverSetup{StateDir: filepath.Join(f.state, "drivers", "containerd"), Owner: f.owner}); err != nil {
			t.Fatal(err)
		}
		for i := range testimage.StateDirMounts(f.state, "") {
			name := conformance.SandboxName()
			req := f.request(name)
			m := testimage.StateDirMounts(f.state, req.Agent.SocketDir)[i]
			req.Spec.Mounts = []backend.Mount{{Source: m.Source, Target: "/mnt", ReadOnly: true}}
			_, err := f.d.Create(f.ctx, req)
			testimage.CheckMountRefused(t, m, err)
			f.absent(name)
		}
	})
}

func TestBadInput(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		sock := strings.TrimPrefix(addr, "unix://")
		stray := filepath.Join(t.TempDir(), "daemon.sock") // a socket no list names
		l, err := net.Listen("unix", stray)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cases := []struct {
			name  string
			edit  func(*backend.CreateRequest)
			kind  error
			words string
		}{
			{"missing-image", func(r *backend.CreateRequest) { r.Spec.Image = "berth-test/no-such-image:1" }, backend.ErrNotFound, "berth-test/no-such-image:1"},
			{"no-image", func(r *backend.CreateRequest) { r.Spec.Image = "" }, backend.ErrInvalid, "image"},
			{"bad-image-ref", func(r *backend.CreateRequest) { r.Spec.Image = "UPPER/Case::x" }, backend.ErrInvalid, "UPPER/Case::x"},
			{"dynamic-agent", func(r *backend.CreateRequest) { r.Agent.Static = false }, backend.ErrInvalid, "CGO_ENABLED=0"},
			{"no-agent", func(r *backend.CreateRequest) { r.Agent = backend.AgentFiles{} }, backend.ErrInvalid, "agent"},
			{"mount-missing", func(r *backend.CreateRequest) {
				r.Spec.Mounts = []backend.Mount{{Source: "/nonexistent/berth-src", Target: "/mnt"}}
			}, backend.ErrInvalid, "/nonexistent/berth-src"},
			{"mount-relative", func(r *backend.CreateRequest) { r.Spec.Mounts = []backend.Mount{{Source: "/tmp", Target: "mnt"}} }, backend.ErrInvalid, "absolute"},
			{"mount-reserved", func(r *backend.CreateRequest) {
				r.Spec.Mounts = []backend.Mount{{Source: "/tmp", Target: "/.berth/run"}}
			}, backend.ErrInvalid, "reserved"},
			{"mount-root", func(r *backend.CreateRequest) { r.Spec.Mounts = []backend.Mount{{Source: "/", Target: "/host"}} }, backend.ErrInvalid, "allow_host_paths"},
			{"mount-socket", func(r *backend.CreateRequest) {
				r.Spec.Mounts = []backend.Mount{{Source: sock, Target: "/run/containerd.sock"}}
			}, backend.ErrInvalid, "containerd socket"},
			{"mount-socket-dir", func(r *backend.CreateRequest) {
				r.Spec.Mounts = []backend.Mount{{Source: filepath.Dir(sock), Target: "/sock"}}
			}, backend.ErrInvalid, "containerd socket"},
			{"mount-ttrpc-socket", func(r *backend.CreateRequest) {
				r.Spec.Mounts = []backend.Mount{{Source: sock + ".ttrpc", Target: "/run/ttrpc.sock"}}
			}, backend.ErrInvalid, "mount source " + sock + ".ttrpc"},
			{"mount-any-socket", func(r *backend.CreateRequest) {
				r.Spec.Mounts = []backend.Mount{{Source: stray, Target: "/run/daemon.sock"}}
			}, backend.ErrInvalid, "mount source " + stray + " is a unix socket"},
			{"low-pids", func(r *backend.CreateRequest) { r.Spec.Resources.Pids = 3 }, backend.ErrInvalid, fmt.Sprintf("pids 3 is below the minimum of %d", containerutil.MinPids)},
			{"unknown-user", func(r *backend.CreateRequest) { r.Spec.User = "nosuchuser" }, backend.ErrInvalid, "nosuchuser"},
			{"bad-user", func(r *backend.CreateRequest) { r.Spec.User = "1:2:3" }, backend.ErrInvalid, "1:2:3"},
			{"bad-memory", func(r *backend.CreateRequest) { r.Spec.Resources.MemoryBytes = 1024 }, backend.ErrInvalid, "memory"},
			{"negative-pids", func(r *backend.CreateRequest) { r.Spec.Resources.Pids = -1 }, backend.ErrInvalid, "negative"},
			{"bad-env", func(r *backend.CreateRequest) { r.Spec.Env = []string{"NOEQUALS"} }, backend.ErrInvalid, "NOEQUALS"},
			{"token-env", func(r *backend.CreateRequest) { r.Spec.Env = []string{"BERTH_AGENT_TOKEN=x"} }, backend.ErrInvalid, "BERTH_AGENT_TOKEN is berth's own"},
			{"relative-workdir", func(r *backend.CreateRequest) { r.Spec.Workdir = "work" }, backend.ErrInvalid, "workdir"},
			{"bad-network", func(r *backend.CreateRequest) { r.Spec.Network = "bridge" }, backend.ErrUnsupported, "bridge"},
			{"bad-name", func(r *backend.CreateRequest) { r.Spec.Name = "Bad Name" }, backend.ErrInvalid, "Bad Name"},
		}
		needsCreate := []string{"missing-image", "unknown-user", "dynamic-agent", "no-agent", "engine-elsewhere"}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				name := conformance.SandboxName()
				req := f.request(name)
				c.edit(&req)
				_, err := f.d.Create(f.ctx, req)
				if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.words) {
					t.Errorf("Create: %v, want %v mentioning %q", err, c.kind, c.words)
				}
				f.absent(name)
				// Validate (config check) refuses the spec the same way, but for what needs the
				// runtime or the sandbox (the image's presence, a user name from its
				// /etc/passwd) or concerns the host's agent files.
				if !slices.Contains(needsCreate, c.name) {
					if err := f.d.Validate(f.ctx, req.Spec); !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.words) {
						t.Errorf("Validate: %v, want %v mentioning %q", err, c.kind, c.words)
					}
				}
			})
		}
		// allow_host_paths lets the socket's directory through.
		name := conformance.SandboxName()
		req := f.request(name)
		req.Spec.AllowHostPaths = true
		req.Spec.Mounts = []backend.Mount{{Source: filepath.Dir(sock), Target: "/sock", ReadOnly: true}}
		if err := f.d.Validate(f.ctx, req.Spec); err != nil {
			t.Errorf("Validate with allow_host_paths: %v", err)
		}
		if _, err := f.d.Create(f.ctx, req); err != nil {
			t.Errorf("Create with allow_host_paths: %v", err)
		}
		if err := f.d.Remove(f.ctx, name); err != nil {
			t.Errorf("Remove: %v", err)
		}
		f.absent(name)
		// The smallest pids limit accepted leaves the agent room to run commands.
		name = conformance.SandboxName()
		req = f.request(name)
		req.Spec.Resources.Pids = containerutil.MinPids
		if _, err := f.d.Create(f.ctx, req); err != nil {
			t.Fatalf("Create with pids %d: %v", containerutil.MinPids, err)
		}
		f.run(name, "sh", "-c", "for i in 1 2 3 4 5 6 7 8; do cat </dev/null & done; wait")
		if err := f.d.Remove(f.ctx, name); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
}

// A fatal start-up error of the agent, which goes to the task's null stderr, is in
// Create's error through the agent's log.
func TestAgentStartErrorReported(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		name := conformance.SandboxName()
		req := f.request(name)
		// A directory (not empty, so the driver's clean-up of a stale socket leaves it)
		// where the agent must make its socket.
		if err := os.MkdirAll(filepath.Join(req.Agent.SocketDir, backend.AgentSocketName, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := f.d.Create(f.ctx, req)
		if err == nil || !strings.Contains(err.Error(), "before its agent answered") || !strings.Contains(err.Error(), "agent log:") || !strings.Contains(err.Error(), "is not a socket") {
			t.Errorf("Create: %v, want the agent's start-up error from its log", err)
		}
		f.absent(name)
	})
}

// A container id held by a container that is not berth's is ErrConflict, and Create,
// Stop, Remove and Exec leave it alone; so is another owner's sandbox.
func TestForeignContainerUntouched(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		name := conformance.SandboxName()
		req := f.request(name)
		img, err := f.cli.GetImage(f.ctx, "docker.io/"+testimage.Ref)
		if err != nil {
			t.Fatal(err)
		}
		c, err := f.cli.NewContainer(f.ctx, name, client.WithNewSnapshot(name, img), client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sleep", "300")))
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.NewTask(f.ctx, cio.NullIO)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := namespaces.WithNamespace(context.Background(), testNamespace)
			task.Delete(ctx, client.WithProcessKill)
			c.Delete(ctx, client.WithSnapshotCleanup)
		})
		if err := task.Start(f.ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := f.d.Create(f.ctx, req); !errors.Is(err, backend.ErrConflict) {
			t.Errorf("Create over a foreign container: %v, want ErrConflict", err)
		}
		if err := f.d.Stop(f.ctx, name, 0); !errors.Is(err, backend.ErrConflict) {
			t.Errorf("Stop of a foreign container: %v, want ErrConflict", err)
		}
		if err := f.d.Remove(f.ctx, name); !errors.Is(err, backend.ErrConflict) {
			t.Errorf("Remove of a foreign container: %v, want ErrConflict", err)
		}
		st, err := task.Status(f.ctx)
		if err != nil || st.Status != client.Running {
			t.Errorf("the foreign task after berth's calls: %v %v, want running", st.Status, err)
		}
		if sbs, err := f.d.List(f.ctx, nil); err != nil {
			t.Error(err)
		} else {
			for _, sb := range sbs {
				if sb.Name == name {
					t.Errorf("List shows the foreign container %s", name)
				}
			}
		}
		// Another owner's berth container: conflict too.
		other := conformance.SandboxName()
		oreq := f.request(other)
		if _, err := f.d.Create(f.ctx, oreq); err != nil {
			t.Fatal(err)
		}
		oreq.Spec.Labels = map[string]string{backend.LabelOwner: "someone-else"}
		if _, err := f.d.Create(f.ctx, oreq); !errors.Is(err, backend.ErrConflict) || !strings.Contains(err.Error(), "someone-else") {
			t.Errorf("Create with another owner: %v, want ErrConflict naming the owners", err)
		}
		if err := f.d.Remove(f.ctx, other); err != nil {
			t.Error(err)
		}
	})
}

// A task whose agent cannot start is reported at once, and removed with its
// container and snapshot.
func TestAgentExitReported(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		f := newFixture(t, addr)
		name := conformance.SandboxName()
		req := f.request(name)
		// An agent "binary" the kernel cannot run (Static stays set: the driver does not
		// re-read the file).
		os.Remove(req.Agent.Binary)
		if err := os.WriteFile(req.Agent.Binary, []byte("not a program"), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := f.d.Create(f.ctx, req)
		if err == nil {
			t.Fatal("Create with a broken agent binary succeeded")
		}
		// Reported as the exit it is, not after waiting out the agent's start timeout.
		if !strings.Contains(err.Error(), "exited with status") {
			t.Errorf("Create with a broken agent: %v, want it to say the task exited before its agent answered", err)
		}
		t.Logf("error: %v", err)
		f.absent(name)
	})
}
