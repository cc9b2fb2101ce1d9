package kubernetes

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-sh/berth/backend"
)

// Every berth label, however long or odd, becomes a valid Kubernetes label, and
// the selector of a filter on it selects the mapped labels (and nothing for another
// value).
func TestLabelMapping(t *testing.T) {
	in := map[string]string{
		backend.LabelOwner:     "conformance-001",
		backend.LabelSession:   "chat:général/チャット/🎉 " + strings.Repeat("x", 200),
		backend.LabelCreated:   "2026-12-01T15:04:05Z",
		backend.LabelSpecHash:  strings.Repeat("ab", 32),
		backend.LabelScope:     "team:*",
		"conformance.user":     "value with spaces",
		"odd key/with/slashes": "v",
		"h.prefixed":           "h.0123",
		"empty":                "",
	}
	kl := kubeLabels(in)
	for k, v := range kl {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("key %q: %v", k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("value %q of %q: %v", v, k, errs)
		}
	}
	if kl[backend.LabelOwner] != "conformance-001" {
		t.Errorf("a valid owner value is kept as it is: %q", kl[backend.LabelOwner])
	}
	for k, v := range in {
		sel, err := labels.Parse(selector(map[string]string{k: v}))
		if err != nil {
			t.Fatalf("selector of %s=%q: %v", k, v, err)
		}
		if !sel.Matches(labels.Set(kl)) {
			t.Errorf("selector %s does not select the Pod's labels for %s=%q", sel, k, v)
		}
		other, _ := labels.Parse(selector(map[string]string{k: v + "x"}))
		if other.Matches(labels.Set(kl)) {
			t.Errorf("selector %s for another value selects %s=%q", other, k, v)
		}
	}
	if got := rawLabels(map[string]string{AnnotationLabels: encodeLabels(in)}); !backend.MatchLabels(got, in) || len(got) != len(in) {
		t.Errorf("raw labels round trip: %v", got)
	}
}

// Pod names are DNS-1123 labels: a sandbox name that is one is kept, any other
// (with _ or .) gets a hashed suffix, and two such names never share a Pod.
func TestPodName(t *testing.T) {
	if got := PodName("b-0123abcd-0123456789abcdef"); got != "b-0123abcd-0123456789abcdef" {
		t.Errorf("berth's own name changed: %q", got)
	}
	seen := map[string]string{}
	for _, n := range []string{"a_b", "a.b", "a-b", "a.", strings.Repeat("z", 62) + "_", strings.Repeat("z", 62) + "."} {
		p := PodName(n)
		if errs := validation.IsDNS1123Label(p); len(errs) > 0 {
			t.Errorf("PodName(%q) = %q: %v", n, p, errs)
		}
		if errs := validation.IsDNS1123Label(secretName(p)); len(errs) > 0 {
			t.Errorf("secretName(%q) = %q: %v", p, secretName(p), errs)
		}
		if o, dup := seen[p]; dup {
			t.Errorf("%q and %q share Pod name %q", o, n, p)
		}
		seen[p] = n
	}
}
