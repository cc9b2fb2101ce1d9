// Package containerd is berth's containerd driver: a sandbox is one container made
// through containerd's v2 Go client (github.com/containerd/containerd/v2/client, which
// drives containerd 1.6 and 2.x daemons alike), with its own snapshot and a long-lived
// task whose PID 1 is berth's agent. Every exec, copy and stop request goes through
// that agent over a unix socket in the sandbox's socket directory, which the container
// bind-mounts; the driver does lifecycle and placement only.
//
// A sandbox's container id and snapshot key are its name, in the driver's namespace
// (default DefaultNamespace). Stop kills and deletes the task and keeps the container
// and its snapshot, so the next Create starts a new task on the same filesystem;
// Remove deletes task, container and snapshot.
//
// Defaults (see docs/containerd.md for the reasons): network none (a new network
// namespace holding only lo), every Linux capability dropped except
// containerutil.DefaultCapabilities, no-new-privileges, Docker's default seccomp profile
// for the native system call ABI (SeccompNative), a pids limit of backend.DefaultPidsLimit, swap equal to memory, the task's
// own stdio to null IO (the agent logs to a size-capped file in the socket dir).
//
// The agent socket must be on this host's filesystem, so only local unix socket
// addresses are accepted.
package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/internal/containerutil"
)

// Name is the driver's name in config.
const Name = "containerd"

// init registers the driver in the catalog of drivers this program can run in
// process (catalog.Register): importing this package links it.
func init() {
	catalog.Register(Name, func() backend.TerminalBackend { return New() })
}

// Version is the driver's version string reported by Info.
const Version = "0.1.0"

// Defaults of the config keys.
const (
	// DefaultAddress is the daemon's socket when neither config, WithAddress nor
	// CONTAINERD_ADDRESS names one: containerd's standard socket.
	DefaultAddress = "/run/containerd/containerd.sock"
	// DefaultNamespace is the containerd namespace of berth's containers, images and
	// snapshots: its own, so that berth never lists or touches Docker's ("moby") or
	// Kubernetes' ("k8s.io").
	DefaultNamespace = "berth"
	// DefaultSnapshotter is the snapshotter of the sandboxes' root filesystems.
	DefaultSnapshotter = "overlayfs"
	// DefaultRuntime is the runtime (shim) that runs the tasks.
	DefaultRuntime = "io.containerd.runc.v2"
	// DefaultSeccomp is the seccomp setting when none is given: SeccompNative.
	DefaultSeccomp = SeccompNative
)

// Values of the seccomp config key (WithSeccomp). Any other value must be the absolute
// path of a JSON file holding an OCI runtime spec seccomp object (the spec's
// linux.seccomp: defaultAction, architectures, syscalls), which is read at every
// Create.
const (
	// SeccompNative is Docker's default seccomp profile (containerd's copy,
	// contrib/seccomp) for the host's native system call ABI only (x86_64 on amd64,
	// aarch64 on arm64): the 32-bit ABIs (i386 and x32 on amd64, arm on arm64) that
	// Docker also allows are refused, so 32-bit programs die with SIGSYS. runc
	// compiles one ABI's filter instead of three, which saves some 15 ms at every task
	// start on the machines measured (docs/containerd.md).
	SeccompNative = "native"
	// SeccompDocker is Docker's default seccomp profile as Docker applies it, the
	// 32-bit ABIs included.
	SeccompDocker = "docker"
	// SeccompUnconfined applies no seccomp filter (as Docker's
	// --security-opt seccomp=unconfined): only capabilities, no-new-privileges and the
	// namespaces confine the sandbox.
	SeccompUnconfined = "unconfined"
)

// DefaultCapabilities are the Linux capabilities a sandbox keeps; every other one is
// dropped. They are the Docker driver's (containerutil.DefaultCapabilities, where
// each is explained).
var DefaultCapabilities = containerutil.DefaultCapabilities

// NetworkModes are the SandboxSpec.Network values the driver accepts; "" means
// "none". There is no "bridge": containerd alone has no network set-up (that is CNI's
// job, which berth does not drive).
var NetworkModes = []string{"none", "host"}

// Labels the driver puts on its containers besides the spec's.
const (
	// LabelUser holds SandboxSpec.User as resolved at Create: the default user of
	// every exec (the agent itself runs as root).
	LabelUser = "berth.containerd.user"
)

// GVisorNetworkModes are the network modes of a sandbox whose runtime is gVisor
// (containerutil.IsGVisor): none only. runsc given an empty network namespace has
// not even a loopback unless run with --network=none (which scripts/runtimes.sh's
// runsc-berth passes), and with that flag it has no other network, so "host" is
// refused rather than run without one.
var GVisorNetworkModes = []string{"none"}

// Driver is the containerd driver. It is safe for concurrent use.
type Driver struct {
	mu          sync.Mutex
	address     string
	namespace   string
	snapshotter string
	runtime     string
	runtimes    map[string]string // OCI runtime name → binary (the runtimes setting)
	seccomp     string
	owner       string
	stateDir    string
	cli         *client.Client
	creating    containerutil.NameLocks
}

// Option configures a Driver built with New.
type Option func(*Driver)

// WithAddress sets the daemon's socket: an absolute path, optionally with unix://.
func WithAddress(address string) Option { return func(d *Driver) { d.address = address } }

// WithNamespace sets the containerd namespace (default DefaultNamespace).
func WithNamespace(ns string) Option { return func(d *Driver) { d.namespace = ns } }

// WithSnapshotter sets the snapshotter (default DefaultSnapshotter).
func WithSnapshotter(name string) Option { return func(d *Driver) { d.snapshotter = name } }

// WithRuntime sets the task runtime (default DefaultRuntime).
func WithRuntime(name string) Option { return func(d *Driver) { d.runtime = name } }

// WithRuntimes sets the OCI runtimes a spec may name besides runc, as the runtimes
// setting does: name → absolute path of the runtime's binary (or a wrapper adding its
// flags), run by the runc shim in runc's place. A bad entry makes Create fail with
// backend.ErrInvalid (Configure checks the setting's).
func WithRuntimes(runtimes map[string]string) Option {
	return func(d *Driver) { d.runtimes = maps.Clone(runtimes) }
}

// WithSeccomp sets the seccomp profile of new sandboxes: SeccompNative (the default),
// SeccompDocker, SeccompUnconfined or the absolute path of an OCI seccomp JSON file.
// An invalid value makes Create fail with backend.ErrInvalid.
func WithSeccomp(profile string) Option { return func(d *Driver) { d.seccomp = profile } }

// New returns a containerd driver. The daemon address is WithAddress, else the
// config's address (Configure), else CONTAINERD_ADDRESS, else DefaultAddress. No
// connection is made until the first call that needs one.
func New(opts ...Option) *Driver {
	d := &Driver{}
	for _, o := range opts {
		o(d)
	}
	return d
}

var (
	_ backend.TerminalBackend = (*Driver)(nil)
	_ backend.Configurer      = (*Driver)(nil)
	_ backend.ImageImporter   = (*Driver)(nil)
	_ backend.ImagePuller     = (*Driver)(nil)
	_ backend.Validator       = (*Driver)(nil)
)

// HealthTimeout bounds the daemon check of Info: a configured driver's Info asks the
// daemon for its version and fails with backend.ErrUnavailable, naming the daemon's
// address, when it does not answer within this long.
const HealthTimeout = containerutil.HealthTimeout

// Info reports the driver's capabilities. Once the driver is configured it also checks
// that its daemon answers (a version request bounded by HealthTimeout), so that
// `berth drivers` and the first call of a session say at once that containerd is
// down; a daemon that does not answer is ErrUnavailable, naming its address. Before
// Configure it only describes the driver.
func (d *Driver) Info(ctx context.Context) (backend.Info, error) {
	if err := d.health(ctx); err != nil {
		return backend.Info{}, err
	}
	caps := baseCapabilities()
	d.mu.Lock()
	caps.Runtimes = containerutil.RuntimesCaps(caps, d.runtimes, "")
	d.mu.Unlock()
	for i, r := range caps.Runtimes {
		if r.Kernel == backend.KernelGVisor {
			caps.Runtimes[i].Capabilities.NetworkModes = slices.Clone(GVisorNetworkModes)
		}
	}
	return backend.Info{
		Name:             Name,
		Version:          Version,
		ProtocolVersions: []int{backend.ProtocolVersion},
		Capabilities:     caps,
	}, nil
}

// baseCapabilities are the capabilities of a sandbox of the default OCI runtime
// (runc, under the task runtime's shim).
func baseCapabilities() backend.Capabilities {
	return containerutil.Capabilities(NetworkModes)
}

// health asks the daemon of a configured driver for its version (see Info).
func (d *Driver) health(ctx context.Context) error {
	d.mu.Lock()
	unconfigured := d.owner == "" && d.stateDir == ""
	d.mu.Unlock()
	if unconfigured {
		return nil // not told its daemon yet: Info describes the driver
	}
	return containerutil.CheckHealth(ctx, func(ctx context.Context) error {
		c, cctx, err := d.api(ctx)
		if err == nil {
			_, err = c.Version(cctx)
		}
		return d.wrap("version", err)
	}, func() error {
		return d.unavailable("version", d.settings().address, fmt.Errorf("no answer within %s", HealthTimeout))
	})
}

// ConfigSchema declares the `driver "containerd" {}` block.
func (d *Driver) ConfigSchema(ctx context.Context) ([]backend.ConfigField, error) {
	return []backend.ConfigField{
		{Name: "address", Type: "string", Description: "containerd's socket, an absolute path (default $CONTAINERD_ADDRESS, then " + DefaultAddress + "); the daemon must share this host's filesystem"},
		{Name: "namespace", Type: "string", Description: "containerd namespace of berth's containers, images and snapshots (default " + DefaultNamespace + ")"},
		{Name: "snapshotter", Type: "string", Description: "snapshotter of the sandboxes' root filesystems (default " + DefaultSnapshotter + ")"},
		{Name: "runtime", Type: "string", Description: "task runtime (default " + DefaultRuntime + ")"},
		{Name: "runtimes", Type: "map(string)", Description: "OCI runtimes a scope's runtime may name besides runc: name → absolute path of the runtime's binary (or a wrapper that adds its flags), which the runc shim runs in runc's place (its BinaryName), e.g. { runsc = \"/usr/local/bin/runsc-berth\" } for gVisor (docs/gvisor.md)"},
		{Name: "seccomp", Type: "string", Description: "seccomp profile of new sandboxes: \"native\" (default: Docker's profile for the native system call ABI only), \"docker\" (Docker's profile with the 32-bit ABIs), \"unconfined\", or the absolute path of an OCI seccomp JSON file"},
	}, nil
}

// config is the decoded `driver "containerd" {}` block.
type config struct {
	Address     string            `json:"address"`
	Namespace   string            `json:"namespace"`
	Snapshotter string            `json:"snapshotter"`
	Runtime     string            `json:"runtime"`
	Runtimes    map[string]string `json:"runtimes"`
	Seccomp     string            `json:"seccomp"`
}

// Configure applies the config block and the owner. Values set with options in New
// are overridden by the block's. Errors wrap backend.ErrInvalid and name the key.
func (d *Driver) Configure(ctx context.Context, setup backend.DriverSetup) error {
	var cfg config
	if len(setup.Config) > 0 {
		if err := json.Unmarshal(setup.Config, &cfg); err != nil {
			return backend.Errorf(backend.ErrInvalid, "driver \"containerd\" config: %w", err)
		}
	}
	if cfg.Address != "" {
		if _, err := socketPath(cfg.Address); err != nil {
			return err
		}
	}
	if cfg.Namespace != "" {
		if err := checkIdentifier("namespace", cfg.Namespace); err != nil {
			return err
		}
	}
	for _, kv := range [][2]string{{"snapshotter", cfg.Snapshotter}, {"runtime", cfg.Runtime}} {
		if strings.ContainsAny(kv[1], " \t\n/\x00") {
			return backend.Errorf(backend.ErrInvalid, "driver \"containerd\": %s %q is not a plugin name (e.g. %q)", kv[0], kv[1], map[string]string{"snapshotter": DefaultSnapshotter, "runtime": DefaultRuntime}[kv[0]])
		}
	}
	if cfg.Seccomp != "" {
		if err := checkSeccomp(cfg.Seccomp); err != nil {
			return err
		}
	}
	for name, path := range cfg.Runtimes {
		if err := checkRuntimeEntry(name, path); err != nil {
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	before := d.settingsLocked()
	if cfg.Address != "" {
		d.address = cfg.Address
	}
	if cfg.Namespace != "" {
		d.namespace = cfg.Namespace
	}
	if cfg.Snapshotter != "" {
		d.snapshotter = cfg.Snapshotter
	}
	if cfg.Runtime != "" {
		d.runtime = cfg.Runtime
	}
	if cfg.Seccomp != "" {
		d.seccomp = cfg.Seccomp
	}
	if cfg.Runtimes != nil {
		d.runtimes = maps.Clone(cfg.Runtimes)
	}
	// The client carries the address, default namespace and runtime: a new one is made
	// on the next call when they changed.
	if after := d.settingsLocked(); after != before && d.cli != nil {
		d.cli.Close()
		d.cli = nil
	}
	d.owner = setup.Owner
	d.stateDir = setup.StateDir
	return nil
}

// checkRuntimeEntry checks one entry of the runtimes setting: a runtime name as a
// scope writes it and an absolute path to an executable file. The file is checked
// here so that `berth config check` and the first create say so, not the shim.
func checkRuntimeEntry(name, path string) error {
	if err := checkIdentifier("runtimes key", name); err != nil {
		return err
	}
	if name == "runc" {
		return backend.Errorf(backend.ErrInvalid, "driver \"containerd\": runtimes: runc is the default runtime (a scope without runtime uses it); remove the entry")
	}
	if !filepath.IsAbs(path) {
		return backend.Errorf(backend.ErrInvalid, "driver \"containerd\": runtimes: %s = %q is not an absolute path; give the path of the runtime's binary, e.g. %s = \"/usr/local/bin/runsc-berth\"", name, path, name)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		why := "it is not an executable file"
		if err != nil {
			why = err.Error()
		}
		return backend.Errorf(backend.ErrInvalid, "driver \"containerd\": runtimes: %s = %q: %s; install the runtime there (runsc: docs/gvisor.md) or fix the path", name, path, why)
	}
	return nil
}

// runtimeBinary returns the binary of OCI runtime name (the runtimes setting); "" for
// the default. Error: ErrUnsupported for a runtime not in the setting, naming those
// that are and how to add one.
func (d *Driver) runtimeBinary(sandbox, name string) (string, error) {
	if name == "" {
		return "", nil
	}
	d.mu.Lock()
	path, ok := d.runtimes[name]
	have := slices.Sorted(maps.Keys(d.runtimes))
	d.mu.Unlock()
	if !ok {
		return "", backend.Errorf(backend.ErrUnsupported, "containerd sandbox %s: runtime %q is not in driver \"containerd\" { runtimes = {...} } (it has %v); add it, e.g. runtimes = { %s = \"/usr/local/bin/runsc-berth\" } for gVisor, as docs/gvisor.md says", sandbox, name, have, name)
	}
	if err := checkRuntimeEntry(name, path); err != nil { // set with WithRuntimes, or gone since
		return "", err
	}
	return path, nil
}

// checkIdentifier accepts containerd identifiers: letters, digits, '.', '_' and '-',
// starting with a letter or digit, at most 76 characters.
func checkIdentifier(key, v string) error {
	ok := len(v) > 0 && len(v) <= 76
	for i, r := range v {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || !strings.ContainsRune("._-", r)) {
			ok = false
		}
	}
	if !ok {
		return backend.Errorf(backend.ErrInvalid, "driver \"containerd\": %s %q: want 1–76 letters, digits, '.', '_' or '-', starting with a letter or digit", key, v)
	}
	return nil
}

// socketPath accepts "/path" and "unix:///path" and returns the path.
func socketPath(address string) (string, error) {
	p := strings.TrimPrefix(address, "unix://")
	if strings.HasPrefix(p, "/") {
		return p, nil
	}
	return "", backend.Errorf(backend.ErrInvalid, "driver \"containerd\": address %q: want the absolute path of containerd's local unix socket (e.g. %s); berth reaches its agent in each container through a socket on this host's filesystem, so a remote daemon cannot be used", address, DefaultAddress)
}

// settings are the driver's effective settings.
type settings struct {
	address, namespace, snapshotter, runtime string
}

func (d *Driver) settings() settings {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.settingsLocked()
}

func (d *Driver) settingsLocked() settings {
	s := settings{address: d.address, namespace: d.namespace, snapshotter: d.snapshotter, runtime: d.runtime}
	if s.address == "" {
		s.address = os.Getenv("CONTAINERD_ADDRESS")
	}
	if s.address == "" {
		s.address = DefaultAddress
	}
	if s.namespace == "" {
		s.namespace = DefaultNamespace
	}
	if s.snapshotter == "" {
		s.snapshotter = DefaultSnapshotter
	}
	if s.runtime == "" {
		s.runtime = DefaultRuntime
	}
	return s
}

// api returns the client and a context in the driver's namespace, making the client
// on first use. The client connects lazily: a daemon that is down shows in the first
// call (wrap makes it ErrUnavailable).
func (d *Driver) api(ctx context.Context) (*client.Client, context.Context, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.settingsLocked()
	ctx = namespaces.WithNamespace(ctx, s.namespace)
	if d.cli != nil {
		return d.cli, ctx, nil
	}
	path, err := socketPath(s.address)
	if err != nil {
		return nil, ctx, err
	}
	if err := checkIdentifier("namespace", s.namespace); err != nil {
		return nil, ctx, err
	}
	// containerd's dialer waits for a missing socket to appear (up to the client's
	// 10 s timeout, on every call): a daemon that is not there is reported at once.
	if _, err := os.Stat(path); err != nil {
		return nil, ctx, d.unavailable("connect", s.address, err)
	}
	c, err := client.New(path, client.WithDefaultNamespace(s.namespace), client.WithDefaultRuntime(s.runtime))
	if err != nil {
		return nil, ctx, backend.Errorf(backend.ErrInvalid, "driver \"containerd\": address %q: %w", s.address, err)
	}
	d.cli = c
	return c, ctx, nil
}

// Close closes the agent connections and the client; containers keep running.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cli != nil {
		d.cli.Close()
		d.cli = nil
	}
	return nil
}

// wrap maps a containerd error to a backend error kind with op as context; the one
// place where containerd's error classes become berth's.
func (d *Driver) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if backend.KindOf(err) != nil {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("containerd: %s: %w", op, err)
	}
	switch {
	case cerrdefs.IsUnavailable(err), status.Code(err) == codes.Unavailable:
		return d.unavailable(op, d.settings().address, err)
	case cerrdefs.IsNotFound(err):
		return backend.Errorf(backend.ErrNotFound, "containerd: %s: %w", op, err)
	case cerrdefs.IsConflict(err), cerrdefs.IsAlreadyExists(err), cerrdefs.IsFailedPrecondition(err):
		return backend.Errorf(backend.ErrConflict, "containerd: %s: %w", op, err)
	case cerrdefs.IsInvalidArgument(err):
		return backend.Errorf(backend.ErrInvalid, "containerd: %s: %w", op, err)
	case cerrdefs.IsNotImplemented(err):
		return backend.Errorf(backend.ErrUnsupported, "containerd: %s: %w", op, err)
	}
	return fmt.Errorf("containerd: %s: %w", op, err)
}

// unavailable is the ErrUnavailable of a daemon at address that does not answer.
func (d *Driver) unavailable(op, address string, err error) error {
	return backend.Errorf(backend.ErrUnavailable, "containerd: %s: containerd at %s does not answer (%w); start it (systemctl start containerd, or sudo scripts/runtimes.sh and export the CONTAINERD_ADDRESS it prints) or set address in driver \"containerd\" {}", op, address, err)
}
