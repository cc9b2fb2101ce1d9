package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-sh/berth/backend"
)

// Keys the driver puts on its Pods and Secrets besides the spec's labels.
const (
	// AnnotationLabels holds the sandbox's labels exactly as given (a JSON object):
	// Kubernetes label values are at most 63 characters of [A-Za-z0-9_.-], which
	// berth.created's timestamp, berth.spec-hash's 64 hex digits, berth.scope's glob
	// and raw session text do not fit. Sandbox.Labels comes from here.
	AnnotationLabels = "berth.sh/labels"
	// AnnotationSandbox holds the sandbox name (backend.SandboxSpec.Name), which the
	// Pod name equals unless the name is not a DNS-1123 label (PodName).
	AnnotationSandbox = "berth.sh/sandbox"
	// AnnotationUser holds SandboxSpec.User as resolved at Create: the default user
	// of every exec (the agent itself runs as root, started with --exec-user).
	AnnotationUser = "berth.sh/user"
	// AnnotationSpec holds, on a sandbox's volume claim, the SandboxSpec it was
	// created with (JSON), from which Create makes the Pod again after a stop, as a
	// stopped container keeps its configuration.
	AnnotationSpec = "berth.sh/spec"
	// AnnotationVolumeUID holds, on a Pod, the UID of its sandbox's volume claim:
	// the sandbox's ID (Sandbox.ID), which stays the same across a stop.
	AnnotationVolumeUID = "berth.sh/volume-uid"
	// LabelSandbox is the Pod name, on the Pod, its token Secret and its volume
	// claim, so that all are found by a selector.
	LabelSandbox = "berth.sh/sandbox"
	// LabelManagedBy is Kubernetes' recommended app.kubernetes.io/managed-by label,
	// set to "berth".
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// hashedKeyPrefix starts the Kubernetes label key that stands for a berth label
	// key that is not a valid Kubernetes label key (labelKey).
	hashedKeyPrefix = "k.berth.sh/"
	// hashedValuePrefix starts a label value that stands for a value that is not a
	// valid Kubernetes label value (labelValue).
	hashedValuePrefix = "h."
)

// hash40 is the first 40 hex digits of the SHA-256 of s.
func hash40(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:40]
}

// labelKey maps a berth label key onto a Kubernetes label key: itself when valid
// (berth.owner, berth.spec-hash, conformance.run), else hashedKeyPrefix and a hash.
func labelKey(k string) string {
	if len(validation.IsQualifiedName(k)) == 0 {
		return k
	}
	return hashedKeyPrefix + hash40(k)
}

// labelValue maps a berth label value onto a Kubernetes label value: itself when
// valid (at most 63 of [A-Za-z0-9_.-], starting and ending alphanumeric, or empty),
// else hashedValuePrefix and 40 hex digits of its SHA-256. Selection is exact-match
// only, so a hash selects as well as the value; List then compares the raw values
// of AnnotationLabels, so a (never seen) collision could not return a wrong Pod.
func labelValue(v string) string {
	if len(validation.IsValidLabelValue(v)) == 0 && !strings.HasPrefix(v, hashedValuePrefix) {
		return v
	}
	return hashedValuePrefix + hash40(v)
}

// kubeLabels returns the Kubernetes labels standing for berth labels (labelKey,
// labelValue).
func kubeLabels(labels map[string]string) map[string]string {
	out := make(map[string]string, len(labels))
	for k, v := range labels {
		out[labelKey(k)] = labelValue(v)
	}
	return out
}

// rawLabels decodes AnnotationLabels of a Pod's annotations; nil when absent or
// damaged (a Pod not made by this driver).
func rawLabels(annotations map[string]string) map[string]string {
	s, ok := annotations[AnnotationLabels]
	if !ok {
		return nil
	}
	var m map[string]string
	if json.Unmarshal([]byte(s), &m) != nil {
		return nil
	}
	return m
}

// encodeLabels is AnnotationLabels' value for labels.
func encodeLabels(labels map[string]string) string {
	b, _ := json.Marshal(labels) // a map[string]string always marshals
	return string(b)
}

// PodName returns the Pod name of sandbox name (backend.ValidateSandboxName's
// form): the name itself when it is a DNS-1123 label (a–z 0–9 -, alphanumeric at
// both ends, as berth's own names "b-…" are), so the Pod's hostname is the sandbox
// name; otherwise its characters other than a–z 0–9 - replaced by "-", cut to 46
// characters, and "-" with 16 hex digits of the name's SHA-256, so that two names
// never share a Pod. AnnotationSandbox keeps the name itself.
func PodName(name string) string {
	if len(validation.IsDNS1123Label(name)) == 0 {
		return name
	}
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	s := strings.TrimRight(string(b[:min(len(b), 46)]), "-")
	return fmt.Sprintf("%s-%s", s, hash40(name)[:16])
}

// secretName is the name of the Secret holding the agent token of Pod pod.
func secretName(pod string) string {
	if len(pod) > 63-len("-agent") {
		return pod[:63-len("-agent")-17] + "-" + hash40(pod)[:16] + "-agent"
	}
	return pod + "-agent"
}

// volumeName is the name of the volume claim of the sandbox whose Pod is pod.
func volumeName(pod string) string { return pod + "-data" }

// selector returns the label selector of List's filter: berth.owner must be set (a
// berth Pod) and every pair of filter matches, keys and values mapped as on the
// Pods (labelKey, labelValue).
func selector(filter map[string]string) string {
	parts := []string{labelKey(backend.LabelOwner)}
	for k, v := range filter {
		parts = append(parts, labelKey(k)+"="+labelValue(v))
	}
	return strings.Join(parts, ",")
}
