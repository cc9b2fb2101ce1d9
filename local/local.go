// Package local is berth's host driver: a sandbox is a private directory under the
// driver's state dir (the execs' HOME and default working directory) supervised by a
// detached berth agent (its own session, a child subreaper), so a process that one call
// leaves in the background is still there for the next call and dies with the sandbox.
//
// Local isolates nothing else, and its Capabilities say so: FS isolation none, PID
// isolation none, host network only, no resource limits. Use it for the main session of
// a trusted agent; use docker or containerd where isolation matters.
package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/internal/flock"
)

// Name is the driver's name in config (`driver "local" {}`, `scope "..." { driver = "local" }`).
const Name = "local"

// init registers the driver in the catalog of drivers this program can run in
// process (catalog.Register): importing this package links it.
func init() {
	catalog.Register(Name, func() backend.TerminalBackend { return New() })
}

// Version is the driver's version string reported by Info.
const Version = "0.1.0"

// DefaultStopGrace is how long Stop waits for processes to exit after SIGTERM before
// it kills them, when the caller passes 0.
const DefaultStopGrace = time.Second

// Driver is the local driver. It is safe for concurrent use, and several processes may
// use one state dir at once: Create serialises on a per-sandbox file lock.
type Driver struct {
	mu        sync.Mutex
	stateDir  string
	owner     string
	allowlist []string
}

// Option configures a Driver built with New.
type Option func(*Driver)

// WithStateDir sets the directory in which the driver keeps its sandboxes
// (STATE/drivers/local when the registry configures it).
func WithStateDir(dir string) Option { return func(d *Driver) { d.stateDir = dir } }

// WithEnvAllowlist sets the host environment variables that every exec starts from
// (default backend.DefaultEnvAllowlist). A sandbox spec's EnvAllowlist adds to it.
func WithEnvAllowlist(names ...string) Option {
	return func(d *Driver) { d.allowlist = append([]string(nil), names...) }
}

// New returns a local driver. Without WithStateDir it must be configured through
// Configure (as the registry and the plugin host do) before any sandbox call.
func New(opts ...Option) *Driver {
	d := &Driver{allowlist: append([]string(nil), backend.DefaultEnvAllowlist...)}
	for _, o := range opts {
		o(d)
	}
	return d
}

var (
	_ backend.TerminalBackend = (*Driver)(nil)
	_ backend.Configurer      = (*Driver)(nil)
	_ backend.AgentDialer     = (*Driver)(nil)
	_ backend.Validator       = (*Driver)(nil)
)

// Info reports the local driver's capabilities: no filesystem, PID or network
// isolation and no resource limits; TTY, copy and stop/start persistence; its agents
// are reached through their sockets (and DialAgent).
func (d *Driver) Info(ctx context.Context) (backend.Info, error) {
	return backend.Info{
		Name:             Name,
		Version:          Version,
		ProtocolVersions: []int{backend.ProtocolVersion},
		Capabilities: backend.Capabilities{
			FSIsolation:  backend.FSIsolationNone,
			PIDIsolation: false,
			NetworkModes: []string{"host"},
			TTY:          true,
			Agent:        backend.AgentSocket,
			StopStart:    true,
		},
	}, nil
}

// Validate implements backend.Validator: it refuses what Create refuses before it
// starts anything (a bad name, mounts, limits, a network other than the host's, a
// user, a workdir that is not an existing absolute directory, env entries that are not
// KEY=VALUE), with Create's errors.
func (d *Driver) Validate(ctx context.Context, spec backend.SandboxSpec) error {
	if err := backend.ValidateSandboxName(spec.Name); err != nil {
		return err
	}
	return checkSpec(spec)
}

// ConfigSchema declares the `driver "local" {}` block: env_allowlist (list of host
// variable names passed to execs; default PATH LANG TERM TZ).
func (d *Driver) ConfigSchema(ctx context.Context) ([]backend.ConfigField, error) {
	return []backend.ConfigField{{
		Name:        "env_allowlist",
		Type:        "list(string)",
		Description: "host environment variables that every exec starts from (default PATH, LANG, TERM, TZ)",
	}}, nil
}

// Configure sets the state dir and applies the config block. Errors wrap
// backend.ErrInvalid and name the attribute.
func (d *Driver) Configure(ctx context.Context, setup backend.DriverSetup) error {
	var cfg struct {
		EnvAllowlist []string `json:"env_allowlist"`
	}
	if len(setup.Config) > 0 {
		if err := json.Unmarshal(setup.Config, &cfg); err != nil {
			return backend.Errorf(backend.ErrInvalid, "driver \"local\" config: %w", err)
		}
	}
	for _, n := range cfg.EnvAllowlist {
		if n == "" || strings.ContainsAny(n, "=\x00") {
			return backend.Errorf(backend.ErrInvalid, "driver \"local\": env_allowlist entry %q is not a variable name", n)
		}
	}
	if setup.StateDir == "" {
		return backend.Errorf(backend.ErrInvalid, "driver \"local\": no state dir given")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stateDir = setup.StateDir
	d.owner = setup.Owner
	if cfg.EnvAllowlist != nil {
		d.allowlist = cfg.EnvAllowlist
	}
	return nil
}

// meta is what the driver records about one sandbox, in its private directory (which
// the sandbox's processes do not write: they get the home directory below it).
type meta struct {
	Name      string              `json:"name"`
	Labels    map[string]string   `json:"labels"`
	Created   time.Time           `json:"created"`
	Spec      backend.SandboxSpec `json:"spec"`
	Agent     backend.AgentFiles  `json:"agent"`
	AgentPID  int                 `json:"agent_pid"`
	AgentTick uint64              `json:"agent_start_ticks"`
}

func (d *Driver) root() (string, error) {
	d.mu.Lock()
	dir := d.stateDir
	d.mu.Unlock()
	if dir == "" {
		return "", backend.Errorf(backend.ErrInvalid, "local driver has no state dir: call Configure or use local.WithStateDir")
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

func homeDir(dir string) string { return filepath.Join(dir, "home") }

func readMeta(dir string) (*meta, error) {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, backend.Errorf(backend.ErrNotFound, "local sandbox %s: not found", filepath.Base(dir))
	}
	if err != nil {
		return nil, fmt.Errorf("local sandbox %s: %w", filepath.Base(dir), err)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("local sandbox %s: corrupt meta.json: %w", filepath.Base(dir), err)
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

// lock takes an exclusive flock on the sandbox's lock file (ROOT/.NAME.lock), shared by
// every process that uses the state dir, waiting until ctx ends (ErrTimeout). Remove
// deletes the file as it unlocks it (Unlock(true)); waiters then lock the new file
// (see internal/flock).
func lock(ctx context.Context, root, name string) (*flock.Held, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("local: state dir %s: %w", root, err)
	}
	l, err := flock.Lock(ctx, filepath.Join(root, "."+name+".lock"))
	if err != nil {
		if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
			return nil, backend.Errorf(backend.ErrTimeout, "local: waiting for the lock of sandbox %s: %w", name, cerr)
		}
		return nil, fmt.Errorf("local: lock %s: %w", name, err)
	}
	return l, nil
}

// Create makes the sandbox's directory and starts its agent, or adopts an existing
// sandbox of the same name and owner (starting its agent when stopped). A sandbox of
// another owner is ErrConflict. Mounts and resource limits are ErrUnsupported; a
// Workdir that does not exist is ErrInvalid. A failed Create of a new sandbox removes
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
	if req.Agent.Binary == "" || req.Agent.SocketDir == "" {
		return backend.Sandbox{}, backend.Errorf(backend.ErrInvalid, "local sandbox %s: no agent binary or socket dir given", spec.Name)
	}
	l, err := lock(ctx, filepath.Dir(dir), spec.Name)
	if err != nil {
		return backend.Sandbox{}, err
	}
	defer l.Unlock(false)

	m, err := readMeta(dir)
	switch {
	case err == nil:
		if m.Labels[backend.LabelOwner] != spec.Labels[backend.LabelOwner] {
			return backend.Sandbox{}, backend.Errorf(backend.ErrConflict, "local sandbox %s belongs to owner %q, not %q", spec.Name, m.Labels[backend.LabelOwner], spec.Labels[backend.LabelOwner])
		}
		if !d.alive(m) {
			m.Agent = req.Agent // the host may have swapped the agent link while stopped
			if err := d.startAgent(ctx, dir, m); err != nil {
				return backend.Sandbox{}, err
			}
		}
		sb := m.sandbox(dir, backend.StateRunning)
		sb.Adopted = true
		return sb, nil
	case !errors.Is(err, backend.ErrNotFound):
		return backend.Sandbox{}, err
	}

	// No record: whatever still carries this sandbox's marker (an agent whose
	// directory was deleted by hand, and its processes) is left over; end it first.
	sweep(spec.Name, dir)
	if _, err := os.Lstat(dir); err == nil {
		// A directory without meta.json: a Create that crashed half-way.
		if err := removeAll(dir); err != nil {
			return backend.Sandbox{}, fmt.Errorf("local sandbox %s: clearing a half-created directory: %w", spec.Name, err)
		}
	}
	if err := os.MkdirAll(homeDir(dir), 0o700); err != nil {
		return backend.Sandbox{}, fmt.Errorf("local sandbox %s: %w", spec.Name, err)
	}
	m = &meta{Name: spec.Name, Labels: copyLabels(spec.Labels), Created: time.Now().UTC(), Spec: spec, Agent: req.Agent}
	if err := writeMeta(dir, m); err != nil {
		removeAll(dir)
		return backend.Sandbox{}, fmt.Errorf("local sandbox %s: %w", spec.Name, err)
	}
	if err := d.startAgent(ctx, dir, m); err != nil {
		removeAll(dir)
		return backend.Sandbox{}, err
	}
	return m.sandbox(dir, backend.StateRunning), nil
}

func checkSpec(spec backend.SandboxSpec) error {
	if len(spec.Mounts) > 0 {
		return backend.Errorf(backend.ErrUnsupported, "local sandbox %s: mounts are not supported by the local driver (it sees the host filesystem already); remove them from the rule or use docker or containerd", spec.Name)
	}
	if spec.Resources.Limited() {
		return backend.Errorf(backend.ErrUnsupported, "local sandbox %s: resource limits are not supported by the local driver; remove resources from the rule or use docker or containerd", spec.Name)
	}
	switch spec.Network {
	case "", "host":
	default:
		return backend.Errorf(backend.ErrUnsupported, "local sandbox %s: network %q is not supported by the local driver (it uses the host network); set network = \"host\" or use docker or containerd", spec.Name, spec.Network)
	}
	if spec.User != "" {
		return backend.Errorf(backend.ErrUnsupported, "local sandbox %s: user %q: the local driver runs commands as the invoking user; remove user from the rule", spec.Name, spec.User)
	}
	if spec.Workdir != "" {
		if !filepath.IsAbs(spec.Workdir) {
			return backend.Errorf(backend.ErrInvalid, "local sandbox %s: workdir %q is not an absolute path", spec.Name, spec.Workdir)
		}
		if st, err := os.Stat(spec.Workdir); err != nil || !st.IsDir() {
			return backend.Errorf(backend.ErrInvalid, "local sandbox %s: workdir %q does not exist or is not a directory; create it or change workdir", spec.Name, spec.Workdir)
		}
	}
	for _, kv := range spec.Env {
		if !strings.Contains(kv, "=") {
			return backend.Errorf(backend.ErrInvalid, "local sandbox %s: env entry %q is not KEY=VALUE", spec.Name, kv)
		}
	}
	return nil
}

func copyLabels(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

func (m *meta) sandbox(dir string, st backend.State) backend.Sandbox {
	return backend.Sandbox{Name: m.Name, ID: dir, State: st, Labels: copyLabels(m.Labels), CreatedAt: m.Created}
}

// Inspect reports the sandbox's state: running while its agent lives, stopped
// otherwise. A missing sandbox is ErrNotFound.
func (d *Driver) Inspect(ctx context.Context, name string) (backend.Sandbox, error) {
	dir, err := d.sandboxDir(name)
	if err != nil {
		return backend.Sandbox{}, err
	}
	m, err := readMeta(dir)
	if err != nil {
		return backend.Sandbox{}, err
	}
	st := backend.StateStopped
	if d.alive(m) {
		st = backend.StateRunning
	}
	return m.sandbox(dir, st), nil
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
		return nil, fmt.Errorf("local: list %s: %w", root, err)
	}
	var out []backend.Sandbox
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		m, err := readMeta(dir)
		if err != nil {
			continue // half-created or foreign: not a sandbox
		}
		if !backend.MatchLabels(m.Labels, filter) {
			continue
		}
		st := backend.StateStopped
		if d.alive(m) {
			st = backend.StateRunning
		}
		out = append(out, m.sandbox(dir, st))
	}
	return out, nil
}

// Stop asks the agent to end every process of the sandbox (SIGTERM, then SIGKILL after
// grace) and waits for the agent to exit; the directory stays. A missing or stopped
// sandbox succeeds; processes still carrying a missing sandbox's BERTH_SANDBOX marker
// (its directory was deleted by hand) are killed.
func (d *Driver) Stop(ctx context.Context, name string, grace time.Duration) error {
	dir, err := d.sandboxDir(name)
	if err != nil {
		return err
	}
	m, err := readMeta(dir)
	if errors.Is(err, backend.ErrNotFound) {
		sweep(name, dir) // processes of a sandbox whose directory was deleted by hand
		return nil
	}
	if err != nil {
		return err
	}
	return d.stop(ctx, dir, m, grace)
}

// Remove stops the sandbox and deletes its directory. A missing sandbox succeeds, after
// killing processes that still carry its BERTH_SANDBOX marker.
func (d *Driver) Remove(ctx context.Context, name string) error {
	dir, err := d.sandboxDir(name)
	if err != nil {
		return err
	}
	l, err := lock(ctx, filepath.Dir(dir), name)
	if err != nil {
		return err
	}
	removed := false
	defer func() { l.Unlock(removed) }() // the lock file goes with the sandbox
	m, err := readMeta(dir)
	if err == nil {
		if err := d.stop(ctx, dir, m, 0); err != nil {
			return err
		}
	} else if errors.Is(err, backend.ErrNotFound) {
		sweep(name, dir) // processes of a sandbox whose directory was deleted by hand
	} else {
		return err
	}
	if err := removeAll(dir); err != nil {
		return fmt.Errorf("local sandbox %s: remove %s: %w", name, dir, err)
	}
	removed = true
	return nil
}

// DialAgent connects to the agent of the running sandbox name through its socket
// (agent.DialSocketDir). The host presents the sandbox's token over it. Errors: a
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
	if !d.alive(m) {
		return nil, backend.Errorf(backend.ErrConflict, "local sandbox %s is stopped; start it with Create", name)
	}
	return agent.DialSocketDir(m.Agent.SocketDir)(ctx)
}

// Close releases nothing (the driver holds no connections); sandboxes keep running.
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
