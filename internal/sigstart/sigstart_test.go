package sigstart

import (
	"os"
	"runtime"
	"syscall"
	"testing"
)

// raiseHere sends sig to the calling thread, which runs its handler before the call
// returns: the signal has certainly reached the process before what follows.
func raiseHere(t *testing.T, sig syscall.Signal) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := syscall.Tgkill(os.Getpid(), syscall.Gettid(), sig); err != nil {
		t.Fatal(err)
	}
}

// TestSyncDeliversEarlierSignals: a signal that reached the process before Sync is in
// the channel that Take returned once Sync returns, every time (without Sync it
// would still be on its way through os/signal's goroutine).
func TestSyncDeliversEarlierSignals(t *testing.T) {
	ch := Take()
	for i := 0; i < 500; i++ {
		sig := Caught[i%len(Caught)].(syscall.Signal)
		raiseHere(t, sig)
		Sync()
		select {
		case got := <-ch:
			if got != sig {
				t.Fatalf("round %d: got %v, want %v", i, got, sig)
			}
		default:
			t.Fatalf("round %d: %v, raised before Sync, is not in the channel after it", i, sig)
		}
	}
}

// TestReleaseAfterTake: once a command has taken the signals, Release leaves them
// caught (it must not give them their default action under the command).
func TestReleaseAfterTake(t *testing.T) {
	ch := Take()
	Release()
	raiseHere(t, syscall.SIGHUP)
	Sync()
	select {
	case s := <-ch:
		if s != syscall.SIGHUP {
			t.Fatalf("got %v", s)
		}
	default:
		t.Fatal("SIGHUP did not arrive on the taken channel after Release")
	}
}
