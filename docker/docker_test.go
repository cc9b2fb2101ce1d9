package docker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/docker"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/registry"
)

var berthBin string

func TestMain(m *testing.M) { os.Exit(testbin.MainCLI(m, &berthBin)) }

// engine returns the engine address, or skips (fails under CI=true) when none answers,
// and makes sure the test image is there (importing it through the driver).
func engine(t *testing.T) string {
	t.Helper()
	host := testimage.RequireEngine(t)
	ensureImage(t, host)
	return host
}

func ensureImage(t testing.TB, host string) {
	t.Helper()
	d := docker.New(docker.WithHost(host))
	defer d.Close()
	importImage(t, d)
}

// importImage loads the test image archive through imp (the driver in-process, or
// its plugin) and checks that the engine now holds testimage.Ref.
func importImage(t testing.TB, imp backend.ImageImporter) {
	t.Helper()
	archive, err := testimage.Archive()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	refs, err := imp.ImportImage(ctx, bytes.NewReader(archive))
	if err != nil {
		t.Fatalf("importing the test image: %v", err)
	}
	found := false
	for _, r := range refs {
		found = found || r == testimage.Ref
	}
	if !found {
		t.Fatalf("ImportImage returned %v, want it to name %s", refs, testimage.Ref)
	}
}

func options(state string) conformance.Options {
	return conformance.Options{AgentBinary: berthBin, StateDir: state, Owner: conformance.NewOwner(), Image: testimage.Ref, Capabilities: docker.DefaultCapabilities,
		// berth processes that the recovery cases start reach the same engine.
		BerthEnv: []string{"DOCKER_HOST=" + testimage.DockerHost()}}
}

// TestConformanceInProcess runs the shared suite against the docker driver in this
// process.
func TestConformanceInProcess(t *testing.T) {
	host := engine(t)
	state := t.TempDir()
	d := docker.New(docker.WithHost(host))
	t.Cleanup(func() { d.Close() })
	opts := options(state)
	if err := d.Configure(context.Background(), backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "docker"), Owner: opts.Owner}); err != nil {
		t.Fatal(err)
	}
	opts.OpenRegistry = conformance.RegistryOpener(nil, registry.WithBerthBinary(berthBin),
		registry.WithDriver(docker.Name, func() backend.TerminalBackend { return docker.New(docker.WithHost(host)) }))
	conformance.Run(t, d, opts)
}

// TestConformancePlugin runs the shared suite against the docker driver served by
// its own executable, berth-driver-docker, through go-plugin, as berth itself uses it.
func TestConformancePlugin(t *testing.T) {
	host := engine(t)
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	path, args := testbin.DriverCommand(t, docker.Name)
	c, err := backends.Launch(ctx, backends.LaunchOptions{Path: path, Args: args, StartTimeout: testwait.Limit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Kill)
	opts := options(state)
	opts.OpenRegistry = conformance.RegistryOpener(nil, registry.WithBerthBinary(berthBin))
	// The exec, tty and terminal groups reach the agent on its socket, as in
	// TestConformanceInProcess: only the groups whose calls cross the plugin run here.
	opts.Groups = testbin.SuiteGroups(testbin.PluginGroups...)
	cfg, _ := json.Marshal(map[string]string{"host": host})
	if err := c.Configure(ctx, backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "docker"), Owner: opts.Owner, Config: cfg}); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Protocol != backend.ProtocolVersion || info.Name != docker.Name {
		t.Fatalf("Info through the plugin = %+v, want docker on protocol %d", info, backend.ProtocolVersion)
	}
	importImage(t, c) // ImportImage through the plugin protocol
	conformance.Run(t, c, opts)
}
