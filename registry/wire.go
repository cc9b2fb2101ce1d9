package registry

import (
	"context"
	"path/filepath"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/config"
)

// This file is the only one that reaches packages backends and agent, so
// that the rest of the registry (and its tests, through WithLauncher and
// WithAgentPreparer) does not depend on them.

// defaultLaunch starts the drivers named in plugins from those executables,
// built-in drivers as package catalog (backends/catalog) says (local as `berthBinary
// driver serve local`, docker and containerd from their own executables beside
// berthBinary or in the search path), and other third-party drivers from the
// executable that discovery finds for them (the driver block's plugin key, or
// berth-driver-NAME in the search path); each checked against its block's sha256
// pin and started within its start_timeout.
//
// The search path (catalog.SearchPath) starts with $BERTH_PLUGIN_PATH, which
// package backends reads: it is where plugins are installed, like $PATH for
// commands, not a setting of this registry, so Open leaves it there rather than
// take it as an option. A program that wants no search uses WithPlugin, plugin
// keys with absolute paths, or WithLauncher.
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
		} else if b, ok := catalog.LookupBuiltin(driver); ok {
			var err error
			if opts.Path, opts.Args, err = b.Command(berthBinary, cfg.PluginDirs); err != nil {
				return nil, err
			}
		} else {
			var plugin string
			if blk != nil {
				plugin, opts.SHA256 = blk.Plugin, blk.SHA256
			}
			path, err := catalog.FindPlugin(driver, plugin, catalog.SearchPath(cfg.PluginDirs, berthBinary))
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
