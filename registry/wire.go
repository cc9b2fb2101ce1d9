package registry

import (
	"context"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/backends/agent"
)

// This file is the only one that reaches packages backends and backends/agent, so
// that the rest of the registry (and its tests, through Options.Launch and
// Options.PrepareAgent) does not depend on them.

func builtinDrivers() []string { return slices.Clone(backends.Builtins) }

func defaultLaunch(berthBinary string, logger hclog.Logger) LaunchFunc {
	return func(ctx context.Context, driver string) (backend.TerminalBackend, error) {
		if !slices.Contains(backends.Builtins, driver) {
			return nil, backend.Errorf(backend.ErrUnsupported, "driver %q is not built in, and third-party drivers (berth-driver-NAME) are not supported yet", driver)
		}
		path, args := backends.BuiltinCommand(berthBinary, driver)
		c, err := backends.Launch(ctx, backends.LaunchOptions{Path: path, Args: args, Logger: logger.Named(driver)})
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
