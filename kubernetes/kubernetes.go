// Package kubernetes is berth's Kubernetes driver: a sandbox is one Pod, named by
// the sandbox name (PodName), made through the API server with k8s.io/client-go,
// with berth's agent as the first process of its one container. An init container
// from the agent image (Config.AgentImage: an image whose only file is the static
// berth binary, as `berth image agent` writes it) copies the agent into an emptyDir
// that the sandbox container mounts read-only; the agent's token comes from a
// Secret per sandbox. The host reaches the agent through the API server: a
// port-forward (SPDY) to AgentPort on the Pod's loopback, where the agent listens
// beside its socket (Capabilities.Agent "dial"); nothing in the Pod is exposed on
// the network.
//
// A Pod cannot be stopped. With a storage class configured (Config.StorageClass)
// every sandbox has a PersistentVolumeClaim of its own, mounted at its working
// directory: Stop asks the agent to end every process and deletes the Pod, keeping
// the claim, and Create makes the Pod again on it (Capabilities.StopStart, with
// StopKeeps "workdir": the volume survives, the root filesystem does not); Remove
// deletes both. Without one, stop means remove (StopStart false). See
// docs/kubernetes.md for config keys, RBAC, hardening and limits.
package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/internal/containerutil"
)

// Name is the driver's name in config.
const Name = "kubernetes"

// init registers the driver in the catalog of drivers this program can run in
// process (catalog.Register): importing this package links it.
func init() {
	catalog.Register(Name, func() backend.TerminalBackend { return New() })
}

// Version is the driver's version string reported by Info.
const Version = "0.1.0"

// AgentPort is the loopback TCP port on which the agent listens inside each Pod's
// network namespace, the port the driver's port-forward reaches.
const AgentPort = 7070

// DefaultCapabilities are the Linux capabilities a sandbox container keeps; every
// other one is dropped. It is containerutil.DefaultCapabilities, shared with the
// docker and containerd drivers, where the reason for each is documented.
var DefaultCapabilities = containerutil.DefaultCapabilities

// NetworkModes are the SandboxSpec.Network values the driver accepts; "" means
// "none". "none" deletes every interface of the Pod but lo (an init container with
// CAP_NET_ADMIN runs `berth agent net-none`), which works on any CNI; "pod" is the
// cluster's Pod network as its CNI and NetworkPolicies make it.
var NetworkModes = []string{"none", "pod"}

// Defaults of the config block.
const (
	// DefaultCPURequest and DefaultMemoryRequest are what a sandbox container
	// requests from the scheduler when the config sets none: small, so that 50
	// sandboxes fit on one 2-core node; the limits come from the spec.
	DefaultCPURequest    = "10m"
	DefaultMemoryRequest = "32Mi"
	// DefaultStartTimeout bounds Create's wait for a new Pod's agent.
	DefaultStartTimeout = 2 * time.Minute
	// DefaultImagePullPolicy is the pull policy of the agent image, and of the
	// sandbox image when the spec carries no pull policy (SandboxSpec.Pull).
	DefaultImagePullPolicy = corev1.PullIfNotPresent
	// DefaultVolumeSize is the size each sandbox's volume claims when the config
	// sets a storage class but no volume_size.
	DefaultVolumeSize = "1Gi"
)

// Config is the `driver "kubernetes" {}` block, decoded from JSON by the host
// against ConfigSchema (see there for each attribute).
type Config struct {
	Kubeconfig      string   `json:"kubeconfig"`
	Context         string   `json:"context"`
	InCluster       bool     `json:"in_cluster"`
	Namespace       string   `json:"namespace"`
	AgentImage      string   `json:"agent_image"`
	ImagePullPolicy string   `json:"image_pull_policy"`
	ServiceAccount  string   `json:"service_account"`
	RuntimeClass    string   `json:"runtime_class"`
	NodeSelector    []string `json:"node_selector"`
	Tolerations     []string `json:"tolerations"`
	Labels          []string `json:"labels"`
	Annotations     []string `json:"annotations"`
	CPURequest      string   `json:"cpu_request"`
	MemoryRequest   string   `json:"memory_request"`
	StartTimeout    string   `json:"start_timeout"`
	StorageClass    string   `json:"storage_class"`
	VolumeSize      string   `json:"volume_size"`
}

// settings are Config checked and with defaults applied.
type settings struct {
	cfg          Config
	pull         corev1.PullPolicy
	nodeSelector map[string]string
	tolerations  []corev1.Toleration
	labels       map[string]string
	annotations  map[string]string
	cpuRequest   resource.Quantity
	memRequest   resource.Quantity
	startTimeout time.Duration
	volumeSize   resource.Quantity
}

// Driver is the Kubernetes driver. It is safe for concurrent use.
type Driver struct {
	mu       sync.Mutex
	set      settings
	owner    string
	stateDir string
	rest     *rest.Config
	cs       *kubernetes.Clientset
	ns       string
	server   string
	creating containerutil.NameLocks
	pool     forwardPool // the kept port-forward connection of each Pod
}

// Option configures a Driver built with New.
type Option func(*Driver)

// WithConfig sets the driver's config as the `driver "kubernetes" {}` block would;
// the attributes that Configure's block sets override it.
func WithConfig(c Config) Option { return func(d *Driver) { d.set.cfg = c } }

// New returns a Kubernetes driver. No connection is made until the first call that
// needs one.
func New(opts ...Option) *Driver {
	d := &Driver{}
	for _, o := range opts {
		o(d)
	}
	return d
}

var (
	_ backend.TerminalBackend = (*Driver)(nil)
	_ backend.Configurer      = (*Driver)(nil)
	_ backend.AgentDialer     = (*Driver)(nil)
	_ backend.Validator       = (*Driver)(nil)
)

// HealthTimeout bounds the API server check of Info.
const HealthTimeout = containerutil.HealthTimeout

// Info reports the driver's capabilities. Once configured it also asks the API
// server for its version (bounded by HealthTimeout): an API server that does not
// answer is ErrUnavailable, naming its address.
func (d *Driver) Info(ctx context.Context) (backend.Info, error) {
	d.mu.Lock()
	configured := d.owner != "" || d.stateDir != ""
	volumes := d.set.cfg.StorageClass != ""
	d.mu.Unlock()
	if configured {
		if err := containerutil.CheckHealth(ctx, func(ctx context.Context) error {
			cs, _, err := d.client()
			if err != nil {
				return err
			}
			_, err = cs.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
			return d.wrap("ask the API server for its version", err)
		}, func() error {
			return backend.Errorf(backend.ErrUnavailable, "kubernetes: the API server at %s did not answer within %s; check that it runs (kubectl version) or set kubeconfig/context in driver \"kubernetes\" {}", d.serverAddr(), HealthTimeout)
		}); err != nil {
			return backend.Info{}, err
		}
	}
	return backend.Info{
		Name:             Name,
		Version:          Version,
		ProtocolVersions: []int{backend.ProtocolVersion},
		Capabilities: backend.Capabilities{
			FSIsolation:      backend.FSIsolationImage,
			PIDIsolation:     true,
			NetworkModes:     append([]string(nil), NetworkModes...),
			TTY:              true,
			Agent:            backend.AgentDial,
			CPULimit:         true,
			MemoryLimit:      true,
			PidsLimit:        false, // a pids limit is the kubelet's podPidsLimit, per node: no Pod field sets it
			DropCapabilities: true,
			// Stop deletes the Pod; with a storage class the sandbox's volume at its
			// workdir is kept and the next Create makes the Pod on it again, and
			// without one stop means remove.
			StopStart: volumes,
			StopKeeps: backend.StopKeepsWorkdir,
			ExecUser:  true,
		},
	}, nil
}

// ConfigSchema declares the `driver "kubernetes" {}` block.
func (d *Driver) ConfigSchema(ctx context.Context) ([]backend.ConfigField, error) {
	return []backend.ConfigField{
		{Name: "kubeconfig", Type: "string", Description: "kubeconfig file (default $KUBECONFIG, then ~/.kube/config)"},
		{Name: "context", Type: "string", Description: "kubeconfig context (default its current-context)"},
		{Name: "in_cluster", Type: "bool", Description: "use the Pod's service account (berth running in the cluster) instead of a kubeconfig"},
		{Name: "namespace", Type: "string", Description: "namespace of the sandbox Pods (default the context's namespace, then \"default\")"},
		{Name: "agent_image", Type: "string", Description: "image holding berth's static agent as /berth-agent (berth image agent writes one)"},
		{Name: "image_pull_policy", Type: "string", Description: "Always, IfNotPresent (default) or Never: the agent image's pull policy (the sandbox image's comes from the rule's pull)"},
		{Name: "service_account", Type: "string", Description: "service account of the Pods (its token is not mounted)"},
		{Name: "runtime_class", Type: "string", Description: "RuntimeClass of the Pods (gVisor, Kata)"},
		{Name: "node_selector", Type: "list(string)", Description: "node labels the Pods need, \"KEY=VALUE\" each"},
		{Name: "tolerations", Type: "list(string)", Description: "taints the Pods tolerate, \"KEY[=VALUE]:EFFECT\" each (kubectl taint's form)"},
		{Name: "labels", Type: "list(string)", Description: "labels added to every Pod, \"KEY=VALUE\" each"},
		{Name: "annotations", Type: "list(string)", Description: "annotations added to every Pod, \"KEY=VALUE\" each"},
		{Name: "cpu_request", Type: "string", Description: "CPU each sandbox requests from the scheduler (default " + DefaultCPURequest + "); the limit is the rule's resources.cpus"},
		{Name: "memory_request", Type: "string", Description: "memory each sandbox requests (default " + DefaultMemoryRequest + "); the limit is the rule's resources.memory"},
		{Name: "start_timeout", Type: "duration", Description: "how long Create waits for a new Pod's agent (default 2m)"},
		{Name: "storage_class", Type: "string", Description: "StorageClass of each sandbox's volume, mounted at its workdir (default " + DefaultWorkdir + "), which survives a stop; unset: no volume, stop means remove"},
		{Name: "volume_size", Type: "string", Description: "size each sandbox's volume claims (default " + DefaultVolumeSize + ")"},
	}, nil
}

// Configure applies the config block and the owner. Errors wrap backend.ErrInvalid
// and name the attribute.
func (d *Driver) Configure(ctx context.Context, setup backend.DriverSetup) error {
	d.mu.Lock()
	cfg := d.set.cfg
	d.mu.Unlock()
	if len(setup.Config) > 0 && string(setup.Config) != "null" {
		// The block's attributes override WithConfig's; those it does not set keep
		// them (a registry whose config has no driver block passes "{}").
		if err := json.Unmarshal(setup.Config, &cfg); err != nil {
			return backend.Errorf(backend.ErrInvalid, "driver \"kubernetes\" config: %w", err)
		}
	}
	set, err := checkConfig(cfg)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.set = set
	d.owner = setup.Owner
	d.stateDir = setup.StateDir
	d.cs, d.rest = nil, nil
	d.pool.closeAll() // they were dialled with the clients just dropped
	return nil
}

// checkConfig checks c and applies the defaults.
func checkConfig(c Config) (settings, error) {
	bad := func(attr string, format string, args ...any) (settings, error) {
		return settings{}, backend.Errorf(backend.ErrInvalid, "driver \"kubernetes\": %s: %s", attr, fmt.Sprintf(format, args...))
	}
	s := settings{cfg: c, pull: DefaultImagePullPolicy, startTimeout: DefaultStartTimeout}
	switch p := corev1.PullPolicy(c.ImagePullPolicy); p {
	case "":
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
		s.pull = p
	default:
		return bad("image_pull_policy", "%q: want Always, IfNotPresent or Never", c.ImagePullPolicy)
	}
	if c.InCluster && (c.Kubeconfig != "" || c.Context != "") {
		return bad("in_cluster", "set either in_cluster or kubeconfig/context, not both")
	}
	var err error
	if s.nodeSelector, err = pairs("node_selector", c.NodeSelector); err != nil {
		return settings{}, err
	}
	if s.labels, err = pairs("labels", c.Labels); err != nil {
		return settings{}, err
	}
	for k := range s.labels {
		if strings.HasPrefix(k, backend.LabelPrefix) || strings.HasPrefix(k, "berth.sh/") || strings.HasPrefix(k, hashedKeyPrefix) || k == LabelManagedBy {
			return bad("labels", "%q is berth's own label; choose another key", k)
		}
	}
	if s.annotations, err = pairs("annotations", c.Annotations); err != nil {
		return settings{}, err
	}
	for k := range s.annotations {
		if strings.HasPrefix(k, "berth.sh/") {
			return bad("annotations", "%q is berth's own annotation; choose another key", k)
		}
	}
	for _, t := range c.Tolerations {
		tol, err := parseToleration(t)
		if err != nil {
			return bad("tolerations", "%v", err)
		}
		s.tolerations = append(s.tolerations, tol)
	}
	q := func(attr, v, def string) (resource.Quantity, error) {
		if v == "" {
			v = def
		}
		r, err := resource.ParseQuantity(v)
		if err != nil || r.Sign() < 0 {
			return r, backend.Errorf(backend.ErrInvalid, "driver \"kubernetes\": %s: %q is not a Kubernetes quantity (e.g. 10m, 0.5, 32Mi)", attr, v)
		}
		return r, nil
	}
	if s.cpuRequest, err = q("cpu_request", c.CPURequest, DefaultCPURequest); err != nil {
		return settings{}, err
	}
	if s.memRequest, err = q("memory_request", c.MemoryRequest, DefaultMemoryRequest); err != nil {
		return settings{}, err
	}
	if c.StorageClass != "" {
		if errs := validation.IsDNS1123Subdomain(c.StorageClass); len(errs) > 0 {
			return bad("storage_class", "%q is not a StorageClass name: %s", c.StorageClass, strings.Join(errs, "; "))
		}
	}
	if s.volumeSize, err = q("volume_size", c.VolumeSize, DefaultVolumeSize); err != nil {
		return settings{}, err
	}
	if s.volumeSize.Sign() <= 0 {
		return bad("volume_size", "%q: want a positive size such as \"1Gi\"", c.VolumeSize)
	}
	if c.StartTimeout != "" {
		if s.startTimeout, err = time.ParseDuration(c.StartTimeout); err != nil || s.startTimeout <= 0 {
			return bad("start_timeout", "%q: want a positive duration such as \"2m\"", c.StartTimeout)
		}
	}
	return s, nil
}

// pairs parses "KEY=VALUE" entries of the list attribute attr.
func pairs(attr string, list []string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(list))
	for _, e := range list {
		k, v, ok := strings.Cut(e, "=")
		if !ok || k == "" {
			return nil, backend.Errorf(backend.ErrInvalid, "driver \"kubernetes\": %s: %q is not KEY=VALUE", attr, e)
		}
		m[k] = v
	}
	return m, nil
}

// parseToleration parses kubectl taint's "KEY[=VALUE]:EFFECT" (EFFECT NoSchedule,
// PreferNoSchedule or NoExecute) as a toleration of that taint.
func parseToleration(s string) (corev1.Toleration, error) {
	kv, effect, ok := strings.Cut(s, ":")
	if !ok || kv == "" {
		return corev1.Toleration{}, fmt.Errorf("%q: want KEY[=VALUE]:EFFECT, e.g. dedicated=berth:NoSchedule", s)
	}
	t := corev1.Toleration{Effect: corev1.TaintEffect(effect), Operator: corev1.TolerationOpExists}
	switch t.Effect {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		return corev1.Toleration{}, fmt.Errorf("%q: effect %q: want NoSchedule, PreferNoSchedule or NoExecute", s, effect)
	}
	if k, v, ok := strings.Cut(kv, "="); ok {
		t.Key, t.Value, t.Operator = k, v, corev1.TolerationOpEqual
	} else {
		t.Key = kv
	}
	return t, nil
}

// client returns the clientset, the REST config and the namespace, making them on
// first use from the config (in-cluster, or the kubeconfig and context).
func (d *Driver) client() (*kubernetes.Clientset, string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cs != nil {
		return d.cs, d.ns, nil
	}
	c := d.set.cfg
	var rc *rest.Config
	ns := c.Namespace
	if c.InCluster {
		var err error
		if rc, err = rest.InClusterConfig(); err != nil {
			return nil, "", backend.Errorf(backend.ErrUnavailable, "driver \"kubernetes\": in_cluster: %w", err)
		}
		if ns == "" {
			if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
				ns = strings.TrimSpace(string(b))
			}
		}
	} else {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		if c.Kubeconfig != "" {
			rules.ExplicitPath = c.Kubeconfig
		}
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.Context})
		var err error
		if rc, err = cc.ClientConfig(); err != nil {
			where := c.Kubeconfig
			if where == "" {
				where = "$KUBECONFIG or ~/.kube/config"
			}
			return nil, "", backend.Errorf(backend.ErrInvalid, "driver \"kubernetes\": kubeconfig %s (context %q): %w; set kubeconfig and context in driver \"kubernetes\" {}, or in_cluster = true", where, c.Context, err)
		}
		if ns == "" {
			ns, _, _ = cc.Namespace()
		}
	}
	if ns == "" {
		ns = "default"
	}
	// client-go's default of 5 requests a second would queue the calls of 50
	// sandboxes made at once.
	rc.QPS, rc.Burst = 100, 200
	rc.UserAgent = "berth-driver-kubernetes/" + Version
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", backend.Errorf(backend.ErrInvalid, "driver \"kubernetes\": %w", err)
	}
	d.cs, d.rest, d.ns, d.server = cs, rc, ns, rc.Host
	return cs, ns, nil
}

// restConfig returns the REST config (after client).
func (d *Driver) restConfig() (*rest.Config, error) {
	if _, _, err := d.client(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rest, nil
}

// serverAddr is the API server's address, "" before the first connection.
func (d *Driver) serverAddr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.server == "" {
		return "(not connected)"
	}
	return d.server
}

// Close drops the clients and closes the kept port-forward connections (and the
// agent connections on them); Pods keep running.
func (d *Driver) Close() error {
	d.mu.Lock()
	d.cs, d.rest = nil, nil
	d.mu.Unlock()
	d.pool.closeAll()
	return nil
}

// wrap maps an API error to a backend error kind with op as context; the one place
// where Kubernetes' status reasons become berth's.
func (d *Driver) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if backend.KindOf(err) != nil {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("kubernetes: %s: %w", op, err)
	}
	ns := d.namespace()
	switch {
	case apierrors.IsNotFound(err) && notFoundKind(err) == "namespaces":
		return backend.Errorf(backend.ErrInvalid, "kubernetes: %s: namespace %s does not exist: create it (kubectl create namespace %s) or set namespace in driver \"kubernetes\" {} to one that does (%w)", op, ns, ns, err)
	case apierrors.IsNotFound(err):
		return backend.Errorf(backend.ErrNotFound, "kubernetes: %s: %w", op, err)
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		return backend.Errorf(backend.ErrConflict, "kubernetes: %s: %w", op, err)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return backend.Errorf(backend.ErrInvalid, "kubernetes: %s: %w", op, err)
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return backend.Errorf(backend.ErrInvalid, "kubernetes: %s in namespace %s: %w; give berth's user the Role in docs/kubernetes.md in that namespace (and check that the namespace exists)", op, ns, err)
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), apierrors.IsTooManyRequests(err):
		return backend.Errorf(backend.ErrUnavailable, "kubernetes: %s: the API server at %s is busy: %w", op, d.serverAddr(), err)
	case apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err):
		return backend.Errorf(backend.ErrUnavailable, "kubernetes: %s: %w", op, err)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		// No answer from the API server at all: connection refused, DNS, TLS.
		return backend.Errorf(backend.ErrUnavailable, "kubernetes: %s: the API server at %s does not answer (%w); check that the cluster runs (kubectl version) and that kubeconfig/context in driver \"kubernetes\" {} point at it", op, d.serverAddr(), err)
	}
	return fmt.Errorf("kubernetes: %s: %w", op, err)
}

// notFoundKind is the kind of object a NotFound error of the API server names
// ("namespaces" when the namespace is missing), "" when it names none.
func notFoundKind(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil {
		return status.Status().Details.Kind
	}
	return ""
}

// namespace is the namespace in use, "" before the first connection.
func (d *Driver) namespace() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ns
}
