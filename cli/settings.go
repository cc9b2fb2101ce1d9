package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/registry"
)

// This file is the one place where berth's settings are resolved: flags over the
// BERTH_* environment over the config file over defaults. Package registry reads
// none of them; it gets the result as a *config.Config and registry options.

// envClockOffset shifts berth's clock for retention by a duration (7d, 36h, -1h):
// `BERTH_CLOCK_OFFSET=7d berth prune --dry-run` shows what will have expired in a
// week. Tests use it instead of waiting. It shifts only the judgement
// (registry.WithClockOffset): the times berth records stay real.
const envClockOffset = execrun.EnvClockOffset

// settings are what a command opens its registry with.
type settings struct {
	cfg  *config.Config
	opts []registry.Option
}

// settings resolves the flags, the environment and the config file; errors name the
// input (a config file's errors carry file:line:col).
func (g *globals) settings() (*settings, error) {
	self, err := g.self()
	if err != nil {
		return nil, err
	}
	offset, err := clockOffset()
	if err != nil {
		return nil, err
	}
	cfg := g.detected // the config that daemon detection loaded, used once
	g.detected = nil
	if cfg == nil {
		if cfg, err = g.loadConfig(self); err != nil {
			return nil, err
		}
	}
	log, err := g.resolveLogger(cfg)
	if err != nil {
		return nil, err
	}
	stateDir, err := g.resolveStateDir(cfg)
	if err != nil {
		return nil, err
	}
	opts := append([]registry.Option{
		registry.WithStateDir(stateDir),
		registry.WithBerthBinary(self),
		registry.WithLogger(log),
		registry.WithPullProgress(g.onPull),
	}, g.driverOptions()...)
	if offset != 0 {
		opts = append(opts, registry.WithClockOffset(offset))
	}
	return &settings{cfg: cfg, opts: opts}, nil
}

// open opens the registry with the resolved settings and sends berth's log to
// STATE/berth.log.
func (g *globals) open(ctx context.Context) (*registry.Registry, error) {
	s, err := g.settings()
	if err != nil {
		return nil, err
	}
	phase.Mark("config")
	r, err := registry.Open(ctx, s.cfg, s.opts...)
	if err != nil {
		return nil, err
	}
	phase.Mark("open")
	g.log.SetPath(filepath.Join(r.StateDir(), "berth.log"))
	return r, nil
}

// driverOptions are the registry options of --plugin (conformance) and
// --in-process (the drivers compiled into berth, local, run in this process; every
// other driver still runs as a plugin).
func (g *globals) driverOptions() []registry.Option {
	var opts []registry.Option
	for name, path := range g.plugins {
		opts = append(opts, registry.WithPlugin(name, path))
	}
	if g.inProcess {
		// The drivers compiled into berth (catalog.Linked): local only; docker,
		// containerd and kubernetes are their own executables, so that berth links
		// no runtime's SDK and starts fast.
		opts = append(opts, registry.WithLinkedDrivers())
	}
	return opts
}

// configOptions are how berth checks a config: the drivers it can run are the
// built-in ones and those of --plugin, plus the berth-driver-NAME executables that
// discovery finds ($BERTH_PLUGIN_PATH, plugin_dirs, beside self, the berth binary).
func (g *globals) configOptions(self string) []config.Option {
	known := catalog.BuiltinNames()
	for name := range g.plugins {
		if !slices.Contains(known, name) {
			known = append(known, name)
		}
	}
	sort.Strings(known)
	if skipped := catalog.SkippedPluginPathEntries(); len(skipped) > 0 {
		g.pluginPathNote.Do(func() {
			fmt.Fprintf(os.Stderr, "berth: note: %s entries %q are skipped: plugin directories must be absolute paths (a relative one would depend on the working directory)\n",
				catalog.EnvPluginPath, skipped)
		})
	}
	return []config.Option{config.WithKnownDrivers(known...), config.WithPluginFinder(config.DiscoverPlugins(self))}
}

// loadConfig loads the config file of --config, else $BERTH_CONFIG (each must
// exist), else the default path; a missing default file is config.Default.
func (g *globals) loadConfig(self string) (*config.Config, error) {
	path, explicit, err := config.ResolvePath(g.configPath)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); err != nil && !explicit {
		return config.Default(g.configOptions(self)...), nil
	}
	return config.Load(path, g.configOptions(self)...)
}

// flagLogLevel returns the log level of --log-level, else $BERTH_LOG, and the name of
// where it came from; "" when neither sets one.
func (g *globals) flagLogLevel() (level, src string) {
	if g.logLevel != "" {
		return g.logLevel, "--log-level"
	}
	return os.Getenv(config.EnvLog), config.EnvLog
}

// logger returns a logger into berth's log file at the level of the flags and the
// environment (flagLogLevel), warn when they set none.
func (g *globals) logger() hclog.Logger {
	level, _ := g.flagLogLevel()
	if level == "" {
		level = "warn"
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:   "berth",
		Level:  hclog.LevelFromString(level),
		Output: g.log,
	})
}

// resolveLogger returns logger() set to the level of the flags, the environment or
// the config's log_level. Error: a level that is not one of config.LogLevels.
func (g *globals) resolveLogger(cfg *config.Config) (hclog.Logger, error) {
	log := g.logger()
	level, src := g.flagLogLevel()
	if level == "" {
		level, src = cfg.LogLevel, "log_level"
	}
	if level != "" {
		if !slices.Contains(config.LogLevels, level) {
			return nil, backend.Errorf(backend.ErrInvalid, "%s %q is not a log level; use one of %v", src, level, config.LogLevels)
		}
		log.SetLevel(hclog.LevelFromString(level))
	}
	return log, nil
}

// resolveStateDir returns the state dir of --state-dir, else $BERTH_STATE_DIR, else
// the config's state_dir, else config.DefaultStateDir, with "~/" expanded
// (registry.Open makes it absolute and checks it).
func (g *globals) resolveStateDir(cfg *config.Config) (string, error) {
	dir := g.stateDir
	if dir == "" {
		dir = os.Getenv(config.EnvStateDir)
	}
	if dir == "" {
		dir = cfg.StateDir
	}
	if dir == "" {
		return config.DefaultStateDir()
	}
	return config.ExpandHome(dir), nil
}

// clockOffset returns the offset of $BERTH_CLOCK_OFFSET, 0 when it is unset.
func clockOffset() (time.Duration, error) {
	v := os.Getenv(envClockOffset)
	if v == "" {
		return 0, nil
	}
	off, err := config.ParseDuration(strings.TrimPrefix(v, "-"))
	if err != nil {
		return 0, backend.Errorf(backend.ErrInvalid, "%s=%q: %w; use a duration such as 7d or 36h (a leading - goes back)", envClockOffset, v, err)
	}
	if strings.HasPrefix(v, "-") {
		off = -off
	}
	return off, nil
}
