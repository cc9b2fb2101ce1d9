package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// TestRuntimeEndedPod: a session's Pod that Kubernetes ended, for real on the
// test cluster, is reported with why, whole berth commands: the call that ran
// when it ended loses its agent (exit 125), and the next call makes a new, empty
// Pod with the recreate notice naming the Pod's end (backend.Sandbox.EndReason).
//
//   - OOMKilled: a rule with a 64 MiB memory limit; the command lowers its own
//     oom_score_adj (which the sandbox may, the container runtime having set no
//     minimum) and allocates 72 MiB, past the limit whatever else the sandbox
//     uses (60 MiB, next to a smaller agent binary, once fitted), so the OOM killer
//     runs and picks berth's agent, PID 1 (its oom_score_adj, near 1000, outweighs
//     any size under the limit), and the sandbox container ends with reason
//     OOMKilled.
//   - Evicted: the command writes 3 MiB into the Pod's 1 MiB "run" emptyDir (the
//     agent's socket directory), and the kubelet's eviction manager evicts the Pod
//     (status reason Evicted, "Usage of EmptyDir volume "run" exceeds the limit"),
//     after its next volume statistics (up to a minute or two).
//
// Without a storage class: with one, the sandbox's claim outlives the Pod and the
// next call starts it again on its volume, with no notice (logged).
func TestRuntimeEndedPod(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, script, endedSays, notice string
		limit                           time.Duration
	}{
		{"OOMKilled", "echo 0 > /proc/self/oom_score_adj || exit 99; echo ready; exec dd if=/dev/zero of=/dev/null bs=72M count=1",
			"OOMKilled", "had ended (OOMKilled: out of memory, its memory limit was reached: the sandbox container's agent exited with code 137)", testwait.Limit},
		{"Evicted", "dd if=/dev/zero of=/.berth/run/fill bs=1M count=3 2>/dev/null && echo ready && exec sleep 900",
			"Evicted", `had ended (Evicted by its runtime: Usage of EmptyDir volume "run" exceeds the limit "1Mi".)`, 6 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newCLIEnv(t)
			e.cfg.StorageClass = ""
			hcl := driverBlock(e.cfg) + fmt.Sprintf("\nscope \"fault:*\" {\n  driver = \"kubernetes\"\n  image  = %q\n  resources {\n    memory = \"64m\"\n  }\n}\n", e.c.TestImage)
			if err := os.WriteFile(e.config, []byte(hcl), 0o644); err != nil {
				t.Fatal(err)
			}
			e.extra = append(e.extra, "BERTH_NO_DAEMON=1")
			s := "fault:ended-" + strings.ToLower(c.name)
			t.Cleanup(func() { e.berth("rm", s) })
			out, _ := e.must("exec", "-s", s, "--", "hostname")
			pod := strings.TrimSpace(out)
			old := e.pod(pod)

			out, stderr, err := e.berth("exec", "-s", s, "--", "sh", "-c", c.script)
			if code := exitCode(err); code == 99 {
				t.Skipf("the sandbox cannot lower its oom_score_adj (the container runtime set a minimum), so the OOM killer would not pick its agent: %q", stderr)
			} else if code != 125 || !strings.HasPrefix(out, "ready\n") || !strings.Contains(stderr, "lost the connection to the sandbox's agent while the command ran") {
				t.Fatalf("the call whose Pod Kubernetes ended: exit %d, stdout %q, stderr %q; want 125 and the lost connection", code, out, stderr)
			}
			// The Pod's status may not say it yet when the call reads it.
			if !strings.Contains(stderr, "ended during the call ("+c.endedSays) {
				t.Logf("the lost connection's notice did not name %s (the kubelet had not reported it yet): %q", c.endedSays, stderr)
			}
			// The next call reads the ended Pod: wait until Kubernetes says it ended.
			ctx, cancel := context.WithTimeout(context.Background(), c.limit)
			defer cancel()
			var now *corev1.Pod
			ended := testwait.For(ctx, c.limit, func() bool {
				now, err = e.admin.CoreV1().Pods(e.c.Namespace).Get(ctx, pod, metav1.GetOptions{})
				return err == nil && now.Status.Phase == corev1.PodFailed
			})
			if !ended {
				t.Fatalf("the Pod %s did not fail within %s: %+v %v", pod, c.limit, now, err)
			}
			out, stderr = e.must("exec", "-s", s, "--", "sh", "-c", "cat /.berth/run/fill >/dev/null 2>&1 && echo old; hostname")
			if strings.TrimSpace(out) != pod {
				t.Errorf("the next call printed %q, want a new, empty Pod %s", out, pod)
			}
			if want := "berth: session " + s + ": its previous sandbox " + pod + " on driver kubernetes " + c.notice + "; this one is new and empty"; !strings.Contains(stderr, want) {
				t.Errorf("the next call said %q, want the notice %q", stderr, want)
			}
			if e.pod(pod).UID == old.UID {
				t.Errorf("the Pod %s is still the ended one", pod)
			}
		})
	}
}

// exitCode is the exit status of a finished command's error (0 for nil, -1 when
// it did not run or exit).
func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}
