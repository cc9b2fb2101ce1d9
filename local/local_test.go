package local_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
)

var berthBin string

func TestMain(m *testing.M) { os.Exit(testbin.MainCLI(m, &berthBin)) }

func options(t *testing.T, stateDir string) conformance.Options {
	return conformance.Options{AgentBinary: berthBin, StateDir: stateDir, Owner: conformance.NewOwner()}
}

// TestConformanceInProcess runs the shared suite against the local driver in this process.
func TestConformanceInProcess(t *testing.T) {
	state := t.TempDir()
	d := local.New(local.WithStateDir(filepath.Join(state, "drivers", "local")))
	t.Cleanup(func() { d.Close() })
	opts := options(t, state)
	opts.OpenRegistry = conformance.RegistryOpener(nil, registry.WithBerthBinary(berthBin),
		registry.WithDriver(local.Name, func() backend.TerminalBackend { return local.New() }))
	conformance.Run(t, d, opts)
}

// TestConformancePlugin runs the shared suite against the local driver served by
// `berth driver serve local` through go-plugin, as berth itself uses it: the groups
// whose calls cross the plugin (testbin.PluginGroups; all of them with
// $BERTH_CONFORMANCE_FULL=1).
func TestConformancePlugin(t *testing.T) {
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	path, args := testbin.DriverCommand(t, local.Name)
	c, err := backends.Launch(ctx, backends.LaunchOptions{Path: path, Args: args, StartTimeout: testwait.Limit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Kill)
	opts := options(t, state)
	opts.OpenRegistry = conformance.RegistryOpener(nil, registry.WithBerthBinary(berthBin))
	opts.Groups = testbin.SuiteGroups(testbin.PluginGroups...)
	if err := c.Configure(ctx, backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "local"), Owner: opts.Owner}); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Protocol != backend.ProtocolVersion || info.Name != local.Name {
		t.Fatalf("Info through the plugin = %+v, want local on protocol %d", info, backend.ProtocolVersion)
	}
	conformance.Run(t, c, opts)
}
