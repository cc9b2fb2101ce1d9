package docker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/docker"
	"github.com/berth-sh/berth/internal/containerutil"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

func TestRemoteHostRefused(t *testing.T) {
	for _, h := range []string{"tcp://127.0.0.1:2375", "ssh://user@box", "npipe:////./pipe/docker"} {
		d := docker.New()
		err := d.Configure(context.Background(), backend.DriverSetup{Config: []byte(`{"host":"` + h + `"}`)})
		if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "unix://") {
			t.Errorf("host %s: %v, want ErrInvalid that asks for unix://", h, err)
		}
		d = docker.New(docker.WithHost(h))
		if _, err := d.List(context.Background(), nil); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("WithHost(%s): List: %v, want ErrInvalid", h, err)
		}
	}
}

func TestDaemonDown(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nothing.sock")
	d := docker.New(docker.WithHost("unix://" + sock))
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := d.Inspect(ctx, "b-some-sandbox")
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "runtimes.sh") {
		t.Errorf("Inspect with no daemon: %v, want ErrUnavailable naming %s and how to start one", err, sock)
	}
}

// TestInfoChecksEngine: a configured driver's Info says that its engine does not
// answer (ErrUnavailable, naming the address), for a missing socket at once and for a
// hung engine within HealthTimeout; before Configure, Info only describes the driver.
func TestInfoChecksEngine(t *testing.T) {
	testimage.CheckInfoHealth(t, docker.Name, docker.HealthTimeout, func(sock string) backend.TerminalBackend {
		return docker.New(docker.WithHost("unix://" + sock))
	})
}

// fixture is a driver on the test engine with agent files for new sandboxes.
type fixture struct {
	t     *testing.T
	host  string
	d     *docker.Driver
	api   *client.Client
	state string
	bin   agent.Binary
	owner string
}

func newFixture(t *testing.T) *fixture {
	host := engine(t)
	f := &fixture{t: t, host: host, d: docker.New(docker.WithHost(host)), state: t.TempDir(), owner: "badinput-" + filepath.Base(t.TempDir())}
	t.Cleanup(func() { f.d.Close() })
	var err error
	if f.api, err = client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.api.Close() })
	if f.bin, err = agent.Install(f.state, berthBin); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) request(name string) backend.CreateRequest {
	files, err := agent.PrepareSandbox(filepath.Join(f.state, "sandboxes", name), f.bin)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		f.api.ContainerRemove(ctx, name, container.RemoveOptions{Force: true})
	})
	return backend.CreateRequest{
		Spec:  backend.SandboxSpec{Name: name, Image: testimage.Ref, Labels: map[string]string{backend.LabelOwner: f.owner}},
		Agent: files,
	}
}

// absent fails the test when a container called name exists.
func (f *fixture) absent(name string) {
	f.t.Helper()
	if _, err := f.api.ContainerInspect(context.Background(), name); err == nil {
		f.t.Errorf("container %s exists after a refused Create", name)
	}
}

func TestBadInput(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sock := strings.TrimPrefix(f.host, "unix://")
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
		{"token-env", func(r *backend.CreateRequest) { r.Spec.Env = []string{"BERTH_AGENT_TOKEN=x"} }, backend.ErrInvalid, "BERTH_AGENT_TOKEN is berth's own"},
		{"dynamic-agent", func(r *backend.CreateRequest) { r.Agent.Static = false }, backend.ErrInvalid, "CGO_ENABLED=0"},
		{"mount-missing", func(r *backend.CreateRequest) {
			r.Spec.Mounts = []backend.Mount{{Source: "/nonexistent/berth-src", Target: "/mnt"}}
		}, backend.ErrInvalid, "/nonexistent/berth-src"},
		{"mount-root", func(r *backend.CreateRequest) { r.Spec.Mounts = []backend.Mount{{Source: "/", Target: "/host"}} }, backend.ErrInvalid, "allow_host_paths"},
		{"mount-socket", func(r *backend.CreateRequest) {
			r.Spec.Mounts = []backend.Mount{{Source: sock, Target: "/var/run/docker.sock"}}
		}, backend.ErrInvalid, "Docker socket"},
		{"mount-socket-dir", func(r *backend.CreateRequest) {
			r.Spec.Mounts = []backend.Mount{{Source: filepath.Dir(sock), Target: "/sock"}}
		}, backend.ErrInvalid, "Docker socket"},
		{"mount-any-socket", func(r *backend.CreateRequest) {
			r.Spec.Mounts = []backend.Mount{{Source: stray, Target: "/run/daemon.sock"}}
		}, backend.ErrInvalid, "mount source " + stray + " is a unix socket"},
		{"low-pids", func(r *backend.CreateRequest) { r.Spec.Resources.Pids = 3 }, backend.ErrInvalid, fmt.Sprintf("pids 3 is below the minimum of %d", containerutil.MinPids)},
		{"bad-cpu-shares", func(r *backend.CreateRequest) { r.Spec.Resources.CPUShares = 1 << 20 }, backend.ErrInvalid, "cpu_shares 1048576 is outside 2..262144"},
		{"negative-memory", func(r *backend.CreateRequest) { r.Spec.Resources.MemoryBytes = -2 }, backend.ErrInvalid, `memory = "unlimited"`},
		{"engine-elsewhere", func(r *backend.CreateRequest) { // what a forwarded socket's engine sees
			// The directories the engine cannot find; the token, which the driver
			// reads on this host, beside them.
			elsewhere := t.TempDir()
			r.Agent.Dir = filepath.Join(elsewhere, "agent")
			r.Agent.Binary = filepath.Join(r.Agent.Dir, backend.AgentBinaryName)
			r.Agent.SocketDir = filepath.Join(elsewhere, "run")
			os.WriteFile(agent.TokenPath(r.Agent.Dir), []byte(strings.Repeat("ab", 32)+"\n"), 0o600)
		}, backend.ErrInvalid, "another machine or in a VM"},
		{"unknown-user", func(r *backend.CreateRequest) { r.Spec.User = "nosuchuser" }, backend.ErrInvalid, "nosuchuser"},
		{"bad-memory", func(r *backend.CreateRequest) { r.Spec.Resources.MemoryBytes = 1024 }, backend.ErrInvalid, "memory"},
		{"bad-network", func(r *backend.CreateRequest) { r.Spec.Network = "overlay-x" }, backend.ErrUnsupported, "overlay-x"},
	}
	needsCreate := []string{"missing-image", "unknown-user", "dynamic-agent", "no-agent", "engine-elsewhere"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := conformance.SandboxName()
			req := f.request(name)
			c.edit(&req)
			_, err := f.d.Create(ctx, req)
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.words) {
				t.Errorf("Create: %v, want %v mentioning %q", err, c.kind, c.words)
			}
			f.absent(name)
			// Validate (config check) refuses the spec the same way, but for what needs the
			// runtime or the sandbox (the image's presence, a user name from its
			// /etc/passwd) or concerns the host's agent files.
			if !slices.Contains(needsCreate, c.name) {
				if err := f.d.Validate(ctx, req.Spec); !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.words) {
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
	if err := f.d.Validate(ctx, req.Spec); err != nil {
		t.Errorf("Validate with allow_host_paths: %v", err)
	}
	if _, err := f.d.Create(ctx, req); err != nil {
		t.Errorf("Create with allow_host_paths: %v", err)
	}
	if err := f.d.Remove(ctx, name); err != nil {
		t.Errorf("Remove: %v", err)
	}
}

// The driver refuses a mount that is, contains or lies inside berth's state dir,
// which it derives from DriverSetup.StateDir (STATE/drivers/docker), and the
// sandbox's own host dir, as defence behind the registry's check: the state dir
// holds every sandbox's agent socket.
func TestMountExposingStateDirRefused(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := f.d.Configure(ctx, backend.DriverSetup{StateDir: filepath.Join(f.state, "drivers", "docker"), Owner: f.owner}); err != nil {
		t.Fatal(err)
	}
	for i := range testimage.StateDirMounts(f.state, "") {
		name := conformance.SandboxName()
		req := f.request(name)
		m := testimage.StateDirMounts(f.state, req.Agent.SocketDir)[i]
		req.Spec.Mounts = []backend.Mount{{Source: m.Source, Target: "/mnt", ReadOnly: true}}
		_, err := f.d.Create(ctx, req)
		testimage.CheckMountRefused(t, m, err)
		f.absent(name)
	}
}

// A name held by a container that is not berth's is ErrConflict, and Create, Stop and
// Remove leave that container alone.
func TestForeignContainerUntouched(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := conformance.SandboxName()
	req := f.request(name)
	resp, err := f.api.ContainerCreate(ctx, &container.Config{Image: testimage.Ref, Cmd: []string{"sleep", "300"}}, &container.HostConfig{NetworkMode: "none"}, nil, nil, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.api.ContainerStart(ctx, resp.ID, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.Create(ctx, req); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("Create over a foreign container: %v, want ErrConflict", err)
	}
	if err := f.d.Stop(ctx, name, 0); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("Stop of a foreign container: %v, want ErrConflict", err)
	}
	if err := f.d.Remove(ctx, name); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("Remove of a foreign container: %v, want ErrConflict", err)
	}
	info, err := f.api.ContainerInspect(ctx, name)
	if err != nil || info.ID != resp.ID || !info.State.Running {
		t.Errorf("the foreign container after berth's calls: %v running %v", err, info.State != nil && info.State.Running)
	}
	if sbs, err := f.d.List(ctx, nil); err != nil {
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
	if _, err := f.d.Create(ctx, oreq); err != nil {
		t.Fatal(err)
	}
	oreq.Spec.Labels = map[string]string{backend.LabelOwner: "someone-else"}
	if _, err := f.d.Create(ctx, oreq); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("Create with another owner: %v, want ErrConflict", err)
	}
	if err := f.d.Remove(ctx, other); err != nil {
		t.Error(err)
	}
}

// A container whose agent cannot start is reported at once with its log, and removed.
func TestAgentExitReported(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := conformance.SandboxName()
	req := f.request(name)
	// An agent "binary" the kernel cannot run (Static stays set: the driver does not
	// re-read the file).
	os.Remove(req.Agent.Binary)
	if err := os.WriteFile(req.Agent.Binary, []byte("not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := f.d.Create(ctx, req)
	if err == nil {
		t.Fatal("Create with a broken agent binary succeeded")
	}
	// Reported as the exit it is, not after waiting out the agent's start timeout.
	if !strings.Contains(err.Error(), "exited before its agent answered") {
		t.Errorf("Create with a broken agent: %v, want it to say the container exited before its agent answered", err)
	}
	t.Logf("error: %v", err)
	f.absent(name)
}
