package registry

import (
	"testing"
	"time"
)

// The restart delay doubles with each crash in a row from Initial and stops at Max;
// zero fields take the defaults.
func TestSupervisePolicyDelay(t *testing.T) {
	var o options
	if err := WithSupervision(SupervisePolicy{Initial: 100 * time.Millisecond, Max: time.Second})(&o); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := o.supervise.delay(i); got != w*time.Millisecond {
			t.Errorf("delay(%d) = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	if got := o.supervise.delay(1000); got != time.Second {
		t.Errorf("delay(1000) = %v, want the cap", got)
	}
	if err := WithSupervision(SupervisePolicy{})(&o); err != nil || o.supervise.Initial != DefaultRestartDelay || o.supervise.Max != DefaultMaxRestartDelay || o.supervise.HealthyAfter != DefaultHealthyAfter {
		t.Errorf("defaults: %+v %v", o.supervise, err)
	}
	if err := WithSupervision(SupervisePolicy{Initial: -1})(&o); err == nil {
		t.Errorf("a negative delay was accepted")
	}
}
