package kubernetes

import (
	"encoding/hex"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/containerutil"
)

// Paths and names inside a sandbox Pod.
const (
	// ContainerName is the sandbox container's name; the agent is its first process.
	ContainerName = "sandbox"
	// InstallContainerName is the init container that copies the agent from the
	// agent image into the agent volume.
	InstallContainerName = "berth-agent"
	// NetNoneContainerName is the init container that, for network "none", deletes
	// every interface of the Pod but lo (berth agent net-none, with CAP_NET_ADMIN).
	NetNoneContainerName = "berth-net-none"
	// AgentImageBinary is the agent's path in the agent image.
	AgentImageBinary = "/" + backend.AgentBinaryName
	// tokenKey is the token's key in the Secret. The sandbox container has it in
	// its environment (agent.TokenEnv, from the Secret), never in a file: the agent
	// starts itself again without it, and root in the sandbox could read any file
	// the agent can.
	tokenKey = agent.TokenName
	// DefaultWorkdir is where a sandbox's volume is mounted, and so the working
	// directory of its execs, when the config has a storage_class and the rule sets
	// no workdir.
	DefaultWorkdir = "/work"
	// volumeVolume is the Pod's name for the volume of the sandbox's claim.
	volumeVolume = "data"
)

// pullPolicies maps the rule's pull (SandboxSpec.Pull) onto the kubelet's
// imagePullPolicy.
var pullPolicies = map[backend.PullPolicy]corev1.PullPolicy{
	backend.PullMissing: corev1.PullIfNotPresent,
	backend.PullAlways:  corev1.PullAlways,
	backend.PullNever:   corev1.PullNever,
}

// agentMemoryLimit caps the init containers (a copy of one binary, an interface
// deletion).
var agentMemoryLimit = resource.MustParse("64Mi")

// objectMeta returns the labels and annotations of the Pod and the volume claim
// of the sandbox of spec: berth's labels mapped onto Kubernetes' (kubeLabels) and
// as given (AnnotationLabels), the config's labels and annotations, the Pod name
// (LabelSandbox) and the sandbox name (AnnotationSandbox).
func objectMeta(spec backend.SandboxSpec, set settings) (labels, annotations map[string]string) {
	labels = kubeLabels(spec.Labels)
	for k, v := range set.labels {
		labels[k] = v
	}
	labels[LabelSandbox] = PodName(spec.Name)
	labels[LabelManagedBy] = "berth"
	annotations = map[string]string{}
	for k, v := range set.annotations {
		annotations[k] = v
	}
	annotations[AnnotationLabels] = encodeLabels(spec.Labels)
	annotations[AnnotationSandbox] = spec.Name
	return labels, annotations
}

// podSpec turns a spec into the sandbox's Pod and its token Secret, and returns the
// resolved default exec user. token is the agent token (nil for Validate).
func (d *Driver) podSpec(spec backend.SandboxSpec, set settings, ns string, token []byte) (*corev1.Pod, *corev1.Secret, string, error) {
	bad := func(format string, args ...any) (*corev1.Pod, *corev1.Secret, string, error) {
		return nil, nil, "", backend.Errorf(backend.ErrInvalid, "kubernetes sandbox %s: "+format, append([]any{spec.Name}, args...)...)
	}
	unsupported := func(format string, args ...any) (*corev1.Pod, *corev1.Secret, string, error) {
		return nil, nil, "", backend.Errorf(backend.ErrUnsupported, "kubernetes sandbox %s: "+format, append([]any{spec.Name}, args...)...)
	}
	if set.cfg.AgentImage == "" {
		return nil, nil, "", backend.Errorf(backend.ErrInvalid, "driver \"kubernetes\": agent_image is not set: build one with `berth image agent -o berth-agent.tar`, load it into the cluster's nodes (or push it to a registry they pull from) and set agent_image in driver \"kubernetes\" {}")
	}
	if spec.Image == "" {
		return bad("no image: set image in the scope rule (e.g. image = \"debian:bookworm\")")
	}
	if err := containerutil.CheckEnv("kubernetes sandbox "+spec.Name, spec.Env); err != nil {
		return nil, nil, "", err
	}
	var env []corev1.EnvVar
	for _, kv := range spec.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return bad("env entry %q is not KEY=VALUE", kv)
		}
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	if spec.Workdir != "" && !filepath.IsAbs(spec.Workdir) {
		return bad("workdir %q is not an absolute path", spec.Workdir)
	}
	pull := set.pull
	if spec.Pull != "" {
		p, ok := pullPolicies[spec.Pull]
		if !ok {
			return bad("pull %q: want %q, %q or %q", spec.Pull, backend.PullMissing, backend.PullAlways, backend.PullNever)
		}
		pull = p
	}
	workdir := spec.Workdir
	volumes := set.cfg.StorageClass != ""
	if volumes {
		if workdir == "" {
			workdir = DefaultWorkdir
		}
		workdir = filepath.Clean(workdir)
		if workdir == "/" || workdir == backend.AgentRoot || strings.HasPrefix(workdir, backend.AgentRoot+"/") {
			return bad("workdir %q cannot hold the sandbox's volume (storage_class in driver \"kubernetes\" {}): choose a directory such as %s", spec.Workdir, DefaultWorkdir)
		}
	}
	network := spec.Network
	switch network {
	case "":
		network = "none"
	case "none", "pod":
	default:
		return unsupported("network %q: the kubernetes driver supports %s (\"pod\" is the cluster's Pod network)", spec.Network, strings.Join(NetworkModes, ", "))
	}
	if len(spec.Mounts) > 0 {
		return unsupported("mounts: a Pod runs on a cluster node, where this host's directories are not; remove the mount blocks from the rule")
	}
	r := spec.Resources
	if r.Pids != 0 {
		return unsupported("resources.pids: Kubernetes sets a pids limit per node (the kubelet's podPidsLimit), not per Pod; remove it from the rule")
	}
	if r.CPUShares != 0 {
		return unsupported("resources.cpu_shares: Kubernetes derives CPU weight from the request (cpu_request in driver \"kubernetes\" {}); remove it from the rule")
	}
	if _, err := containerutil.ResolveLimits(r); err != nil {
		return bad("%v", err)
	}
	if spec.User == "host" {
		return bad("user \"host\" names this host's user, which means nothing on a cluster node; give a UID, UID:GID or a user name of the image")
	}
	user, err := containerutil.ResolveUser(spec.User)
	if err != nil {
		return bad("%v", err)
	}
	limits := corev1.ResourceList{}
	switch {
	case r.MemoryBytes == 0:
		limits[corev1.ResourceMemory] = *resource.NewQuantity(backend.DefaultMemoryBytes, resource.BinarySI)
	case r.MemoryBytes > 0:
		limits[corev1.ResourceMemory] = *resource.NewQuantity(r.MemoryBytes, resource.BinarySI)
	}
	if r.CPUs > 0 {
		limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(r.CPUs*1000+0.5), resource.DecimalSI)
	}
	requests := corev1.ResourceList{corev1.ResourceCPU: set.cpuRequest, corev1.ResourceMemory: set.memRequest}
	// A request above its limit is refused by the API server: cap the request.
	for k, lim := range limits {
		if req := requests[k]; req.Cmp(lim) > 0 {
			requests[k] = lim
		}
	}

	pod := PodName(spec.Name)
	secret := secretName(pod)
	labels, annotations := objectMeta(spec, set)
	if user != "" {
		annotations[AnnotationUser] = user
	}

	root := ptr.To[int64](0)
	harden := func(add ...corev1.Capability) *corev1.SecurityContext {
		return &corev1.SecurityContext{
			RunAsUser: root, RunAsGroup: root, RunAsNonRoot: ptr.To(false),
			Privileged:               ptr.To(false),
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: add},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
	}
	var keep []corev1.Capability
	for _, c := range DefaultCapabilities {
		keep = append(keep, corev1.Capability(c))
	}
	small := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("8Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: agentMemoryLimit},
	}
	install := corev1.Container{
		Name: InstallContainerName, Image: set.cfg.AgentImage, ImagePullPolicy: set.pull,
		Command:                  []string{AgentImageBinary, "install", backend.AgentMountDir},
		VolumeMounts:             []corev1.VolumeMount{{Name: "agent", MountPath: backend.AgentMountDir}},
		SecurityContext:          harden(),
		Resources:                small,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	install.SecurityContext.ReadOnlyRootFilesystem = ptr.To(true)
	inits := []corev1.Container{install}
	if network == "none" {
		nn := install
		nn.Name = NetNoneContainerName
		nn.Command = []string{AgentImageBinary, "net-none"}
		nn.VolumeMounts = nil
		nn.SecurityContext = harden("NET_ADMIN")
		nn.SecurityContext.ReadOnlyRootFilesystem = ptr.To(true)
		inits = append(inits, nn)
	}
	extra := []string{"--listen-tcp", "127.0.0.1:" + strconv.Itoa(AgentPort)}
	env = append(env, corev1.EnvVar{Name: agent.TokenEnv, ValueFrom: &corev1.EnvVarSource{
		SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: tokenKey}}})
	if volumes && user != "" {
		// The provisioner may make the volume root-owned (the host-path one: 0750),
		// and fsGroup does not apply to every volume type: the agent, root with
		// CAP_CHOWN, gives the mount point to the exec user before serving (it
		// leaves it alone for root).
		extra = append(extra, "--own-dir", workdir)
	}
	args := containerutil.AgentArgs(user, extra...)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			ServiceAccountName:            set.cfg.ServiceAccount,
			NodeSelector:                  set.nodeSelector,
			Tolerations:                   set.tolerations,
			TerminationGracePeriodSeconds: ptr.To[int64](2),
			SecurityContext:               &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			InitContainers:                inits,
			Containers: []corev1.Container{{
				Name: ContainerName, Image: spec.Image, ImagePullPolicy: pull,
				Command:    []string{backend.AgentMountDir + "/" + backend.AgentBinaryName},
				Args:       args,
				Env:        env,
				WorkingDir: workdir,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "agent", MountPath: backend.AgentMountDir, ReadOnly: true},
					{Name: "run", MountPath: backend.SocketMountDir},
				},
				SecurityContext:          harden(keep...),
				Resources:                corev1.ResourceRequirements{Limits: limits, Requests: requests},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Volumes: []corev1.Volume{
				{Name: "agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("256Mi"))}}},
				{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("1Mi"))}}},
			},
		},
	}
	if set.cfg.RuntimeClass != "" {
		p.Spec.RuntimeClassName = ptr.To(set.cfg.RuntimeClass)
	}
	if volumes {
		c := &p.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volumeVolume, MountPath: workdir})
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: volumeVolume,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: volumeName(pod)}}})
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: ns, Labels: labels,
			Annotations: map[string]string{AnnotationSandbox: spec.Name}},
		Type:      corev1.SecretTypeOpaque,
		Immutable: ptr.To(true),
		Data:      map[string][]byte{tokenKey: []byte(hex.EncodeToString(token) + "\n")},
	}
	return p, sec, user, nil
}
