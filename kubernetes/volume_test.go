package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/internal/testsupport/k8stest"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/kubernetes"
)

// berthRunner runs the berth under test with a config file and a state dir of
// its own, as a user would.
type berthRunner struct{ config, state string }

// newBerth writes hcl as the config of a new berthRunner.
func newBerth(t *testing.T, hcl string) berthRunner {
	t.Helper()
	b := berthRunner{config: filepath.Join(t.TempDir(), "config.hcl"), state: t.TempDir()}
	if err := os.WriteFile(b.config, []byte(hcl), 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// run runs `berth args...` and returns its stdout, stderr and error.
func (b berthRunner) run(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, testbin.Front(berthBin), args...)
	cmd.Env = append(os.Environ(), "BERTH_CONFIG="+b.config, "BERTH_STATE_DIR="+b.state)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// objects lists, as the cluster admin, the Pods and volume claims of the sandbox
// whose Pod is pod.
func objects(t *testing.T, c k8stest.Cluster, pod string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	out, err := c.KubectlAs(ctx, c.AdminKubeconfig, "", "get", "pods,persistentvolumeclaims", "-l", kubernetes.LabelSandbox+"="+pod, "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// TestVolumeKeepsWorkdir: with storage_class, a rule with a non-root user and no
// workdir runs in /work, the sandbox's volume, which that user may write although
// the test cluster's host-path provisioner makes it root-owned 0750 (the agent's
// --own-dir); `berth stop` deletes the Pod and keeps the claim, and the next exec
// makes the Pod again on it: the file in /work is there, one in /tmp is not;
// `berth rm` deletes the claim too.
func TestVolumeKeepsWorkdir(t *testing.T) {
	t.Parallel()
	c, cfg := cluster(t)
	b := newBerth(t, driverBlock(cfg)+fmt.Sprintf(`
scope "vol:*" {
  driver = "kubernetes"
  image  = %q
  user   = "1000:1000"
}
`, c.TestImage))
	out, stderr, err := b.run("exec", "-s", "vol:1", "--", "sh", "-c", "id -u; pwd; hostname; echo kept > f; echo gone > /tmp/g")
	if err != nil {
		t.Fatalf("first exec: %v: %q %q", err, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != "1000" || lines[1] != kubernetes.DefaultWorkdir {
		t.Fatalf("first exec printed %q, want uid 1000, cwd %s and the hostname", out, kubernetes.DefaultWorkdir)
	}
	pod := lines[2]
	t.Cleanup(func() {
		if _, stderr, err := b.run("rm", "vol:1"); err != nil {
			t.Errorf("berth rm vol:1: %v: %s", err, stderr)
		}
		if left := objects(t, c, pod); left != "" {
			t.Errorf("after berth rm, left:\n%s", left)
		}
	})
	if got, want := objects(t, c, pod), "pod/"+pod+"\npersistentvolumeclaim/"+pod+"-data"; got != want {
		t.Errorf("objects of the running sandbox:\n%s\nwant\n%s", got, want)
	}
	d := kubernetes.New(kubernetes.WithConfig(cfg))
	defer d.Close()
	running, err := d.Inspect(t.Context(), pod)
	if err != nil || running.State != backend.StateRunning {
		t.Fatalf("Inspect of the running sandbox: %+v %v", running, err)
	}
	if _, stderr, err := b.run("stop", "vol:1"); err != nil {
		t.Fatalf("berth stop: %v: %s", err, stderr)
	}
	if got, want := objects(t, c, pod), "persistentvolumeclaim/"+pod+"-data"; got != want {
		t.Errorf("objects of the stopped sandbox:\n%s\nwant only its claim %s", got, want)
	}
	// List reports the claim without a Pod as the stopped sandbox, with its ID
	// and labels (what reconcile and prune see).
	list, err := d.List(t.Context(), map[string]string{backend.LabelOwner: running.Labels[backend.LabelOwner]})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != pod || list[0].State != backend.StateStopped || list[0].ID != running.ID || list[0].Labels[backend.LabelSpecHash] != running.Labels[backend.LabelSpecHash] {
		t.Errorf("List after stop: %+v, want only %s stopped with ID %s and its labels", list, pod, running.ID)
	}
	out, stderr, err = b.run("exec", "-s", "vol:1", "--", "sh", "-c", "cat f; cat /tmp/g 2>/dev/null || echo no-g; hostname")
	if err != nil || out != "kept\nno-g\n"+pod+"\n" {
		t.Errorf("exec after stop: %v: stdout %q stderr %q; want the workdir's file kept, /tmp's gone, in Pod %s", err, out, stderr, pod)
	}
}

// TestCLIConformance: `berth conformance --driver kubernetes` runs the suite from
// the command line with the driver "kubernetes" {} block of the config file and
// --image (the driver imports no images: the nodes pull them), and reports its
// counts and each skip's reason: a few focused cases (the whole suite runs in
// TestConformancePlugin), the retention one through the registry the CLI opens
// with the same block.
func TestCLIConformance(t *testing.T) {
	t.Parallel()
	c, cfg := cluster(t)
	b := newBerth(t, driverBlock(cfg)+"\n")
	out, stderr, err := b.run("conformance", "--driver", kubernetes.Name, "--image", c.TestImage, "--json",
		"--run", `^(lifecycle/(create-running-labels|stop-create-adopts)|retention/on-close-stop|resources/fork-bomb-contained)$`)
	if err != nil {
		t.Fatalf("berth conformance --driver kubernetes: %v\nstdout %s\nstderr %s", err, out, stderr)
	}
	var rep conformance.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("the --json report: %v: %s", err, out)
	}
	skips := map[string]string{}
	for _, cs := range rep.Cases {
		if cs.Status == conformance.StatusSkip {
			skips[cs.FullName()] = cs.Reason
		}
	}
	if rep.Driver != kubernetes.Name || rep.Passed != 3 || rep.Failed != 0 || rep.Skipped != 1 || !strings.Contains(skips["resources/fork-bomb-contained"], "PidsLimit") {
		t.Errorf("report: driver %s, %d passed, %d failed, %d skipped (%v); want kubernetes, 3 passed, the fork bomb skipped for PidsLimit\nstderr %s", rep.Driver, rep.Passed, rep.Failed, rep.Skipped, skips, stderr)
	}
}
