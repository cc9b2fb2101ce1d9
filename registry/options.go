package registry

import (
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
)

// Option configures Open. Options are applied in order, so a later one replaces an
// earlier one of the same kind (and of the same driver name for WithDriver and
// WithPlugin); one that is given a bad value makes Open return its error, which
// wraps backend.ErrInvalid and names the option.
type Option func(*options) error

// options are the settings Open applies; the zero value of each field means its
// default.
type options struct {
	stateDir     string
	logger       hclog.Logger
	berthBinary  string
	inProcess    map[string]func() backend.TerminalBackend
	plugins      map[string]string
	launch       LaunchFunc
	prepare      PrepareAgentFunc
	storeTimeout time.Duration
	clock        func() time.Time
	clockOffset  time.Duration
	grace        time.Duration
	onPull       func(PullEvent)
	onSandbox    func(SandboxEvent)
	onPool       func(PoolEvent)
	supervise    *SupervisePolicy
}

// WithStateDir sets the state dir: the store, locks, agent files and the drivers'
// state live there. A relative dir is made absolute against the working directory;
// "~" is not expanded (config.ExpandHome does that). Default: the config's
// state_dir; without either, Open fails. The dir need not exist: the first call that
// needs it creates it (mode 0700), but it must be writable or creatable when Open is
// called. Error: an empty dir.
func WithStateDir(dir string) Option {
	return func(o *options) error {
		if dir == "" {
			return backend.Errorf(backend.ErrInvalid, "registry.WithStateDir: the state dir is empty; pass a directory")
		}
		o.stateDir = dir
		return nil
	}
}

// WithLogger sets the logger of the registry and of the plugins it launches; the
// plugins log at the logger's level (hclog.Logger.GetLevel), so set the level on the
// logger. Default (and nil): logs are discarded.
func WithLogger(l hclog.Logger) Option {
	return func(o *options) error {
		o.logger = l
		return nil
	}
}

// WithBerthBinary sets the berth executable (a path): it serves the local driver as
// a plugin (`BINARY driver serve local`), its directory is searched first for the
// executables of docker and containerd (berth-driver-docker, berth-driver-containerd;
// catalog.BuiltinDriver.Command) and last for third-party driver executables, and it
// is the agent binary unless the config sets agent_path. Default: the running
// executable (os.Executable). Error: an empty path.
func WithBerthBinary(path string) Option {
	return func(o *options) error {
		if path == "" {
			return backend.Errorf(backend.ErrInvalid, "registry.WithBerthBinary: the path is empty; pass the berth executable, or leave the option out to use the running one")
		}
		o.berthBinary = path
		return nil
	}
}

// WithDriver makes the driver called name run in this process: the registry calls
// newDriver (at most once per Registry, when the driver is first needed) instead of
// launching a plugin, and Close closes the driver when it has a Close method. name
// becomes a known driver. Default: no in-process driver; every driver is launched.
// Errors: an empty name, a nil newDriver.
func WithDriver(name string, newDriver func() backend.TerminalBackend) Option {
	return func(o *options) error {
		if name == "" || newDriver == nil {
			return backend.Errorf(backend.ErrInvalid, "registry.WithDriver(%q): needs a driver name and a constructor", name)
		}
		if o.inProcess == nil {
			o.inProcess = map[string]func() backend.TerminalBackend{}
		}
		o.inProcess[name] = newDriver
		return nil
	}
}

// WithLinkedDrivers makes every driver this program links run in this process, as
// WithDriver does for one: those registered in package catalog (backends/catalog) by
// their packages' init, which importing a driver's package does
// (import _ "github.com/berth-sh/berth/docker"); catalog.LinkedNames lists them. It
// adds to WithDriver's drivers and replaces none that a WithDriver before it gave;
// a WithDriver after it replaces its entry for that name. It never fails.
func WithLinkedDrivers() Option {
	return func(o *options) error {
		if o.inProcess == nil {
			o.inProcess = map[string]func() backend.TerminalBackend{}
		}
		for _, name := range catalog.LinkedNames() {
			if _, given := o.inProcess[name]; given {
				continue
			}
			o.inProcess[name], _ = catalog.Linked(name)
		}
		return nil
	}
}

// WithPlugin makes the default launcher start the third-party driver called name
// from the executable at path (berth's --plugin NAME=PATH), overriding the driver
// block's plugin key and discovery; the block's sha256 pin and start_timeout still
// apply. name becomes a known driver. Default: none; third-party drivers are found by
// their plugin key or in the plugin search path. It has no effect with WithLauncher.
// Errors: an empty name or path.
func WithPlugin(name, path string) Option {
	return func(o *options) error {
		if name == "" || path == "" {
			return backend.Errorf(backend.ErrInvalid, "registry.WithPlugin(%q, %q): needs a driver name and an executable path", name, path)
		}
		if o.plugins == nil {
			o.plugins = map[string]string{}
		}
		o.plugins[name] = path
		return nil
	}
}

// WithLauncher sets how out-of-process drivers are started. Default (and nil): the
// go-plugin launcher of package backends: built-in drivers as catalog.Builtins says
// (local from the berth binary, docker and containerd from their own executables
// beside it or in the plugin search path), third-party drivers from WithPlugin, the
// driver block's plugin key, or discovery (berth-driver-NAME in $BERTH_PLUGIN_PATH,
// plugin_dirs, beside the berth binary).
func WithLauncher(launch LaunchFunc) Option {
	return func(o *options) error {
		o.launch = launch
		return nil
	}
}

// WithAgentPreparer sets how a sandbox's agent files are prepared. Default (and
// nil): package agent's Install (once per Registry, of the config's
// agent_path or the berth binary) and PrepareSandbox.
func WithAgentPreparer(prepare PrepareAgentFunc) Option {
	return func(o *options) error {
		o.prepare = prepare
		return nil
	}
}

// WithStoreTimeout bounds the wait for another process's hold on the state store.
// Default: DefaultStoreTimeout. Error: d not positive.
func WithStoreTimeout(d time.Duration) Option {
	return func(o *options) error {
		o.storeTimeout = d
		return positive("WithStoreTimeout", "timeout", d)
	}
}

// WithClock sets the registry's clock: sandbox creation times (LabelCreated), last
// use, idle_ttl, max_age and the orphan grace period are all measured with it. Tests
// inject a clock they advance, so nothing waits for real. Default (and nil):
// time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) error {
		o.clock = now
		return nil
	}
}

// WithClockOffset makes the registry judge retention as if its clock (WithClock) read
// d later (earlier for a negative d): idle_ttl, max_age and the orphan grace period
// are measured at clock+d, by every call (an exec's expiry of its own session's
// sandbox, Prune and its dry run). What the registry records stays on the clock
// itself: sandbox creation times (LabelCreated), last use and removal times, so a call
// made with an offset to look ahead (BERTH_CLOCK_OFFSET=7d berth prune --dry-run)
// never leaves a time in the future behind. Default: 0.
func WithClockOffset(d time.Duration) Option {
	return func(o *options) error {
		o.clockOffset = d
		return nil
	}
}

// WithOrphanGrace sets how old an unrecorded sandbox of ours (and an unreferenced
// file in the state dir) must be before Prune removes it: younger ones may be in the
// middle of a create. Default: DefaultOrphanGrace. Error: d not positive.
func WithOrphanGrace(d time.Duration) Option {
	return func(o *options) error {
		o.grace = d
		return positive("WithOrphanGrace", "grace period", d)
	}
}

// WithPullProgress makes every image pull that a call makes before it creates a
// sandbox (see config.Rule.Pull) report its progress to onPull. It is called from
// the calling goroutine, in order, and must not block for long. Default (and nil):
// progress is not reported.
func WithPullProgress(onPull func(PullEvent)) Option {
	return func(o *options) error {
		o.onPull = onPull
		return nil
	}
}

// positive is the error of the duration option called option when d is not
// positive (Open fails, so the value set is never used), nil otherwise.
func positive(option, what string, d time.Duration) error {
	if d <= 0 {
		return backend.Errorf(backend.ErrInvalid, "registry.%s(%v): the %s must be positive", option, d, what)
	}
	return nil
}
