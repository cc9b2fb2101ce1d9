//go:build registry_nowire

package registry

import (
	"context"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/berth-sh/berth/backend"
)

// Built with -tags registry_nowire: no plugin bridge and no agent install, for
// testing the registry while packages backends and backends/agent are not there.
// Callers must supply Options.InProcess (or Launch) and PrepareAgent.

func builtinDrivers() []string { return slices.Clone(DefaultKnownDrivers) }

func defaultLaunch(string, hclog.Logger) LaunchFunc {
	return func(ctx context.Context, driver string) (backend.TerminalBackend, error) {
		return nil, backend.Errorf(backend.ErrUnavailable, "driver %q: this berth was built without the plugin bridge (tag registry_nowire)", driver)
	}
}

func defaultPrepareAgent(string, string) PrepareAgentFunc {
	return func(string) (backend.AgentFiles, error) {
		return backend.AgentFiles{}, backend.Errorf(backend.ErrUnavailable, "this berth was built without the agent installer (tag registry_nowire)")
	}
}
