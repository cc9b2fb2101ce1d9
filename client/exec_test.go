package client

import (
	"testing"

	"github.com/berth-sh/berth/server/apiv1"
)

// A short command's whole answer can be read before berth waits for its start: the
// started event is there and the answer has ended. That is a started call, every
// time (a select between the two took it for a call that never started about half
// the time: a CI run's `berth exec -- true` through the daemon exited 125 so).
func TestWaitStartedAnswerAlreadyEnded(t *testing.T) {
	for i := range 200 {
		started := make(chan *apiv1.ExecStarted, 1)
		done := make(chan struct{})
		want := &apiv1.ExecStarted{Sandbox: "b-x"}
		started <- want
		close(done)
		if got := WaitStarted(started, done); got != want {
			t.Fatalf("round %d: waitStarted = %v with the started event there and the answer ended, want it", i, got)
		}
	}
	done := make(chan struct{})
	close(done)
	if got := WaitStarted(make(chan *apiv1.ExecStarted, 1), done); got != nil {
		t.Errorf("waitStarted = %v for an answer that ended without a started event, want nil", got)
	}
}
