package kubernetes

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

func testSettings(t *testing.T, c Config) settings {
	t.Helper()
	if c.AgentImage == "" {
		c.AgentImage = "localhost/berth-agent:test"
	}
	s, err := checkConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The Pod spec carries the hardening docs/kubernetes.md promises: every container
// drops all capabilities (the sandbox keeps berth's set, the net-none init container
// NET_ADMIN alone), no privilege escalation, seccomp RuntimeDefault, a read-only agent
// mount, the token from its Secret in the environment (no file), no service account token; limits from the spec with small
// requests; network none adds the init container that deletes the interfaces.
func TestPodSpecHardening(t *testing.T) {
	d := New()
	spec := backend.SandboxSpec{Name: "b-1", Image: "busybox", User: "1000:1000", Env: []string{"A=b"}, Workdir: "/work",
		Labels:    map[string]string{backend.LabelOwner: "o", backend.LabelCreated: "2026-12-01T15:04:05Z"},
		Resources: backend.Resources{CPUs: 0.5, MemoryBytes: 64 << 20}}
	p, sec, user, err := d.podSpec(spec, testSettings(t, Config{}), "ns", []byte{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	if user != "1000:1000" || p.Annotations[AnnotationUser] != "1000:1000" {
		t.Errorf("exec user %q, annotation %q", user, p.Annotations[AnnotationUser])
	}
	if p.Name != "b-1" || p.Namespace != "ns" || p.Spec.RestartPolicy != corev1.RestartPolicyNever || *p.Spec.AutomountServiceAccountToken {
		t.Errorf("pod %s/%s restart %s automount %v", p.Namespace, p.Name, p.Spec.RestartPolicy, *p.Spec.AutomountServiceAccountToken)
	}
	if got := []string{p.Spec.InitContainers[0].Name, p.Spec.InitContainers[1].Name}; !slices.Equal(got, []string{InstallContainerName, NetNoneContainerName}) {
		t.Errorf("init containers %v", got)
	}
	all := append(append([]corev1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...)
	for _, c := range all {
		sc := c.SecurityContext
		if sc == nil || *sc.AllowPrivilegeEscalation || *sc.Privileged || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("container %s: security context %+v", c.Name, sc)
		}
	}
	if add := p.Spec.InitContainers[1].SecurityContext.Capabilities.Add; !slices.Equal(add, []corev1.Capability{"NET_ADMIN"}) {
		t.Errorf("net-none keeps %v, want NET_ADMIN only", add)
	}
	if add := p.Spec.InitContainers[0].SecurityContext.Capabilities.Add; len(add) != 0 {
		t.Errorf("the install container keeps %v, want none", add)
	}
	sb := p.Spec.Containers[0]
	var keep []string
	for _, c := range sb.SecurityContext.Capabilities.Add {
		keep = append(keep, string(c))
	}
	if !slices.Equal(keep, DefaultCapabilities) {
		t.Errorf("sandbox keeps %v, want %v", keep, DefaultCapabilities)
	}
	for _, m := range sb.VolumeMounts {
		if (m.Name == "agent") != m.ReadOnly || m.Name == "token" {
			t.Errorf("mount %s at %s read-only %v", m.Name, m.MountPath, m.ReadOnly)
		}
	}
	// The token comes from the Secret in the environment, never in a file.
	if last := sb.Env[len(sb.Env)-1]; last.Name != agent.TokenEnv || last.ValueFrom == nil || last.ValueFrom.SecretKeyRef == nil ||
		last.ValueFrom.SecretKeyRef.Name != sec.Name || last.ValueFrom.SecretKeyRef.Key != tokenKey || slices.Contains(sb.Args, "--token-file") {
		t.Errorf("the agent's token: env %+v, args %v", sb.Env, sb.Args)
	}
	if sb.Resources.Limits.Cpu().MilliValue() != 500 || sb.Resources.Limits.Memory().Value() != 64<<20 {
		t.Errorf("limits %v", sb.Resources.Limits)
	}
	if sb.Resources.Requests.Cpu().Cmp(resource.MustParse(DefaultCPURequest)) != 0 || sb.Resources.Requests.Memory().Cmp(resource.MustParse(DefaultMemoryRequest)) != 0 {
		t.Errorf("requests %v, want %s and %s", sb.Resources.Requests, DefaultCPURequest, DefaultMemoryRequest)
	}
	if !slices.Contains(sb.Args, "--listen-tcp") || !slices.Contains(sb.Args, "--exec-user") || sb.WorkingDir != "/work" || sb.Env[0].Name != "A" {
		t.Errorf("sandbox container %+v", sb)
	}
	if string(sec.Data[tokenKey]) != "0102\n" || !*sec.Immutable || sec.Labels[backend.LabelOwner] != "o" {
		t.Errorf("secret %+v", sec)
	}
	if rawLabels(p.Annotations)[backend.LabelCreated] != "2026-12-01T15:04:05Z" {
		t.Errorf("raw labels %v", p.Annotations[AnnotationLabels])
	}

	// Network "pod" has no net-none init container; a request above the limit is capped.
	spec.Network = "pod"
	spec.Resources = backend.Resources{MemoryBytes: 16 << 20}
	p, _, _, err = d.podSpec(spec, testSettings(t, Config{MemoryRequest: "1Gi"}), "ns", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.InitContainers) != 1 || p.Spec.Containers[0].Resources.Requests.Memory().Value() != 16<<20 {
		t.Errorf("network pod: init %d, memory request %v", len(p.Spec.InitContainers), p.Spec.Containers[0].Resources.Requests.Memory())
	}
}

// What a Pod cannot do is refused with ErrUnsupported, bad values with ErrInvalid,
// each naming the input.
func TestPodSpecRefuses(t *testing.T) {
	d := New()
	set := testSettings(t, Config{})
	for _, tc := range []struct {
		edit func(*backend.SandboxSpec)
		kind error
		want string
	}{
		{func(s *backend.SandboxSpec) { s.Resources.Pids = 100 }, backend.ErrUnsupported, "pids"},
		{func(s *backend.SandboxSpec) { s.Resources.CPUShares = 100 }, backend.ErrUnsupported, "cpu_shares"},
		{func(s *backend.SandboxSpec) { s.Mounts = []backend.Mount{{Source: "/a", Target: "/b"}} }, backend.ErrUnsupported, "mounts"},
		{func(s *backend.SandboxSpec) { s.Network = "host" }, backend.ErrUnsupported, "network \"host\""},
		{func(s *backend.SandboxSpec) { s.Image = "" }, backend.ErrInvalid, "no image"},
		{func(s *backend.SandboxSpec) { s.Workdir = "rel" }, backend.ErrInvalid, "workdir"},
		{func(s *backend.SandboxSpec) { s.Env = []string{"=x"} }, backend.ErrInvalid, "env"},
		{func(s *backend.SandboxSpec) { s.Env = []string{"BERTH_AGENT_TOKEN=x"} }, backend.ErrInvalid, "BERTH_AGENT_TOKEN is berth's own"},
		{func(s *backend.SandboxSpec) { s.User = "host" }, backend.ErrInvalid, "user \"host\""},
	} {
		spec := backend.SandboxSpec{Name: "b-1", Image: "busybox"}
		tc.edit(&spec)
		_, _, _, err := d.podSpec(spec, set, "ns", nil)
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %v naming %q", spec, err, tc.kind, tc.want)
		}
	}
	if _, _, _, err := d.podSpec(backend.SandboxSpec{Name: "b-1", Image: "busybox"}, settings{}, "ns", nil); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "agent_image") {
		t.Errorf("no agent image: %v", err)
	}
	for _, c := range []Config{
		{ImagePullPolicy: "Sometimes"}, {NodeSelector: []string{"novalue"}}, {Tolerations: []string{"k=v:Often"}},
		{CPURequest: "lots"}, {StartTimeout: "-1s"}, {Labels: []string{"berth.owner=x"}}, {InCluster: true, Context: "c"},
		{StorageClass: "Not_A_Name"}, {StorageClass: "c", VolumeSize: "0"}, {VolumeSize: "big"},
	} {
		if _, err := checkConfig(c); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("checkConfig(%+v) = %v, want ErrInvalid", c, err)
		}
	}
	if s := testSettings(t, Config{Tolerations: []string{"dedicated=berth:NoSchedule", "gpu:NoExecute"}}); s.tolerations[0].Value != "berth" || s.tolerations[1].Operator != corev1.TolerationOpExists {
		t.Errorf("tolerations %+v", s.tolerations)
	}
}

// With storage_class, the sandbox container mounts the sandbox's volume claim at
// the rule's workdir, or DefaultWorkdir, which is then its working directory,
// and the agent gives the mount point to a non-root exec user (--own-dir); the
// claim asks the storage class for volume_size and keeps the spec. A workdir that
// cannot hold the volume is refused. The rule's pull becomes the sandbox image's
// imagePullPolicy; the agent image keeps image_pull_policy.
func TestPodSpecVolume(t *testing.T) {
	d := New()
	set := testSettings(t, Config{StorageClass: "fast", VolumeSize: "2Gi", ImagePullPolicy: "Never"})
	spec := backend.SandboxSpec{Name: "b-1", Image: "busybox", User: "1000", Pull: backend.PullAlways,
		Labels: map[string]string{backend.LabelOwner: "o"}}
	p, _, _, err := d.podSpec(spec, set, "ns", nil)
	if err != nil {
		t.Fatal(err)
	}
	c := p.Spec.Containers[0]
	if c.WorkingDir != DefaultWorkdir || !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == volumeVolume && m.MountPath == DefaultWorkdir && !m.ReadOnly
	}) {
		t.Errorf("workdir %q, mounts %+v: want the volume at %s", c.WorkingDir, c.VolumeMounts, DefaultWorkdir)
	}
	if i := slices.Index(c.Args, "--own-dir"); i < 0 || c.Args[i+1] != DefaultWorkdir {
		t.Errorf("agent args %v: want --own-dir %s", c.Args, DefaultWorkdir)
	}
	var claim string
	for _, v := range p.Spec.Volumes {
		if v.Name == volumeVolume && v.PersistentVolumeClaim != nil {
			claim = v.PersistentVolumeClaim.ClaimName
		}
	}
	if claim != volumeName("b-1") {
		t.Errorf("volumes %+v: want the claim %s", p.Spec.Volumes, volumeName("b-1"))
	}
	if c.ImagePullPolicy != corev1.PullAlways || p.Spec.InitContainers[0].ImagePullPolicy != corev1.PullNever {
		t.Errorf("pull policies: sandbox %s (rule's always), agent %s (image_pull_policy Never)", c.ImagePullPolicy, p.Spec.InitContainers[0].ImagePullPolicy)
	}
	pvc, err := claimSpec(spec, set, "ns")
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Name != claim || *pvc.Spec.StorageClassName != "fast" || pvc.Spec.Resources.Requests.Storage().Cmp(resource.MustParse("2Gi")) != 0 ||
		pvc.Labels[backend.LabelOwner] != "o" || pvc.Annotations[AnnotationSandbox] != "b-1" || !strings.Contains(pvc.Annotations[AnnotationSpec], `"pull":"always"`) {
		t.Errorf("claim %+v", pvc)
	}

	spec.Workdir = "/home/me/"
	spec.Pull = ""
	if p, _, _, err = d.podSpec(spec, set, "ns", nil); err != nil || p.Spec.Containers[0].WorkingDir != "/home/me" || p.Spec.Containers[0].ImagePullPolicy != corev1.PullNever {
		t.Errorf("workdir /home/me/, no pull: %v, workdir %q, pull %s", err, p.Spec.Containers[0].WorkingDir, p.Spec.Containers[0].ImagePullPolicy)
	}
	for _, w := range []string{"/", backend.AgentRoot, backend.AgentRoot + "/x"} {
		spec.Workdir = w
		if _, _, _, err := d.podSpec(spec, set, "ns", nil); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "cannot hold the sandbox's volume") {
			t.Errorf("workdir %q: %v, want ErrInvalid", w, err)
		}
	}
	spec.Workdir, spec.Pull = "", "sometimes"
	if _, _, _, err := d.podSpec(spec, set, "ns", nil); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "pull") {
		t.Errorf("pull sometimes: %v", err)
	}

	// Without a storage class there is no volume and the workdir is the rule's.
	spec.Pull = ""
	p, _, _, err = d.podSpec(spec, testSettings(t, Config{}), "ns", nil)
	if err != nil || p.Spec.Containers[0].WorkingDir != "" || slices.Contains(p.Spec.Containers[0].Args, "--own-dir") || len(p.Spec.Volumes) != 2 {
		t.Errorf("no storage class: %v, %+v", err, p.Spec)
	}
}

// Info claims StopStart, keeping the workdir's volume, only with a storage class.
func TestInfoStopStart(t *testing.T) {
	for _, sc := range []string{"", "fast"} {
		info, err := New(WithConfig(Config{StorageClass: sc})).Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if c := info.Capabilities; c.StopStart != (sc != "") || (sc != "" && c.Keeps() != backend.StopKeepsWorkdir) {
			t.Errorf("storage_class %q: StopStart %v keeps %q", sc, c.StopStart, c.Keeps())
		}
	}
}
