package containerd_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	cerrdefs "github.com/containerd/errdefs"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/containerd"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/registry"
)

var berthBin string

func TestMain(m *testing.M) {
	code := testbin.MainCLI(m, &berthBin)
	removeTestNamespace()
	os.Exit(code)
}

// testNamespace is the containerd namespace of this test process: its own, named by
// its pid and a random suffix, so that the leak checks (and the native-snapshot case)
// see only what these tests made, also while another checkout's tests use the same
// daemons. TestMain removes it at the end.
var testNamespace = fmt.Sprintf("berth-test-%d-%s", os.Getpid(), randSuffix())

func randSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// removeTestNamespace empties and deletes testNamespace on every daemon that is
// configured, best effort: images (deleted synchronously, so containerd's collector
// drops their content and snapshots), then any snapshots, leases and content left,
// then the namespace. What fails is printed, not fatal.
func removeTestNamespace() {
	for _, dm := range daemons {
		addr := strings.TrimPrefix(os.Getenv(dm.env), "unix://")
		if addr == "" {
			continue
		}
		if err := emptyNamespace(addr); err != nil {
			fmt.Fprintf(os.Stderr, "removing containerd namespace %s at %s: %v\n", testNamespace, addr, err)
		}
	}
}

func emptyNamespace(addr string) error {
	cli, err := client.New(addr)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, testNamespace)
	imgs, err := cli.ImageService().List(ctx)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		if err := cli.ImageService().Delete(ctx, img.Name, images.SynchronousDelete()); err != nil && !cerrdefs.IsNotFound(err) {
			return err
		}
	}
	for _, name := range []string{containerd.DefaultSnapshotter, "native"} {
		sn := cli.SnapshotService(name)
		// Children before parents: remove what no other snapshot names as parent,
		// until nothing is left or nothing more goes.
		for {
			var all []snapshots.Info
			if err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
				all = append(all, info)
				return nil
			}); err != nil {
				break // a snapshotter this daemon does not have
			}
			parents := map[string]bool{}
			for _, info := range all {
				parents[info.Parent] = true
			}
			removed := 0
			for _, info := range all {
				if !parents[info.Name] && sn.Remove(ctx, info.Name) == nil {
					removed++
				}
			}
			if removed == 0 {
				break
			}
		}
	}
	if ls, err := cli.LeasesService().List(ctx); err == nil {
		for _, l := range ls {
			cli.LeasesService().Delete(ctx, l)
		}
	}
	cli.ContentStore().Walk(ctx, func(info content.Info) error {
		cli.ContentStore().Delete(ctx, info.Digest)
		return nil
	})
	return cli.NamespaceService().Delete(ctx, testNamespace)
}

// daemon is one containerd the tests run against.
type daemon struct {
	name  string // subtest name
	env   string // the variable holding its socket
	major string // the major version it must report ("1", "2")
}

// daemons are Debian's containerd 1.6 and containerd 2.x built from its module, as
// scripts/runtimes.sh starts them.
var daemons = []daemon{
	{name: "containerd-1.6", env: "CONTAINERD_ADDRESS", major: "1"},
	{name: "containerd-2", env: "CONTAINERD2_ADDRESS", major: "2"},
}

// requireDaemon returns the socket of dm when a containerd of the right major version
// answers there; otherwise it fails the test under CI=true and skips it elsewhere,
// naming scripts/runtimes.sh (testimage.RequireContainerd). It also makes sure the
// test image is in testNamespace.
func requireDaemon(t testing.TB, dm daemon) string {
	t.Helper()
	addr := testimage.RequireContainerd(t, dm.env)
	cli, err := client.New(addr)
	if err != nil {
		t.Fatalf("%s=%s: %v", dm.env, addr, err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := cli.Version(ctx)
	if err != nil {
		t.Fatalf("containerd at %s=%s accepts connections but does not answer: %v", dm.env, addr, err)
	}
	if !strings.HasPrefix(strings.TrimPrefix(v.Version, "v"), dm.major+".") {
		t.Fatalf("%s=%s is containerd %s, want major version %s", dm.env, addr, v.Version, dm.major)
	}
	t.Logf("%s: containerd %s at %s", dm.name, v.Version, addr)
	ensureImage(t, addr)
	return addr
}

// fullMatrixOnly skips t, a subtest of forEachDaemon, when it is the daemon named
// skipOn and the whole matrix was not asked for ($BERTH_CONFORMANCE_FULL=1): each daemon
// gets one whole suite, one in process and the other through the plugin (why says which).
func fullMatrixOnly(t *testing.T, skipOn, why string) {
	t.Helper()
	if strings.HasSuffix(t.Name(), "/"+skipOn) && !testbin.FullSuites() {
		t.Skipf("%s; this way on %s runs with %s=1", why, skipOn, testbin.FullSuitesEnv)
	}
}

// forEachDaemon runs f as a subtest per daemon.
func forEachDaemon(t *testing.T, f func(t *testing.T, addr string)) {
	for _, dm := range daemons {
		t.Run(dm.name, func(t *testing.T) { f(t, requireDaemon(t, dm)) })
	}
}

func newDriver(addr string) *containerd.Driver {
	return containerd.New(containerd.WithAddress(addr), containerd.WithNamespace(testNamespace))
}

func ensureImage(t testing.TB, addr string) {
	t.Helper()
	d := newDriver(addr)
	defer d.Close()
	importImage(t, d)
}

// importImage loads the test image archive through imp (the driver in-process, or
// its plugin) and checks that it returned testimage.Ref.
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
	if !slices.Contains(refs, testimage.Ref) {
		t.Fatalf("ImportImage returned %v, want it to name %s", refs, testimage.Ref)
	}
}

// driverBlock is the config block that points a registry's containerd driver at addr
// and the test namespace.
func driverBlock(addr string) string {
	return fmt.Sprintf("driver \"containerd\" {\n  address   = %s\n  namespace = %s\n}\n\n", strconv.Quote(addr), strconv.Quote(testNamespace))
}

func options(state, addr string, reg ...registry.Option) conformance.Options {
	opener := conformance.RegistryOpener(nil, reg...)
	return conformance.Options{
		AgentBinary:  berthBin,
		StateDir:     state,
		Owner:        conformance.NewOwner(),
		Image:        testimage.Ref,
		Capabilities: containerd.DefaultCapabilities,
		OpenRegistry: func(t conformance.T, cfg string) (*registry.Registry, error) {
			return opener(t, driverBlock(addr)+cfg)
		},
		RemoveUnowned: newDriver(addr).RemoveUnowned,
	}
}

// inventory is what the test namespace holds of one kind: container ids, task ids,
// active snapshot keys.
type inventory struct {
	containers, tasks, snapshots []string
}

// takeInventory lists the containers, tasks and active (not committed: those are
// image layers) snapshots of the test namespace at addr.
func takeInventory(t testing.TB, addr string) inventory {
	t.Helper()
	cli, err := client.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, testNamespace)
	var inv inventory
	cs, err := cli.ContainerService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		inv.containers = append(inv.containers, c.ID)
	}
	ts, err := cli.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ts.GetTasks() {
		inv.tasks = append(inv.tasks, p.GetID())
	}
	err = cli.SnapshotService(containerd.DefaultSnapshotter).Walk(ctx, func(ctx context.Context, info snapshots.Info) error {
		if info.Kind != snapshots.KindCommitted {
			inv.snapshots = append(inv.snapshots, info.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// checkNoLeaks fails t when the test namespace holds a container, task or active
// snapshot that was not in before.
func checkNoLeaks(t testing.TB, addr string, before inventory) {
	t.Helper()
	after := takeInventory(t, addr)
	for _, k := range []struct {
		what          string
		before, after []string
	}{{"containers", before.containers, after.containers}, {"tasks", before.tasks, after.tasks}, {"snapshots", before.snapshots, after.snapshots}} {
		var left []string
		for _, x := range k.after {
			if !slices.Contains(k.before, x) {
				left = append(left, x)
			}
		}
		if len(left) > 0 {
			t.Errorf("containerd namespace %s holds %s left behind: %v", testNamespace, k.what, left)
		}
	}
}

// TestConformanceInProcess runs the shared suite against the containerd driver in
// this process, on containerd 1.6 (and on 2.x with $BERTH_CONFORMANCE_FULL=1: 2.x gets
// its whole suite through the plugin), and checks that nothing of it is left.
func TestConformanceInProcess(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		fullMatrixOnly(t, "containerd-2", "TestConformancePlugin runs the whole suite on containerd 2.x")
		before := takeInventory(t, addr)
		state := t.TempDir()
		d := newDriver(addr)
		opts := options(state, addr, registry.WithBerthBinary(berthBin),
			registry.WithDriver(containerd.Name, func() backend.TerminalBackend { return newDriver(addr) }))
		if err := d.Configure(context.Background(), backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "containerd"), Owner: opts.Owner}); err != nil {
			t.Fatal(err)
		}
		t.Run("suite", func(t *testing.T) { conformance.Run(t, d, opts) })
		d.Close()
		checkNoLeaks(t, addr, before)
	})
}

// TestConformancePlugin runs the shared suite against the containerd driver served by
// its own executable, berth-driver-containerd, through go-plugin, as berth itself uses it, on
// containerd 2.x (and on 1.6 with $BERTH_CONFORMANCE_FULL=1: 1.6 gets its whole suite in
// process), and checks that nothing of it is left. The registry groups
// (testbin.RegistryGroups) run in process only (on 1.6), unless the whole matrix runs.
func TestConformancePlugin(t *testing.T) {
	forEachDaemon(t, func(t *testing.T, addr string) {
		fullMatrixOnly(t, "containerd-1.6", "TestConformanceInProcess runs the whole suite on containerd 1.6")
		before := takeInventory(t, addr)
		state := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
		defer cancel()
		path, args := testbin.DriverCommand(t, containerd.Name)
		c, err := backends.Launch(ctx, backends.LaunchOptions{Path: path, Args: args, StartTimeout: testwait.Limit})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Kill()
		opts := options(state, addr, registry.WithBerthBinary(berthBin))
		opts.Groups = testbin.SuiteGroupsExcept(testbin.RegistryGroups...)
		cfg, _ := json.Marshal(map[string]string{"address": addr, "namespace": testNamespace})
		if err := c.Configure(ctx, backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "containerd"), Owner: opts.Owner, Config: cfg}); err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Protocol != backend.ProtocolVersion || info.Name != containerd.Name {
			t.Fatalf("Info through the plugin = %+v, want containerd on protocol %d", info, backend.ProtocolVersion)
		}
		importImage(t, c) // ImportImage through the plugin protocol
		t.Run("suite", func(t *testing.T) { conformance.Run(t, c, opts) })
		checkNoLeaks(t, addr, before)
	})
}
