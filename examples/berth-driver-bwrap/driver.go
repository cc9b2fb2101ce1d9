package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

// Name is the driver's name in config (driver = "bwrap").
const Name = "bwrap"

// Version is the driver's own version, reported by Info and describe.
const Version = "0.1.0"

// Paths inside every sandbox.
const (
	// HomeDir is the sandbox's HOME and default working directory, backed by a
	// private host directory per sandbox.
	HomeDir = "/home/sandbox"
	// defaultPath is the PATH execs start with.
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// startTimeout bounds how long Create waits for a new sandbox's agent to be ready.
const startTimeout = 10 * time.Second

// Driver is the bubblewrap driver. Each sandbox is one detached bwrap process whose
// first process (PID 1 of a new PID namespace) is berth's agent, which berth reaches
// itself through the socket directory it prepared (Capabilities.Agent "socket";
// DialAgent offers the same socket through the plugin), so the driver itself only
// does lifecycle and placement. It is safe for concurrent use, and several plugin processes may share
// one state dir (Create and Remove take a per-sandbox file lock).
type Driver struct {
	mu       sync.Mutex
	stateDir string
	owner    string
	bwrap    string
	roBinds  []string
}

var (
	_ backend.TerminalBackend = (*Driver)(nil)
	_ backend.Configurer      = (*Driver)(nil)
	_ backend.AgentDialer     = (*Driver)(nil)
)

// New returns an unconfigured driver; the host calls Configure before any sandbox
// call (berth does so with the driver's state dir and its driver "bwrap" {} block).
func New() *Driver { return &Driver{} }

// Info reports the driver's capabilities, honestly: a private root filesystem (host
// /usr read-only, private writable home and /tmp), its own PID, IPC, UTS and network
// namespaces, every Linux capability dropped, TTYs, copy and stop/start persistence;
// no resource limits (bwrap sets none), no per-exec user, no images.
func (d *Driver) Info(ctx context.Context) (backend.Info, error) {
	return backend.Info{
		Name:             Name,
		Version:          Version,
		ProtocolVersions: []int{backend.ProtocolVersion},
		Capabilities: backend.Capabilities{
			FSIsolation:      backend.FSIsolationPrivate,
			PIDIsolation:     true,
			NetworkModes:     []string{"none", "host"},
			TTY:              true,
			DropCapabilities: true,
			StopStart:        true,
			Agent:            backend.AgentSocket, // shell mode, jobs and copy come with berth's agent
		},
	}, nil
}

// ConfigSchema declares the driver "bwrap" {} block: bwrap (path of the bwrap
// executable, default found in PATH) and ro_binds (extra host paths mounted
// read-only at the same place in every sandbox).
func (d *Driver) ConfigSchema(ctx context.Context) ([]backend.ConfigField, error) {
	return []backend.ConfigField{
		{Name: "bwrap", Type: "string", Description: "path of the bwrap executable (default: bwrap found in PATH)"},
		{Name: "ro_binds", Type: "list(string)", Description: "absolute host paths mounted read-only at the same path in every sandbox"},
	}, nil
}

// Configure applies the config block and the state dir. Errors wrap
// backend.ErrInvalid and name the setting and the fix.
func (d *Driver) Configure(ctx context.Context, setup backend.DriverSetup) error {
	var cfg struct {
		Bwrap   string   `json:"bwrap"`
		ROBinds []string `json:"ro_binds"`
	}
	if len(setup.Config) > 0 {
		if err := json.Unmarshal(setup.Config, &cfg); err != nil {
			return backend.Errorf(backend.ErrInvalid, "driver %q config: %v", Name, err)
		}
	}
	if setup.StateDir == "" {
		return backend.Errorf(backend.ErrInvalid, "driver %q: no state dir given", Name)
	}
	bw := cfg.Bwrap
	if bw == "" {
		p, err := exec.LookPath("bwrap")
		if err != nil {
			return backend.Errorf(backend.ErrUnavailable, "driver %q: bwrap is not in PATH; install bubblewrap (apt-get install bubblewrap) or set bwrap = \"/path/to/bwrap\" in driver %q {}", Name, Name)
		}
		bw = p
	} else if fi, err := os.Stat(bw); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return backend.Errorf(backend.ErrInvalid, "driver %q: bwrap = %q is not an executable file; fix the path or install bubblewrap", Name, bw)
	}
	for _, p := range cfg.ROBinds {
		if !filepath.IsAbs(p) {
			return backend.Errorf(backend.ErrInvalid, "driver %q: ro_binds entry %q is not an absolute path", Name, p)
		}
		if _, err := os.Stat(p); err != nil {
			return backend.Errorf(backend.ErrInvalid, "driver %q: ro_binds entry %q: %v; remove it or create it", Name, p, err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stateDir, d.owner, d.bwrap, d.roBinds = setup.StateDir, setup.Owner, bw, cfg.ROBinds
	return nil
}

// meta is what the driver records about one sandbox, in a directory the sandbox
// cannot write (its writable directories are below it, mounted elsewhere).
type meta struct {
	Name    string              `json:"name"`
	Labels  map[string]string   `json:"labels"`
	Created time.Time           `json:"created"`
	Spec    backend.SandboxSpec `json:"spec"`
	Agent   backend.AgentFiles  `json:"agent"`
	// BwrapPID is the detached bwrap process; InitPID the sandbox's PID 1 (the
	// agent) as the host sees it. Each with its start time in clock ticks, so a
	// reused pid is never mistaken for them.
	BwrapPID   int    `json:"bwrap_pid"`
	BwrapTicks uint64 `json:"bwrap_ticks"`
	InitPID    int    `json:"init_pid"`
	InitTicks  uint64 `json:"init_ticks"`
}

func (m *meta) sandbox(dir string, st backend.State) backend.Sandbox {
	labels := make(map[string]string, len(m.Labels))
	for k, v := range m.Labels {
		labels[k] = v
	}
	return backend.Sandbox{Name: m.Name, ID: dir, State: st, Labels: labels, CreatedAt: m.Created}
}

func (d *Driver) root() (string, error) {
	d.mu.Lock()
	dir := d.stateDir
	d.mu.Unlock()
	if dir == "" {
		return "", backend.Errorf(backend.ErrInvalid, "driver %q is not configured: the host must call Configure first", Name)
	}
	return filepath.Join(dir, "sandboxes"), nil
}

func (d *Driver) sandboxDir(name string) (string, error) {
	if err := backend.ValidateSandboxName(name); err != nil {
		return "", err
	}
	root, err := d.root()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, name), nil
}

func readMeta(dir string) (*meta, error) {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, backend.Errorf(backend.ErrNotFound, "bwrap sandbox %s: not found", filepath.Base(dir))
	}
	if err != nil {
		return nil, fmt.Errorf("bwrap sandbox %s: %w", filepath.Base(dir), err)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("bwrap sandbox %s: corrupt meta.json: %w; remove %s", filepath.Base(dir), err, dir)
	}
	return &m, nil
}

func writeMeta(dir string, m *meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".meta.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "meta.json"))
}

// lock takes an exclusive flock on the sandbox's lock file and returns its release.
func lock(ctx context.Context, root, name string) (func(), error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("bwrap: state dir %s: %w", root, err)
	}
	f, err := os.OpenFile(filepath.Join(root, "."+name+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("bwrap: lock %s: %w", name, err)
	}
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { close(done) })
	defer stop()
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("bwrap: lock %s: %w", name, err)
		}
		select {
		case <-done:
			f.Close()
			return nil, backend.Errorf(backend.ErrTimeout, "bwrap: waiting for the lock of sandbox %s: %v", name, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// checkSpec refuses what the driver cannot honour, each with the fix.
func checkSpec(spec backend.SandboxSpec) error {
	n := spec.Name
	if spec.Image != "" {
		return backend.Errorf(backend.ErrUnsupported, "bwrap sandbox %s: image %q: the bwrap driver builds sandboxes from the host's /usr, not from images; remove image from the rule", n, spec.Image)
	}
	if spec.Resources.Limited() {
		return backend.Errorf(backend.ErrUnsupported, "bwrap sandbox %s: resource limits are not supported by the bwrap driver (bubblewrap sets none); remove resources from the rule or use docker or containerd", n)
	}
	if spec.User != "" {
		return backend.Errorf(backend.ErrUnsupported, "bwrap sandbox %s: user %q: the bwrap driver runs commands as the invoking user; remove user from the rule", n, spec.User)
	}
	switch spec.Network {
	case "", "none", "host":
	default:
		return backend.Errorf(backend.ErrUnsupported, "bwrap sandbox %s: network %q is not supported; use \"none\" (the default) or \"host\"", n, spec.Network)
	}
	if spec.Workdir != "" && !filepath.IsAbs(spec.Workdir) {
		return backend.Errorf(backend.ErrInvalid, "bwrap sandbox %s: workdir %q is not an absolute path", n, spec.Workdir)
	}
	for _, kv := range spec.Env {
		if !strings.Contains(kv, "=") {
			return backend.Errorf(backend.ErrInvalid, "bwrap sandbox %s: env entry %q is not KEY=VALUE", n, kv)
		}
	}
	for _, m := range spec.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
			return backend.Errorf(backend.ErrInvalid, "bwrap sandbox %s: mount %s -> %s: both paths must be absolute", n, m.Source, m.Target)
		}
		if !spec.AllowHostPaths && sensitive(m.Source) {
			return backend.Errorf(backend.ErrInvalid, "bwrap sandbox %s: mount source %s is a sensitive host path; set allow_host_paths = true in the rule if you mean it", n, m.Source)
		}
		if _, err := os.Stat(m.Source); err != nil {
			return backend.Errorf(backend.ErrInvalid, "bwrap sandbox %s: mount source %s: %v; create it or fix the rule", n, m.Source, err)
		}
	}
	return nil
}

// sensitive reports host paths that a sandbox must not get by accident: the
// root, the kernel's interfaces and container engine sockets.
func sensitive(p string) bool {
	p = filepath.Clean(p)
	switch p {
	case "/", "/proc", "/sys", "/dev", "/etc", "/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock":
		return true
	}
	return false
}

// Create makes the sandbox's directories and starts its bwrap with the agent as PID 1,
// or adopts an existing sandbox of the same name and owner (starting it when stopped).
// A sandbox of another owner is ErrConflict; a failed Create of a new sandbox removes
// what it made.
func (d *Driver) Create(ctx context.Context, req backend.CreateRequest) (backend.Sandbox, error) {
	spec := req.Spec
	dir, err := d.sandboxDir(spec.Name)
	if err != nil {
		return backend.Sandbox{}, err
	}
	if err := checkSpec(spec); err != nil {
		return backend.Sandbox{}, err
	}
	if req.Agent.Binary == "" || req.Agent.Dir == "" || req.Agent.SocketDir == "" {
		return backend.Sandbox{}, backend.Errorf(backend.ErrInvalid, "bwrap sandbox %s: no agent files given (the host prepares them)", spec.Name)
	}
	unlock, err := lock(ctx, filepath.Dir(dir), spec.Name)
	if err != nil {
		return backend.Sandbox{}, err
	}
	defer unlock()

	m, err := readMeta(dir)
	switch {
	case err == nil:
		if m.Labels[backend.LabelOwner] != spec.Labels[backend.LabelOwner] {
			return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "bwrap sandbox %s belongs to owner %q, not %q", spec.Name, m.Labels[backend.LabelOwner], spec.Labels[backend.LabelOwner])
		}
		if !alive(m.InitPID, m.InitTicks) {
			m.Agent = req.Agent // the host may have swapped the agent while stopped
			if err := d.start(ctx, dir, m); err != nil {
				return backend.Sandbox{}, err
			}
		}
		sb := m.sandbox(dir, backend.StateRunning)
		sb.Adopted = true
		return sb, nil
	case !errors.Is(err, backend.ErrNotFound):
		return backend.Sandbox{}, err
	}

	if _, err := os.Lstat(dir); err == nil {
		// A directory without meta.json: a Create that crashed half-way.
		if err := removeAll(dir); err != nil {
			return backend.Sandbox{}, fmt.Errorf("bwrap sandbox %s: clearing a half-created directory: %w", spec.Name, err)
		}
	}
	m = &meta{Name: spec.Name, Labels: spec.Labels, Created: time.Now().UTC(), Spec: spec, Agent: req.Agent}
	if err := makeDirs(dir, spec.Name); err != nil {
		removeAll(dir)
		return backend.Sandbox{}, fmt.Errorf("bwrap sandbox %s: %w", spec.Name, err)
	}
	if err := writeMeta(dir, m); err != nil {
		removeAll(dir)
		return backend.Sandbox{}, fmt.Errorf("bwrap sandbox %s: %w", spec.Name, err)
	}
	if err := d.start(ctx, dir, m); err != nil {
		removeAll(dir)
		return backend.Sandbox{}, err
	}
	return m.sandbox(dir, backend.StateRunning), nil
}

// makeDirs makes the sandbox's host directories: home and tmp (writable by the
// sandbox), and etc (read-only in it: passwd, group, hosts, hostname).
func makeDirs(dir, name string) error {
	for _, sub := range []string{"home", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(dir, "etc"), 0o755); err != nil {
		return err
	}
	uid, gid := os.Getuid(), os.Getgid()
	files := map[string]string{
		"passwd":        fmt.Sprintf("root:x:0:0:root:%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", HomeDir),
		"group":         "root:x:0:\nnogroup:x:65534:\n",
		"hosts":         "127.0.0.1\tlocalhost " + hostname(name) + "\n::1\tlocalhost\n",
		"hostname":      hostname(name) + "\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
	}
	if uid != 0 {
		files["passwd"] += fmt.Sprintf("user:x:%d:%d:user:%s:/bin/sh\n", uid, gid, HomeDir)
		files["group"] += fmt.Sprintf("user:x:%d:\n", gid)
	}
	for f, content := range files {
		if err := os.WriteFile(filepath.Join(dir, "etc", f), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// hostname is the sandbox's host name: its name, cut to 63 characters.
func hostname(name string) string {
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// Inspect reports the sandbox's state: running while its agent (PID 1) lives,
// stopped otherwise. A missing sandbox is ErrNotFound.
func (d *Driver) Inspect(ctx context.Context, name string) (backend.Sandbox, error) {
	dir, err := d.sandboxDir(name)
	if err != nil {
		return backend.Sandbox{}, err
	}
	m, err := readMeta(dir)
	if err != nil {
		return backend.Sandbox{}, err
	}
	return m.sandbox(dir, state(m)), nil
}

func state(m *meta) backend.State {
	if alive(m.InitPID, m.InitTicks) {
		return backend.StateRunning
	}
	return backend.StateStopped
}

// List returns the sandboxes whose labels contain filter.
func (d *Driver) List(ctx context.Context, filter map[string]string) ([]backend.Sandbox, error) {
	root, err := d.root()
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bwrap: list %s: %w", root, err)
	}
	var out []backend.Sandbox
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		m, err := readMeta(dir)
		if err != nil || !backend.MatchLabels(m.Labels, filter) {
			continue
		}
		out = append(out, m.sandbox(dir, state(m)))
	}
	return out, nil
}

// Stop asks the agent to end every process (SIGTERM, SIGKILL after grace) and waits
// for the sandbox's PID 1, and so its whole PID namespace and its bwrap, to be gone;
// an agent that does not answer is killed. The directories stay. A missing or
// stopped sandbox succeeds.
func (d *Driver) Stop(ctx context.Context, name string, grace time.Duration) error {
	dir, err := d.sandboxDir(name)
	if err != nil {
		return err
	}
	m, err := readMeta(dir)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return d.stop(ctx, m, grace)
}

// Remove stops the sandbox and deletes its directories. A missing sandbox succeeds.
func (d *Driver) Remove(ctx context.Context, name string) error {
	dir, err := d.sandboxDir(name)
	if err != nil {
		return err
	}
	unlock, err := lock(ctx, filepath.Dir(dir), name)
	if err != nil {
		return err
	}
	defer unlock()
	m, err := readMeta(dir)
	switch {
	case err == nil:
		if err := d.stop(ctx, m, 0); err != nil {
			return err
		}
	case !errors.Is(err, backend.ErrNotFound):
		return err
	}
	if err := removeAll(dir); err != nil {
		return fmt.Errorf("bwrap sandbox %s: remove %s: %w", name, dir, err)
	}
	os.Remove(filepath.Join(filepath.Dir(dir), "."+name+".lock"))
	return nil
}

// DialAgent connects to the agent of the running sandbox name through the socket in
// its socket directory; berth presents the sandbox's token over it. Errors: a
// missing sandbox (ErrNotFound), a stopped one (ErrConflict), those of the dial.
func (d *Driver) DialAgent(ctx context.Context, name string) (net.Conn, error) {
	dir, err := d.sandboxDir(name)
	if err != nil {
		return nil, err
	}
	m, err := readMeta(dir)
	if err != nil {
		return nil, err
	}
	if !alive(m.InitPID, m.InitTicks) {
		return nil, backend.Errorf(backend.ErrConflict, "bwrap sandbox %s is stopped; start it with Create", name)
	}
	return agent.DialSocketDir(m.Agent.SocketDir)(ctx)
}

// Close releases nothing: the driver keeps no connections. Sandboxes keep running.
func (d *Driver) Close() error { return nil }

// removeAll deletes dir even when the sandbox left read-only directories in it.
func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
