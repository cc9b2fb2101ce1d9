package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/internal/testsupport/k8stest"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/kubernetes"
	"github.com/berth-sh/berth/registry"
)

var berthBin string

type runner struct{ m *testing.M }

func (r runner) Run() int { return testbin.MainCLI(r.m, &berthBin) }

// TestMain enters the test cluster's network namespace (k8stest.Main) and builds
// the static berth with its driver executables (testbin).
func TestMain(m *testing.M) { k8stest.Main(runner{m}) }

var (
	setupOnce sync.Once
	setupRef  string
	setupErr  error
)

// cluster returns the test cluster and the driver config for it, or skips (fails
// under CI=true) when there is none. Once per process it applies
// docs/kubernetes-rbac.yaml (the Role berth documents, which the tests' kubeconfig
// is bound to) with the admin kubeconfig, and imports the agent image of the berth
// under test (`berth image agent`) into the node's containerd: the image the
// cluster script imported holds the berth it was started from, which may be older.
func cluster(t *testing.T) (k8stest.Cluster, kubernetes.Config) {
	t.Helper()
	c := k8stest.Require(t)
	setupOnce.Do(func() { setupRef, setupErr = setup(c) })
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	return c, kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace, AgentImage: setupRef, ImagePullPolicy: "Never", StorageClass: c.StorageClass}
}

func setup(c k8stest.Cluster) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	rbac, err := os.ReadFile(filepath.Join(testbin.ModuleRoot(), "docs", "kubernetes-rbac.yaml"))
	if err != nil {
		return "", err
	}
	doc := strings.ReplaceAll(string(rbac), "namespace: berth\n", "namespace: "+c.Namespace+"\n")
	if _, err := c.KubectlAs(ctx, c.AdminKubeconfig, doc, "apply", "-f", "-"); err != nil {
		return "", fmt.Errorf("applying docs/kubernetes-rbac.yaml: %w", err)
	}
	tar := filepath.Join(os.TempDir(), fmt.Sprintf("berth-agent-image-%d.tar", os.Getpid()))
	defer os.Remove(tar)
	out, err := exec.CommandContext(ctx, berthBin, "image", "agent", "-o", tar).Output()
	if err != nil {
		return "", fmt.Errorf("berth image agent: %w", err)
	}
	ref := strings.TrimSpace(string(out))
	if b, err := exec.CommandContext(ctx, "ctr", "-a", c.ContainerdAddress, "-n", "k8s.io", "images", "import", tar).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ctr images import %s: %v: %s", tar, err, b)
	}
	return ref, nil
}

// options are the suite's options on cluster c with driver config cfg, which the
// registry cases and the berth processes of the recovery cases read from their
// config file's driver block.
func options(c k8stest.Cluster, cfg kubernetes.Config, state string) conformance.Options {
	return conformance.Options{AgentBinary: berthBin, StateDir: state, Owner: conformance.NewOwner(), Image: c.TestImage,
		Capabilities: kubernetes.DefaultCapabilities, DriverConfig: driverBlock(cfg)}
}

// driverBlock is the driver "kubernetes" {} block of cfg's kubeconfig, namespace,
// agent image and storage class, with image_pull_policy "Never" (the test cluster
// pulls nothing).
func driverBlock(cfg kubernetes.Config) string {
	return fmt.Sprintf(`driver "kubernetes" {
  kubeconfig        = %q
  namespace         = %q
  agent_image       = %q
  image_pull_policy = "Never"
  storage_class     = %q
}`, cfg.Kubeconfig, cfg.Namespace, cfg.AgentImage, cfg.StorageClass)
}

// noneLeft checks, as the cluster admin (behind berth's back), that no Pod or
// Secret with owner's label is left in the namespace.
func noneLeft(t *testing.T, c k8stest.Cluster, owner string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	out, err := c.KubectlAs(ctx, c.AdminKubeconfig, "", "get", "pods,secrets,persistentvolumeclaims", "-l", backend.LabelOwner+"="+owner, "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "" {
		t.Errorf("objects with %s=%s left after the suite:\n%s", backend.LabelOwner, owner, out)
	}
}

// TestConformanceInProcess runs the shared suite against the kubernetes driver in
// this process, without a storage class (stop means remove: the StopStart cases
// skip; TestConformancePlugin runs them with one), then checks that nothing with
// the suite's owner label is left. Every call of this driver crosses the plugin
// protocol in TestConformancePlugin, which runs the whole suite; here (under the
// race detector, which the plugin executable lacks) run the groups that drive the
// Pod, Secret and port-forward code: lifecycle, idempotence and tty (dialled); all
// of them with $BERTH_CONFORMANCE_FULL=1. The registry groups (retention, pool,
// recovery) run once, in TestConformancePlugin, whose registry runs this driver in
// process (under the race detector too).
func TestConformanceInProcess(t *testing.T) {
	// The two suites run side by side (each has its own owner and state dir): the
	// time goes into waiting for the node to start Pods, and one after the other
	// they were the longest package of the test command (11 of its 20 minutes).
	t.Parallel()
	c, cfg := cluster(t)
	cfg.StorageClass = ""
	state := t.TempDir()
	d := kubernetes.New(kubernetes.WithConfig(cfg))
	t.Cleanup(func() { d.Close() })
	opts := options(c, cfg, state)
	opts.Groups = testbin.SuiteGroups("lifecycle", "idempotence", "tty")
	if err := d.Configure(context.Background(), backend.DriverSetup{StateDir: filepath.Join(state, "drivers", kubernetes.Name), Owner: opts.Owner}); err != nil {
		t.Fatal(err)
	}
	opts.OpenRegistry = conformance.RegistryOpener(nil, registry.WithBerthBinary(berthBin),
		registry.WithDriver(kubernetes.Name, func() backend.TerminalBackend { return kubernetes.New(kubernetes.WithConfig(cfg)) }))
	t.Run("suite", func(t *testing.T) { conformance.Run(t, d, opts) })
	noneLeft(t, c, opts.Owner)
}

// TestConformancePlugin runs the shared suite against the kubernetes driver served
// by its own executable, berth-driver-kubernetes, through go-plugin, as berth uses
// it, configured with the JSON the host decodes from a driver "kubernetes" {} block,
// with the test cluster's storage class: a volume claim per sandbox, kept across a
// stop (the StopStart cases run).
func TestConformancePlugin(t *testing.T) {
	t.Parallel()
	c, cfg := cluster(t)
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	path, args := testbin.DriverCommand(t, kubernetes.Name)
	pc, err := backends.Launch(ctx, backends.LaunchOptions{Path: path, Args: args, StartTimeout: testwait.Limit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pc.Kill)
	opts := options(c, cfg, state)
	opts.OpenRegistry = conformance.RegistryOpener(nil, registry.WithBerthBinary(berthBin),
		registry.WithDriver(kubernetes.Name, func() backend.TerminalBackend { return kubernetes.New(kubernetes.WithConfig(cfg)) }))
	raw, _ := json.Marshal(cfg)
	if err := pc.Configure(ctx, backend.DriverSetup{StateDir: filepath.Join(state, "drivers", kubernetes.Name), Owner: opts.Owner, Config: raw}); err != nil {
		t.Fatal(err)
	}
	info, err := pc.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Protocol != backend.ProtocolVersion || info.Name != kubernetes.Name || info.Capabilities.Agent != backend.AgentDial {
		t.Fatalf("Info through the plugin = %+v, want kubernetes on protocol %d reached by dial", info, backend.ProtocolVersion)
	}
	t.Run("suite", func(t *testing.T) { conformance.Run(t, pc, opts) })
	noneLeft(t, c, opts.Owner)
}

// TestDoneWhen is issue 17's check: a config rule with driver = "kubernetes" runs
// `berth exec -s team:1 -- sh -c 'echo hi > /work/x; hostname'` in a Pod, and
// team:2, a Pod of its own, cannot see /work/x.
func TestDoneWhen(t *testing.T) {
	t.Parallel()
	c, cfg := cluster(t)
	berth := newBerth(t, driverBlock(cfg)+fmt.Sprintf(`
scope "team:*" {
  driver  = "kubernetes"
  image   = %q
  workdir = "/work"
}
`, c.TestImage)).run
	t.Cleanup(func() {
		for _, s := range []string{"team:1", "team:2"} {
			if _, stderr, err := berth("rm", s); err != nil {
				t.Errorf("berth rm %s: %v: %s", s, err, stderr)
			}
		}
	})
	out, stderr, err := berth("exec", "-s", "team:1", "--", "sh", "-c", "echo hi > /work/x; hostname")
	if err != nil {
		t.Fatalf("berth exec -s team:1: %v\nstdout %q\nstderr %q", err, out, stderr)
	}
	host := strings.TrimSpace(out)
	if host == "" {
		t.Fatalf("team:1's hostname is empty (stderr %q)", stderr)
	}
	pods, err := c.KubectlAs(context.Background(), c.AdminKubeconfig, "", "get", "pods", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pods, "pod/"+host+"\n") {
		t.Errorf("team:1 ran on host %q, which is no Pod of namespace %s:\n%s", host, c.Namespace, pods)
	}
	if out, stderr, err := berth("exec", "-s", "team:1", "--", "cat", "/work/x"); err != nil || out != "hi\n" {
		t.Errorf("team:1 reading its own /work/x: %v %q %q", err, out, stderr)
	}
	out, stderr, err = berth("exec", "-s", "team:2", "--", "cat", "/work/x")
	if err == nil {
		t.Errorf("team:2 read team:1's /work/x: %q", out)
	} else if !strings.Contains(stderr, "No such file") {
		t.Errorf("team:2: want cat's 'No such file', got %v: stdout %q stderr %q", err, out, stderr)
	}
}

// TestBadInput: an image absent from the node with the rule's pull "never" fails
// Create with the Pod's waiting reason (ErrImageNeverPull: the rule's pull, not
// image_pull_policy IfNotPresent, is the sandbox image's policy) and leaves no
// Pod, Secret or volume claim; an API server that does not answer is
// ErrUnavailable naming its address, and nothing is made.
func TestBadInput(t *testing.T) {
	t.Parallel()
	c, cfg := cluster(t)
	state := t.TempDir()
	owner := "badinput-" + filepath.Base(state)
	never := cfg
	never.ImagePullPolicy = "IfNotPresent"
	d := kubernetes.New(kubernetes.WithConfig(never))
	defer d.Close()
	if err := d.Configure(context.Background(), backend.DriverSetup{StateDir: state, Owner: owner}); err != nil {
		t.Fatal(err)
	}
	bin, err := agent.Install(state, berthBin)
	if err != nil {
		t.Fatal(err)
	}
	files, err := agent.PrepareSandbox(filepath.Join(state, "sandboxes", "absent"), bin)
	if err != nil {
		t.Fatal(err)
	}
	spec := backend.SandboxSpec{Name: conformance.SandboxName(), Image: "localhost/berth-absent:never", Pull: backend.PullNever, Labels: map[string]string{backend.LabelOwner: owner}}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	_, err = d.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files})
	if err == nil || !strings.Contains(err.Error(), "ErrImageNeverPull") || !strings.Contains(err.Error(), spec.Image) {
		t.Errorf("Create with an absent image: %v, want ErrImageNeverPull naming %s", err, spec.Image)
	}
	if _, err := d.Inspect(ctx, spec.Name); !isKind(err, backend.ErrNotFound) {
		t.Errorf("Inspect after the failed Create: %v, want ErrNotFound", err)
	}
	noneLeft(t, c, owner)

	// An API server that is not there: a kubeconfig pointing at a closed port.
	kc := filepath.Join(state, "unreachable.kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: x, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: x, user: {token: x}}]
contexts: [{name: x, context: {cluster: x, user: x}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := cfg
	bad.Kubeconfig = kc
	u := kubernetes.New(kubernetes.WithConfig(bad))
	defer u.Close()
	if err := u.Configure(ctx, backend.DriverSetup{StateDir: state, Owner: owner}); err != nil {
		t.Fatal(err)
	}
	spec.Image = c.TestImage
	_, err = u.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files})
	if !isKind(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("Create against an unreachable API server: %v, want ErrUnavailable naming https://127.0.0.1:1", err)
	}
	if _, err := u.Info(ctx); !isKind(err, backend.ErrUnavailable) {
		t.Errorf("Info against an unreachable API server: %v, want ErrUnavailable", err)
	}
}

func isKind(err, kind error) bool { return err != nil && backend.KindOf(err) == kind }
