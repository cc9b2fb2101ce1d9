package registry

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/backends/agent"
	"github.com/berth-sh/berth/registry/config"
)

// This file is the only one that reaches packages backends and backends/agent, so
// that the rest of the registry (and its tests, through Options.Launch and
// Options.PrepareAgent) does not depend on them.

func builtinDrivers() []string { return slices.Clone(backends.Builtins) }

// defaultPluginFinder discovers third-party drivers in the plugin search path:
// $BERTH_PLUGIN_PATH, the config's plugin_dirs, the directory of berthBinary
// (the running executable when "").
func defaultPluginFinder(berthBinary string) config.PluginFinder {
	return func(pluginDirs []string) []string {
		var names []string
		for _, p := range backends.Discover(backends.SearchPath(pluginDirs, berthBinaryOrSelf(berthBinary))) {
			if !backends.IsBuiltin(p.Name) {
				names = append(names, p.Name)
			}
		}
		return names
	}
}

func berthBinaryOrSelf(bin string) string {
	if bin == "" {
		bin, _ = os.Executable()
	}
	return bin
}

// withDiscovered adds the third-party drivers found with no config file
// ($BERTH_PLUGIN_PATH, beside berthBinary) to known, sorted.
func withDiscovered(known []string, berthBinary string) []string {
	out := slices.Clone(known)
	for _, n := range defaultPluginFinder(berthBinary)(nil) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// defaultLaunch starts the drivers named in plugins from those executables,
// built-in drivers as `berthBinary driver serve NAME`, and other third-party
// drivers from the executable that discovery finds for them (the driver
// block's plugin key, or berth-driver-NAME in the search path); each checked
// against its block's sha256 pin and started within its start_timeout.
func defaultLaunch(berthBinary, stateDir string, cfg *config.Config, plugins map[string]string, logger hclog.Logger) LaunchFunc {
	return func(ctx context.Context, driver string) (backend.TerminalBackend, error) {
		// Pinned plugins are hashed once per file version: STATE/plugin-sums.
		opts := backends.LaunchOptions{Logger: logger.Named(driver), HashCacheDir: filepath.Join(stateDir, "plugin-sums")}
		blk := cfg.Drivers[driver]
		if blk != nil {
			opts.StartTimeout = blk.StartTimeout
		}
		if p := plugins[driver]; p != "" {
			opts.Path = p
			if blk != nil {
				opts.SHA256 = blk.SHA256
			}
		} else if backends.IsBuiltin(driver) {
			opts.Path, opts.Args = backends.BuiltinCommand(berthBinary, driver)
		} else {
			var plugin string
			if blk != nil {
				plugin, opts.SHA256 = blk.Plugin, blk.SHA256
			}
			path, err := backends.FindPlugin(driver, plugin, backends.SearchPath(cfg.PluginDirs, berthBinary))
			if err != nil {
				return nil, err
			}
			opts.Path = path
		}
		c, err := backends.Launch(ctx, opts)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}

func defaultPrepareAgent(stateDir, src string) PrepareAgentFunc {
	var mu sync.Mutex
	var bin *agent.Binary
	return func(sandboxDir string) (backend.AgentFiles, error) {
		mu.Lock()
		if bin == nil {
			b, err := agent.Install(stateDir, src)
			if err != nil {
				mu.Unlock()
				return backend.AgentFiles{}, err
			}
			bin = &b
		}
		b := *bin
		mu.Unlock()
		return agent.PrepareSandbox(sandboxDir, b)
	}
}

// currentAgentHash returns the content hash under which Install keeps the agent
// binary src in stateDir (installing it if missing), or "\x00" when it cannot.
func currentAgentHash(stateDir, src string) string {
	b, err := agent.Install(stateDir, src)
	if err != nil {
		return "\x00"
	}
	return b.Hash
}
