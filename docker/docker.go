// Package docker is berth's Docker driver: a sandbox is one hardened container made
// through the Docker Engine API (github.com/docker/docker/client, API version
// negotiated, so Engine API 1.41 of Debian's docker.io 20.10 works), with berth's agent
// as its PID 1. The host reaches that agent itself, over a unix socket in the
// sandbox's socket directory, which the container bind-mounts (Capabilities.Agent
// "socket"); the driver does lifecycle and placement only, and asks the agent to shut
// down when it stops a sandbox.
//
// Defaults (see docs/docker.md for the reasons): network none, every Linux capability
// dropped except DefaultCapabilities, no-new-privileges, a pids limit of
// backend.DefaultPidsLimit, swap equal to memory, a json-file log capped at 1 MB.
//
// The agent socket must be on this host's filesystem, so only unix:// engine addresses
// are accepted; a tcp:// or ssh:// host is refused with ErrInvalid.
package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/internal/containerutil"
)

// Name is the driver's name in config.
const Name = "docker"

// init registers the driver in the catalog of drivers this program can run in
// process (catalog.Register): importing this package links it.
func init() {
	catalog.Register(Name, func() backend.TerminalBackend { return New() })
}

// Version is the driver's version string reported by Info.
const Version = "0.1.0"

// DefaultHost is the engine address used when neither config nor DOCKER_HOST names one.
const DefaultHost = "unix:///var/run/docker.sock"

// DefaultCapabilities are the Linux capabilities a sandbox keeps; every other one is
// dropped. It is containerutil.DefaultCapabilities, shared with the containerd
// driver, where the reason for each is documented (docs/docker.md too).
var DefaultCapabilities = containerutil.DefaultCapabilities

// AgentStateDir is where the agent keeps, inside the container's own filesystem (so
// it survives Stop and goes with Remove), the state that outlives it: the shell-mode
// state of each session, readable by root only (containerutil.AgentStateDir).
const AgentStateDir = containerutil.AgentStateDir

// NetworkModes are the SandboxSpec.Network values the driver accepts; "" means "none".
var NetworkModes = []string{"none", "bridge", "host"}

// Labels the driver puts on its containers besides the spec's.
const (
	// LabelUser holds SandboxSpec.User as resolved at Create: the default user of
	// every exec (the agent itself runs as root, started with --exec-user).
	LabelUser = "berth.docker.user"
)

// Driver is the Docker driver. It is safe for concurrent use.
type Driver struct {
	mu       sync.Mutex
	host     string
	owner    string
	stateDir string
	cli      *client.Client
	creating containerutil.NameLocks
}

// Option configures a Driver built with New.
type Option func(*Driver)

// WithHost sets the engine address (unix:///path/to/docker.sock).
func WithHost(host string) Option { return func(d *Driver) { d.host = host } }

// New returns a Docker driver. The engine address is WithHost, else the config's
// host (Configure), else DOCKER_HOST, else DefaultHost. No connection is made until
// the first call that needs one.
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

// HealthTimeout bounds the engine check of Info: a configured driver's Info pings the
// engine (GET /_ping) and fails with backend.ErrUnavailable, naming the engine's
// address, when it does not answer within this long.
const HealthTimeout = containerutil.HealthTimeout

// Info reports the driver's capabilities. Once the driver is configured it also checks
// that its engine answers (a ping bounded by HealthTimeout), so that `berth drivers`
// and the first call of a session say at once that the engine is down; an engine
// that does not answer is ErrUnavailable, naming its address. Before Configure it
// only describes the driver.
func (d *Driver) Info(ctx context.Context) (backend.Info, error) {
	if err := d.health(ctx); err != nil {
		return backend.Info{}, err
	}
	caps := baseCapabilities()
	if d.configured() {
		paths, dflt, err := d.engineRuntimes(ctx)
		if err != nil {
			return backend.Info{}, err
		}
		caps.Runtimes = containerutil.RuntimesCaps(caps, paths, dflt)
	}
	return backend.Info{
		Name:             Name,
		Version:          Version,
		ProtocolVersions: []int{backend.ProtocolVersion},
		Capabilities:     caps,
	}, nil
}

// configured reports whether Configure has told the driver its owner or state dir.
func (d *Driver) configured() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.owner != "" || d.stateDir != ""
}

// engineRuntimes returns the OCI runtimes the engine is configured with (`docker
// info`'s Runtimes: name → binary path as dockerd's --add-runtime or daemon.json's
// "runtimes" set it, "" for a shim v2 runtime without one) and its default runtime.
func (d *Driver) engineRuntimes(ctx context.Context) (map[string]string, string, error) {
	api, err := d.api()
	if err != nil {
		return nil, "", err
	}
	info, err := api.Info(ctx)
	if err != nil {
		return nil, "", d.wrap("read the engine's runtimes (docker info)", err)
	}
	paths := make(map[string]string, len(info.Runtimes))
	for n, r := range info.Runtimes {
		paths[n] = r.Path
	}
	return paths, info.DefaultRuntime, nil
}

// baseCapabilities are the capabilities of a sandbox of the engine's default
// runtime (runc).
func baseCapabilities() backend.Capabilities {
	return containerutil.Capabilities(NetworkModes)
}

// health pings the engine of a configured driver (see Info).
func (d *Driver) health(ctx context.Context) error {
	if !d.configured() {
		return nil // not told its engine yet: Info describes the driver
	}
	return containerutil.CheckHealth(ctx, func(ctx context.Context) error {
		c, fresh, err := d.apiCtx(ctx)
		if err != nil || fresh { // a new client has just pinged the engine
			return err
		}
		_, err = c.Ping(ctx)
		return d.wrap("ping", err)
	}, func() error {
		return backend.Errorf(backend.ErrUnavailable, "docker: the Docker Engine at %s did not answer a ping within %s; check that it runs and is not hung (systemctl status docker), or set host in driver \"docker\" {}", d.engineHost(), HealthTimeout)
	})
}

// ConfigSchema declares the `driver "docker" {}` block.
func (d *Driver) ConfigSchema(ctx context.Context) ([]backend.ConfigField, error) {
	return []backend.ConfigField{{
		Name:        "host",
		Type:        "string",
		Description: "Docker Engine address, unix:///path/to/docker.sock (default $DOCKER_HOST, then " + DefaultHost + "); the engine must share this host's filesystem",
	}}, nil
}

// Configure applies the config block and the owner. Errors wrap backend.ErrInvalid.
func (d *Driver) Configure(ctx context.Context, setup backend.DriverSetup) error {
	var cfg struct {
		Host string `json:"host"`
	}
	if len(setup.Config) > 0 {
		if err := json.Unmarshal(setup.Config, &cfg); err != nil {
			return backend.Errorf(backend.ErrInvalid, "driver \"docker\" config: %w", err)
		}
	}
	if cfg.Host != "" {
		if _, err := checkHost(cfg.Host); err != nil {
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if cfg.Host != "" && cfg.Host != d.host {
		d.host = cfg.Host
		if d.cli != nil {
			d.cli.Close()
			d.cli = nil
		}
	}
	d.owner = setup.Owner
	d.stateDir = setup.StateDir
	return nil
}

// checkHost accepts unix:// addresses only and returns the socket path.
func checkHost(host string) (string, error) {
	if path, ok := strings.CutPrefix(host, "unix://"); ok && strings.HasPrefix(path, "/") {
		return path, nil
	}
	return "", backend.Errorf(backend.ErrInvalid, "driver \"docker\": host %q: only a local unix:// socket is supported (berth reaches its agent in each container through a socket on this host's filesystem, which a tcp:// or ssh:// engine does not share); run the engine on this machine and set host = \"unix:///var/run/docker.sock\"", host)
}

// engineHost returns the address in use.
func (d *Driver) engineHost() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hostLocked()
}

func (d *Driver) hostLocked() string {
	if d.host != "" {
		return d.host
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return h
	}
	return DefaultHost
}

// negotiateTimeout bounds the ping that negotiates the Engine API version.
const negotiateTimeout = 30 * time.Second

// api returns the engine client, making it (and negotiating its API version) on first
// use. An engine that does not answer is ErrUnavailable, and nothing is cached.
func (d *Driver) api() (*client.Client, error) {
	c, _, err := d.apiCtx(context.Background())
	return c, err
}

// apiCtx is api with the negotiation bounded by ctx too; fresh reports that the client
// was made (and the engine pinged) by this call.
func (d *Driver) apiCtx(ctx context.Context) (c *client.Client, fresh bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cli != nil {
		return d.cli, false, nil
	}
	host := d.hostLocked()
	if _, err := checkHost(host); err != nil {
		return nil, false, err
	}
	c, err = client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, false, backend.Errorf(backend.ErrInvalid, "driver \"docker\": host %q: %w", host, err)
	}
	// Negotiate the API version now, once, under d.mu: the SDK's lazy negotiation on
	// the first request writes the version while concurrent requests read it (a data
	// race between the first calls of parallel Creates and Lists).
	ctx, cancel := context.WithTimeout(ctx, negotiateTimeout)
	defer cancel()
	ping, err := c.Ping(ctx)
	if err != nil {
		c.Close()
		return nil, false, wrapAt(host, "connect to the Docker Engine", err) // d.mu is held: not d.wrap
	}
	c.NegotiateAPIVersionPing(ping)
	d.cli = c
	return c, true, nil
}

// Close closes the engine client; containers keep running.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cli != nil {
		d.cli.Close()
		d.cli = nil
	}
	return nil
}

// wrap maps an engine error to a backend error kind with op as context; the one place
// where Docker's error classes become berth's.
func (d *Driver) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return wrapAt(d.engineHost(), op, err)
}

// wrapAt is wrap for the engine at host, for callers that hold d.mu.
func wrapAt(host, op string, err error) error {
	if err == nil {
		return nil
	}
	if backend.KindOf(err) != nil {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("docker: %s: %w", op, err)
	}
	switch {
	case client.IsErrConnectionFailed(err), cerrdefs.IsUnavailable(err):
		return backend.Errorf(backend.ErrUnavailable, "docker: %s: the Docker Engine at %s does not answer (%w); start it (systemctl start docker, or sudo scripts/runtimes.sh and export the DOCKER_HOST it prints) or set host in driver \"docker\" {}", op, host, err)
	case cerrdefs.IsNotFound(err):
		return backend.Errorf(backend.ErrNotFound, "docker: %s: %w", op, err)
	case cerrdefs.IsConflict(err), cerrdefs.IsAlreadyExists(err):
		return backend.Errorf(backend.ErrConflict, "docker: %s: %w", op, err)
	case cerrdefs.IsInvalidArgument(err):
		return backend.Errorf(backend.ErrInvalid, "docker: %s: %w", op, err)
	case cerrdefs.IsNotImplemented(err):
		return backend.Errorf(backend.ErrUnsupported, "docker: %s: %w", op, err)
	}
	return fmt.Errorf("docker: %s: %w", op, err)
}
