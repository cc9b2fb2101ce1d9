package kubernetes_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/k8stest"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/kubernetes"
	"github.com/berth-sh/berth/registry"
)

// benchEnv is a berth config and state dir whose "bench:*" sessions run on the
// test cluster, for whole berth commands.
type benchEnv struct {
	c             k8stest.Cluster
	config, state string
}

// newBenchEnv is a benchEnv on the driver config cfg; with cfg.StorageClass every
// sandbox has a volume claim of that class.
func newBenchEnv(b *testing.B, c k8stest.Cluster, cfg kubernetes.Config) benchEnv {
	e := benchEnv{c: c, config: filepath.Join(b.TempDir(), "config.hcl"), state: b.TempDir()}
	storage := ""
	if cfg.StorageClass != "" {
		storage = fmt.Sprintf("storage_class = %q", cfg.StorageClass)
	}
	hcl := fmt.Sprintf(`
driver "kubernetes" {
  kubeconfig        = %q
  namespace         = %q
  agent_image       = %q
  image_pull_policy = "Never"
  %s
}
scope "bench:*" {
  driver = "kubernetes"
  image  = %q
}
`, cfg.Kubeconfig, cfg.Namespace, cfg.AgentImage, storage, c.TestImage)
	if err := os.WriteFile(e.config, []byte(hcl), 0o644); err != nil {
		b.Fatal(err)
	}
	return e
}

// berth runs the berth under test with the env's config and state dir, embedded
// (BERTH_NO_DAEMON=1: it opens the state dir and launches the driver's plugin
// itself).
func (e benchEnv) berth(args ...string) error {
	return e.berthWith([]string{"BERTH_NO_DAEMON=1"}, args...)
}

// berthDaemon runs the berth under test as a client of the env's berth serve
// (serve).
func (e benchEnv) berthDaemon(args ...string) error { return e.berthWith(nil, args...) }

func (e benchEnv) berthWith(env []string, args ...string) error {
	cmd := exec.Command(testbin.Front(berthBin), args...)
	cmd.Env = append(append(os.Environ(), "BERTH_CONFIG="+e.config, "BERTH_STATE_DIR="+e.state), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("berth %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// kubectl runs the cluster's kubectl with kubeconfig in the namespace.
func (e benchEnv) kubectl(kubeconfig string, args ...string) error {
	cmd := exec.Command(e.c.Kubectl, append([]string{"--kubeconfig", kubeconfig, "-n", e.c.Namespace}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// serve starts `berth serve` for the env (startServe).
func (e benchEnv) serve(b *testing.B) {
	cmd := exec.Command(testbin.Front(berthBin), "serve")
	cmd.Env = append(os.Environ(), "BERTH_CONFIG="+e.config, "BERTH_STATE_DIR="+e.state)
	startServe(b, cmd, e.state)
}

// BenchmarkExecRoundTrip measures the round trip of `true` in a running Pod
// sandbox, interleaved:
//   - library level: berth's agent over one kept agent connection and over a new
//     one per exec (a stream pair on the driver's kept port-forward connection),
//     an in-process registry's Exec (what berth serve runs per call; it keeps the
//     agent connection), and client-go's exec API (SPDY, a new connection per
//     exec, as kubectl);
//   - whole commands: `berth exec -s S -- true` through berth serve (berth-daemon:
//     the CLI, the daemon's HTTP API, the kept agent connection), embedded
//     (berth-embedded: berth opens the state dir, launches the driver's plugin,
//     which dials a port-forward connection: TLS and upgrade, then the agent's
//     handshake), and `kubectl exec POD -- true`.
//
// p50 and p95 in milliseconds, at least 20 rounds.
//
//	go test ./kubernetes -run '^$' -bench ExecRoundTrip -benchtime 30x
func BenchmarkExecRoundTrip(b *testing.B) {
	c, cfg := benchCluster(b)
	e := newBenchEnv(b, c, cfg)
	e.serve(b)
	if err := e.berthDaemon("exec", "-s", "bench:rt", "--", "true"); err != nil {
		b.Fatal(err)
	}
	defer e.berthDaemon("rm", "bench:rt")
	ctx := context.Background()
	d := kubernetes.New(kubernetes.WithConfig(cfg))
	defer d.Close()
	if err := d.Configure(ctx, backend.DriverSetup{StateDir: b.TempDir()}); err != nil {
		b.Fatal(err)
	}
	sbs, err := d.List(ctx, map[string]string{backend.LabelSession: "bench:rt"})
	if err != nil || len(sbs) != 1 {
		b.Fatalf("List(session=bench:rt) = %v, %v; want one sandbox", sbs, err)
	}
	name := sbs[0].Name
	pod := kubernetes.PodName(name)
	files := backend.AgentFiles{Dir: filepath.Join(e.state, "sandboxes", kubernetes.Name, name, "agent")}
	tok, err := agent.ReadToken(files.Dir)
	if err != nil {
		b.Fatal(err)
	}
	dial := func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, name) }
	kept, err := agent.NewClient(ctx, dial, agent.WithToken(tok))
	if err != nil {
		b.Fatal(err)
	}
	defer kept.Close()

	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	clientGoExec := func() error {
		req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(c.Namespace).Name(pod).SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: kubernetes.ContainerName, Command: []string{"true"}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
		ex, err := remotecommand.NewSPDYExecutor(rc, "POST", req.URL())
		if err != nil {
			return err
		}
		return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard, Stderr: io.Discard})
	}
	// An in-process registry on the same state dir and config, as berth serve
	// holds one (its own driver instance, in process).
	lc, err := config.Load(e.config)
	if err != nil {
		b.Fatal(err)
	}
	reg, err := registry.Open(ctx, lc, registry.WithStateDir(e.state), registry.WithBerthBinary(berthBin),
		registry.WithDriver(kubernetes.Name, func() backend.TerminalBackend { return kubernetes.New() }))
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	regExec := func() error {
		p, _, err := reg.Exec(ctx, "bench:rt", benchutil.TrueReq)
		return benchutil.WaitTrue(b, p, err)
	}
	if err := regExec(); err != nil {
		b.Fatal(err)
	}
	benchutil.Interleave(b, []benchutil.Way{
		{Name: "agent-kept", Run: func() error {
			p, err := kept.Exec(ctx, benchutil.TrueReq)
			return benchutil.WaitTrue(b, p, err)
		}},
		{Name: "agent-dial", Run: func() error {
			cl, err := agent.NewClient(ctx, dial, agent.WithToken(tok))
			if err != nil {
				return err
			}
			defer cl.Close()
			p, err := cl.Exec(ctx, benchutil.TrueReq)
			return benchutil.WaitTrue(b, p, err)
		}},
		{Name: "registry-exec", Run: regExec},
		{Name: "client-go-exec", Run: clientGoExec},
		{Name: "berth-daemon", Run: func() error { return e.berthDaemon("exec", "-s", "bench:rt", "--", "true") }},
		{Name: "berth-embedded", Run: func() error { return e.berth("exec", "-s", "bench:rt", "--", "true") }},
		{Name: "kubectl-exec", Run: func() error {
			return e.kubectl(c.Kubeconfig, "exec", pod, "-c", kubernetes.ContainerName, "--", "true")
		}},
	})
}

// BenchmarkCreateFirstExec measures a new session's first exec on the cluster,
// `berth exec -s bench:new-N -- true` (Pod made, agent answered, exec run), without
// a storage class and with the cluster's (a volume claim per sandbox, provisioned
// and bound before the Pod starts), against `kubectl run --rm -i --restart=Never`
// of the same image running `true`, which also waits for its Pod's deletion (run
// as the cluster admin: berth's Role has no pods/attach, which -i needs). berth's
// session is removed after each round, outside the timing (the -with-rm rows time
// the removal too: the Pod's, and the claim's and its volume's). p50 and p95 in
// milliseconds, at least 20 interleaved rounds.
//
//	go test ./kubernetes -run '^$' -bench CreateFirstExec -benchtime 30x
func BenchmarkCreateFirstExec(b *testing.B) {
	c, cfg := benchCluster(b)
	e := newBenchEnv(b, c, cfg)
	withPVC := cfg
	withPVC.StorageClass = c.StorageClass
	ev := newBenchEnv(b, c, withPVC)
	rounds := benchutil.Rounds(b)
	var first, withRm, firstPVC, withRmPVC, kubectl []time.Duration
	create := func(e benchEnv, s string, first, withRm *[]time.Duration) {
		start := time.Now()
		if err := e.berth("exec", "-s", s, "--", "true"); err != nil {
			b.Fatal(err)
		}
		*first = append(*first, time.Since(start))
		if err := e.berth("rm", s); err != nil {
			b.Fatal(err)
		}
		*withRm = append(*withRm, time.Since(start))
	}
	b.ResetTimer()
	for i := 0; i < rounds; i++ {
		create(e, fmt.Sprintf("bench:new-%d", i), &first, &withRm)
		if c.StorageClass != "" {
			create(ev, fmt.Sprintf("bench:pvc-%d", i), &firstPVC, &withRmPVC)
		}
		start := time.Now()
		if err := e.kubectl(c.AdminKubeconfig, "run", fmt.Sprintf("bench-kubectl-%d", i), "--rm", "-i", "--restart=Never", "--image="+c.TestImage, "--image-pull-policy=Never", "--", "true"); err != nil {
			b.Fatal(err)
		}
		kubectl = append(kubectl, time.Since(start))
	}
	b.StopTimer()
	names := []string{"berth-first-exec", "berth-with-rm", "kubectl-run-rm"}
	rows := [][]time.Duration{first, withRm, kubectl}
	if c.StorageClass != "" {
		names = append(names, "berth-pvc-first-exec", "berth-pvc-with-rm")
		rows = append(rows, firstPVC, withRmPVC)
	}
	benchutil.Report(b, names, rows)
}

// benchCluster is cluster for benchmarks: a benchmark without a cluster skips.
func benchCluster(b *testing.B) (k8stest.Cluster, kubernetes.Config) {
	b.Helper()
	if _, ok := k8stest.FromEnv(); !ok {
		b.Skip("no Kubernetes cluster: " + k8stest.StartHint)
	}
	c := k8stest.Require(b)
	setupOnce.Do(func() { setupRef, setupErr = setup(c) })
	if setupErr != nil {
		b.Fatal(setupErr)
	}
	return c, kubernetes.Config{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace, AgentImage: setupRef, ImagePullPolicy: "Never"}
}
