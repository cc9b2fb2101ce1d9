package kubernetes_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/internal/testsupport/k8stest"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/kubernetes"
)

// The fault tests: each runs with its own owner and state dir, beside the others.

// fixture is an in-process driver on the test cluster with its own owner and state
// dir, and the admin's clientset to look behind its back.
type fixture struct {
	t     *testing.T
	c     k8stest.Cluster
	cfg   kubernetes.Config
	d     *kubernetes.Driver
	owner string
	state string
	admin *k8s.Clientset
	ctx   context.Context
}

func newFixture(t *testing.T, cfg func(*kubernetes.Config)) *fixture {
	t.Helper()
	c, base := cluster(t)
	if cfg != nil {
		cfg(&base)
	}
	f := &fixture{t: t, c: c, cfg: base, state: t.TempDir(), admin: adminClient(t, c)}
	f.owner = "fault-" + randID()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	t.Cleanup(cancel)
	f.ctx = ctx
	f.d = kubernetes.New(kubernetes.WithConfig(base))
	t.Cleanup(func() { f.d.Close() })
	if err := f.d.Configure(ctx, backend.DriverSetup{StateDir: f.state, Owner: f.owner}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { noneLeft(t, c, f.owner) })
	return f
}

// request is the CreateRequest of a new sandbox of f's owner on the test image,
// with its agent files.
func (f *fixture) request() backend.CreateRequest {
	f.t.Helper()
	bin, err := agent.Install(f.state, berthBin)
	if err != nil {
		f.t.Fatal(err)
	}
	name := conformance.SandboxName()
	files, err := agent.PrepareSandbox(filepath.Join(f.state, "sandboxes", name), bin)
	if err != nil {
		f.t.Fatal(err)
	}
	return backend.CreateRequest{Spec: backend.SandboxSpec{Name: name, Image: f.c.TestImage,
		Labels: map[string]string{backend.LabelOwner: f.owner, backend.LabelSession: "fault:" + name}}, Agent: files}
}

// run runs argv in sandbox name through DialAgent and returns its stdout.
func (f *fixture) run(d *kubernetes.Driver, name string, req backend.CreateRequest, argv ...string) (string, error) {
	tok, err := agent.ReadToken(req.Agent.Dir)
	if err != nil {
		return "", err
	}
	cl, err := agent.NewClient(f.ctx, func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, name) }, agent.WithToken(tok))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	var out strings.Builder
	p, err := cl.Exec(f.ctx, backend.ExecRequest{Argv: argv, Stdout: &out, Stderr: io.Discard})
	if err != nil {
		return "", err
	}
	res, err := p.Wait()
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%q exited %d", argv, res.ExitCode)
	}
	return out.String(), err
}

func randID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// adminClient is a clientset of the cluster admin's kubeconfig.
func adminClient(t *testing.T, c k8stest.Cluster) *k8s.Clientset {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", c.AdminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// writeKubeconfig writes a copy of the kubeconfig from, with server (when not "")
// and token (when not "") replaced, into dir and returns its path.
func writeKubeconfig(t *testing.T, from, dir, server, token string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range kc.Clusters {
		if server != "" {
			cl.Server = server
		}
	}
	for _, u := range kc.AuthInfos {
		if token != "" {
			u.Token = token
			u.ClientCertificateData, u.ClientKeyData, u.ClientCertificate, u.ClientKey = nil, nil, "", ""
		}
	}
	path := filepath.Join(dir, "kubeconfig-"+randID())
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// serverOf is the API server address of kubeconfig path (https://HOST:PORT).
func serverOf(t *testing.T, path string) string {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	return rc.Host
}

// TestUnreachableAPIServer: a kubeconfig pointing at a closed loopback port in the
// cluster's network namespace fails Create with ErrUnavailable naming the address,
// as Info and List do, and nothing is made (checked as the admin, behind berth's
// back).
func TestUnreachableAPIServer(t *testing.T) {
	t.Parallel()
	c, _ := cluster(t)
	// A port that nothing listens on: listen, note it, close.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	kc := writeKubeconfig(t, c.Kubeconfig, t.TempDir(), "https://"+addr, "")
	f := newFixture(t, func(cfg *kubernetes.Config) { cfg.Kubeconfig = kc })
	_, err = f.d.Create(f.ctx, f.request())
	if !isKind(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "does not answer") {
		t.Errorf("Create against an API server that does not listen: %v, want ErrUnavailable saying https://%s does not answer", err, addr)
	}
	if _, err := f.d.List(f.ctx, nil); !isKind(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
		t.Errorf("List: %v, want ErrUnavailable naming %s", err, addr)
	}
	if _, err := f.d.Info(f.ctx); !isKind(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
		t.Errorf("Info: %v, want ErrUnavailable naming %s", err, addr)
	}
}

// TestForbidden: berth's user with a Role that lacks one permission of
// docs/kubernetes-rbac.yaml fails Create with an error naming the verb and resource
// that Kubernetes refused and pointing at the Role, and leaves nothing behind. The
// ServiceAccount, its Role (the documented one less the permission) and binding are
// made by the admin for the test, and its token by the TokenRequest API.
func TestForbidden(t *testing.T) {
	t.Parallel()
	c, _ := cluster(t)
	admin := adminClient(t, c)
	for _, tc := range []struct {
		name, resource, verb string
		want                 string
	}{
		{"no-create-pods", "pods", "create", `cannot create resource "pods"`},
		{"no-portforward", "pods/portforward", "create", `cannot create resource "pods/portforward"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kc := limitedKubeconfig(t, c, admin, tc.resource, tc.verb)
			f := newFixture(t, func(cfg *kubernetes.Config) { cfg.Kubeconfig = kc })
			req := f.request()
			_, err := f.d.Create(f.ctx, req)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "docs/kubernetes.md") {
				t.Errorf("Create without %s %s: %v, want an error saying %s and pointing at the Role in docs/kubernetes.md", tc.verb, tc.resource, err, tc.want)
			}
			if _, err := admin.CoreV1().Pods(c.Namespace).Get(f.ctx, kubernetes.PodName(req.Spec.Name), metav1.GetOptions{}); err == nil {
				t.Errorf("the Pod of the failed Create is still there")
			}
		})
	}
}

// limitedKubeconfig makes a ServiceAccount bound to docs/kubernetes-rbac.yaml's
// Role without verb on resource, and returns a kubeconfig with its token. They are
// deleted when the test ends.
func limitedKubeconfig(t *testing.T, c k8stest.Cluster, admin *k8s.Clientset, resource, verb string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	role := documentedRole(t)
	name := "berth-limited-" + randID()
	role.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: c.Namespace}
	found := false
	for i, r := range role.Rules {
		for _, res := range r.Resources {
			if res != resource {
				continue
			}
			found = true
			// This resource's rule without verb; the rule's other resources keep it.
			var verbs []string
			for _, v := range r.Verbs {
				if v != verb {
					verbs = append(verbs, v)
				}
			}
			var others []string
			for _, o := range r.Resources {
				if o != resource {
					others = append(others, o)
				}
			}
			role.Rules[i].Resources = others
			role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: r.APIGroups, Resources: []string{resource}, Verbs: verbs})
		}
	}
	rules := role.Rules[:0]
	for _, r := range role.Rules {
		if len(r.Resources) > 0 {
			rules = append(rules, r)
		}
	}
	role.Rules = rules
	if !found {
		t.Fatalf("docs/kubernetes-rbac.yaml's Role has no rule for %s", resource)
	}
	del := func() {
		ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
		defer cancel()
		admin.RbacV1().RoleBindings(c.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		admin.RbacV1().Roles(c.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		admin.CoreV1().ServiceAccounts(c.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	}
	t.Cleanup(del)
	if _, err := admin.CoreV1().ServiceAccounts(c.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(c.Namespace).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(c.Namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: c.Namespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts(c.Namespace).CreateToken(ctx, name, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return writeKubeconfig(t, c.Kubeconfig, t.TempDir(), "", tr.Status.Token)
}

// documentedRole is the Role of docs/kubernetes-rbac.yaml.
func documentedRole(t *testing.T) rbacv1.Role {
	t.Helper()
	f, err := os.Open(filepath.Join(testbin.ModuleRoot(), "docs", "kubernetes-rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var r rbacv1.Role
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("no Role in docs/kubernetes-rbac.yaml: %v", err)
		}
		if r.Kind == "Role" {
			return r
		}
	}
}

// TestNoNamespace: a namespace that does not exist fails Create with an error
// naming it, for berth's user (who may do nothing there) and for the admin (for
// whom it is not found), and nothing is made.
func TestNoNamespace(t *testing.T) {
	t.Parallel()
	c, _ := cluster(t)
	ns := "berth-absent-" + randID()
	for _, who := range []struct{ name, kubeconfig string }{{"berth", c.Kubeconfig}, {"admin", c.AdminKubeconfig}} {
		t.Run(who.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, func(cfg *kubernetes.Config) { cfg.Kubeconfig, cfg.Namespace = who.kubeconfig, ns })
			_, err := f.d.Create(f.ctx, f.request())
			if err == nil || !strings.Contains(err.Error(), "namespace "+ns) {
				t.Errorf("Create in namespace %s, which does not exist: %v, want an error naming the namespace", ns, err)
			}
		})
	}
	if _, err := adminClient(t, c).CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{}); err == nil {
		t.Errorf("namespace %s exists after the test", ns)
	}
}

// TestAPIServerRestart: the API server going away mid-session (its connections
// cut, then back) leaves the session working at its next call. The shared test
// cluster's API server may not be restarted, so the driver reaches it through a TCP
// proxy that the test stops (closing every connection through it, the REST
// client's and the kept port-forward's) and starts again on the same port; the
// next DialAgent and exec work, on the same Pod.
func TestAPIServerRestart(t *testing.T) {
	t.Parallel()
	c, cfg := cluster(t)
	upstream := strings.TrimPrefix(serverOf(t, c.Kubeconfig), "https://")
	px := startProxy(t, "127.0.0.1:0", upstream)
	kc := writeKubeconfig(t, c.Kubeconfig, t.TempDir(), "https://"+px.addr, "")
	f := newFixture(t, func(cfg *kubernetes.Config) { cfg.Kubeconfig = kc })
	req := f.request()
	sb, err := f.d.Create(f.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	name := req.Spec.Name
	t.Cleanup(func() {
		// Not through the proxy, which may be down by now.
		d := kubernetes.New(kubernetes.WithConfig(cfg))
		defer d.Close()
		if err := d.Remove(context.Background(), name); err != nil {
			t.Errorf("removing the sandbox: %v", err)
		}
	})
	if out, err := f.run(f.d, name, req, "hostname"); err != nil || strings.TrimSpace(out) != kubernetes.PodName(name) {
		t.Fatalf("exec before the restart: %q %v", out, err)
	}
	cut := px.stop()
	if cut == 0 {
		t.Fatal("no connection went through the proxy")
	}
	// While the API server is away, a call says so.
	if _, err := f.d.Inspect(f.ctx, name); !isKind(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), px.addr) {
		t.Errorf("Inspect while the API server is away: %v, want ErrUnavailable naming %s", err, px.addr)
	}
	px = startProxy(t, px.addr, upstream)
	for i := 0; i < 3; i++ {
		if out, err := f.run(f.d, name, req, "hostname"); err != nil || strings.TrimSpace(out) != kubernetes.PodName(name) {
			t.Fatalf("exec %d after the API server came back: %q %v", i, out, err)
		}
	}
	if got, err := f.d.Inspect(f.ctx, name); err != nil || got.ID != sb.ID || got.State != backend.StateRunning {
		t.Errorf("after the restart: %+v %v, want the same running Pod %s", got, err, sb.ID)
	}
	if px.accepted() == 0 {
		t.Error("nothing went through the restarted proxy")
	}
}

// proxy is a TCP proxy to an upstream address, which the test can stop (closing
// every connection) and start again.
type proxy struct {
	addr  string
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
	n     int
	wg    sync.WaitGroup
}

func startProxy(t *testing.T, addr, upstream string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: l.Addr().String(), l: l}
	t.Cleanup(func() { p.stop() })
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			down, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, down, up)
			p.n++
			p.mu.Unlock()
			go func() { io.Copy(up, down); up.Close() }()
			go func() { io.Copy(down, up); down.Close() }()
		}
	}()
	return p
}

// stop closes the listener and every connection through it and returns how many
// connections it had carried.
func (p *proxy) stop() int {
	p.l.Close()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	return p.n
}

func (p *proxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// TestKeptForward: the driver dials one port-forward connection per Pod and opens
// a stream pair on it for every agent connection, sequential or concurrent; a
// deleted Pod's connection is dropped.
func TestKeptForward(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	req := f.request()
	if _, err := f.d.Create(f.ctx, req); err != nil {
		t.Fatal(err)
	}
	name, pod := req.Spec.Name, kubernetes.PodName(req.Spec.Name)
	t.Cleanup(func() { f.d.Remove(context.Background(), name) })
	if kubernetes.KeptPairs(f.d)[pod] == 0 {
		t.Fatalf("after Create no connection to Pod %s is kept: %v", pod, kubernetes.KeptPairs(f.d))
	}
	// One exec first: Create's readiness client sometimes has gRPC dial its agent a
	// second time as it closes (a reconnect whose handshake the close cancels), and
	// that pair, closed without a byte, retires Create's connection (see forward), so
	// the first exec may open a new one. From then on every dial must share one.
	if _, err := f.run(f.d, name, req, "true"); err != nil {
		t.Fatal(err)
	}
	before := kubernetes.KeptPairs(f.d)[pod] // 0 when that exec ended on the retired one
	for i := 0; i < 4; i++ {
		if _, err := f.run(f.d, name, req, "true"); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.run(f.d, name, req, "true"); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := kubernetes.KeptPairs(f.d)[pod]; got != before+9 {
		t.Errorf("9 agent connections opened %d stream pairs on the kept connection (from %d to %d), want 9 on one connection: %v", got-before, before, got, kubernetes.KeptPairs(f.d))
	}
	if err := f.d.Remove(f.ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, ok := kubernetes.KeptPairs(f.d)[pod]; ok {
		t.Errorf("the connection to the removed Pod %s is still kept", pod)
	}
}
