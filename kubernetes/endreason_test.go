package kubernetes

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sh/berth/backend"
)

// endOf reads why a Pod ended from the fields Kubernetes sets: the Pod's status
// reason first, then its DisruptionTarget condition, then the sandbox container's
// terminated reason; never the container's termination message (the sandbox
// writes it).
func TestEndOf(t *testing.T) {
	terminated := func(reason string, code int32) []corev1.ContainerStatus {
		return []corev1.ContainerStatus{{Name: ContainerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			Reason: reason, ExitCode: code, Message: "written by the sandbox\x1b[2J"}}}}
	}
	now := metav1.Now()
	for _, c := range []struct {
		name            string
		pod             corev1.Pod
		reason, message string
	}{
		{"evicted by the kubelet", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted",
			Message: "Usage of EmptyDir volume \"run\" exceeds the limit \"1Mi\".", ContainerStatuses: terminated("Error", 137)}},
			backend.EndEvicted, "Usage of EmptyDir volume \"run\" exceeds the limit \"1Mi\"."},
		{"the eviction API", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: disruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI", Message: "Eviction API: evicting"}}}},
			backend.EndEvicted, "Eviction API: evicting"},
		{"preempted", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{
			Conditions: []corev1.PodCondition{{Type: disruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler", Message: "m"}}}},
			"PreemptionByScheduler", "m"},
		{"OOM-killed", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: terminated("OOMKilled", 137)}},
			backend.EndOOMKilled, "the sandbox container's agent exited with code 137"},
		{"no reason, non-zero", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: terminated("", 2)}},
			backend.EndError, "the sandbox container's agent exited with code 2"},
		{"no reason, zero", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: terminated("", 0)}},
			backend.EndCompleted, "the sandbox container's agent exited with code 0"},
		{"deleted, no condition", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{
			Phase: corev1.PodRunning, ContainerStatuses: terminated("Error", 143)}}, "", ""},
		{"hostile status text", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted\n\x1b[31m", Message: strings.Repeat("m", 1000)}},
			"Evicted [31m", strings.Repeat("m", backend.MaxEndMessage-3) + "..."},
	} {
		sb := toSandbox(&c.pod)
		if sb.State != backend.StateStopped || sb.EndReason != c.reason || sb.EndMessage != c.message {
			t.Errorf("%s: state %s, end %q %q; want stopped, %q %q", c.name, sb.State, sb.EndReason, sb.EndMessage, c.reason, c.message)
		}
	}
	running := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: ContainerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}
	if sb := toSandbox(&running); sb.State != backend.StateRunning || sb.EndReason != "" {
		t.Errorf("a running Pod: state %s, end reason %q", sb.State, sb.EndReason)
	}
}
