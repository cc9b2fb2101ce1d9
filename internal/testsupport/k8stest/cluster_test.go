package k8stest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

// testTimeout bounds each kubectl wait: generous for a loaded 2-core machine; the
// waits end as soon as the condition holds.
const testTimeout = 5 * time.Minute

func suffix() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// runPod applies the Pod name of the YAML pod as the ServiceAccount berth, deletes it
// when t ends, waits until it has succeeded and returns the log of its container.
func runPod(ctx context.Context, t *testing.T, c Cluster, name, pod, container string) string {
	t.Helper()
	if _, err := c.KubectlAs(ctx, c.Kubeconfig, pod, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.KubectlAs(context.Background(), c.Kubeconfig, "", "delete", "pod", name, "--wait=true", "--ignore-not-found")
	})
	if _, err := c.KubectlAs(ctx, c.Kubeconfig, "", "wait", "pod/"+name, "--for=jsonpath={.status.phase}=Succeeded", "--timeout="+testTimeout.String()); err != nil {
		st, _ := c.KubectlAs(context.Background(), c.Kubeconfig, "", "get", "pod", name, "-o", "jsonpath={.status}")
		t.Fatalf("%v; the Pod's status: %s", err, st)
	}
	out, err := c.KubectlAs(ctx, c.Kubeconfig, "", "logs", name, "-c", container)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPodRunsTestImage: a Pod from the imported test image (imagePullPolicy Never)
// runs to completion under the berth ServiceAccount's Role, and its log holds what it
// printed; its hostname is its name (it ran in a Pod sandbox of its own).
func TestPodRunsTestImage(t *testing.T) {
	c := Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	name := "k8stest-smoke-" + suffix()
	marker := "hello-" + suffix()
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "echo %s $(hostname)"]
`, name, c.TestImage, marker)
	out := runPod(ctx, t, c, name, pod, "main")
	if want := marker + " " + name + "\n"; out != want {
		t.Errorf("the Pod's log is %q, want %q", out, want)
	}
}

// TestAgentImageInstallsAgent: the agent image's init container copies berth's agent
// into an emptyDir, and the sandbox container, mounting it read-only, finds the very
// binary the image tag names (its SHA-256 starts with the tag).
func TestAgentImageInstallsAgent(t *testing.T) {
	c := Require(t)
	_, tag, ok := strings.Cut(strings.TrimPrefix(c.AgentImage, "localhost/"), ":")
	if !ok || c.AgentImage == "" {
		t.Fatalf("BERTH_K8S_AGENT_IMAGE=%q has no tag", c.AgentImage)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	name := "k8stest-agent-" + suffix()
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  volumes:
  - {name: agent, emptyDir: {}}
  initContainers:
  - name: agent
    image: %s
    imagePullPolicy: Never
    args: ["/berth"]
    volumeMounts: [{name: agent, mountPath: /berth}]
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "sha256sum /berth/berth-agent; touch /berth/x 2>/dev/null || echo read-only"]
    volumeMounts: [{name: agent, mountPath: /berth, readOnly: true}]
`, name, c.AgentImage, c.TestImage)
	out := runPod(ctx, t, c, name, pod, "main")
	if !strings.HasPrefix(out, tag) || !strings.Contains(out, " /berth/berth-agent\n") || !strings.Contains(out, "read-only") {
		t.Errorf("the sandbox container printed %q, want the agent's sha256sum starting with %s and a refused write", out, tag)
	}
}

// TestStorageClassClaims: 50 claims of the cluster's StorageClass, made at once, are
// all bound, each to a volume of its own backed by a host directory; deleting the
// claims deletes their volumes and directories, so claims never run out over repeated
// runs.
func TestStorageClassClaims(t *testing.T) {
	c := Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	const n = 50
	run := "k8stest-" + suffix()
	var yaml strings.Builder
	for i := range n {
		fmt.Fprintf(&yaml, `---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s-%d, labels: {k8stest-run: %s}}
spec:
  storageClassName: %s
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Mi}}
`, run, i, run, c.StorageClass)
	}
	if _, err := c.KubectlAs(ctx, c.Kubeconfig, yaml.String(), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	cleanup := func() {
		c.KubectlAs(context.Background(), c.Kubeconfig, "", "delete", "pvc", "-l", "k8stest-run="+run, "--wait=true")
	}
	t.Cleanup(cleanup)
	if _, err := c.KubectlAs(ctx, c.Kubeconfig, "", "wait", "pvc", "-l", "k8stest-run="+run, "--for=jsonpath={.status.phase}=Bound", "--timeout="+testTimeout.String()); err != nil {
		t.Fatal(err)
	}
	out, err := c.KubectlAs(ctx, c.Kubeconfig, "", "get", "pvc", "-l", "k8stest-run="+run, "-o", "jsonpath={range .items[*]}{.spec.volumeName}{\"\\n\"}{end}")
	if err != nil {
		t.Fatal(err)
	}
	pvs := strings.Fields(out)
	if len(pvs) != n {
		t.Fatalf("%d claims bound to volumes %v, want %d", n, pvs, n)
	}
	var dirs []string
	for _, pv := range pvs {
		dir, err := c.KubectlAs(ctx, c.AdminKubeconfig, "", "get", "pv", pv, "-o", "jsonpath={.spec.hostPath.path}")
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || filepath.Dir(dir) != "/tmp/hostpath_pv" {
			t.Fatalf("volume %s: host directory %q: %v", pv, dir, err)
		}
		dirs = append(dirs, dir)
	}
	cleanup()
	for _, pv := range pvs {
		if _, err := c.KubectlAs(ctx, c.AdminKubeconfig, "", "wait", "--for=delete", "pv/"+pv, "--timeout="+testTimeout.String()); err != nil {
			t.Fatalf("volume %s of a deleted claim: %v", pv, err)
		}
	}
	for _, dir := range dirs {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("host directory %s of a deleted volume: %v, want it gone", dir, err)
		}
	}
}
