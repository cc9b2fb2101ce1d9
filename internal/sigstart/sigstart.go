// Package sigstart catches SIGINT, SIGTERM and SIGHUP from the moment the berth binary
// starts, before its main function and the initialisation of its bigger dependencies
// run, so that a signal sent right after berth was started is not lost and does not
// kill berth before the command that handles it is ready.
//
// Start begins the catching. Importing package internal/sigstart/early calls it from
// that package's initialiser, which depends only on this package and os/signal, so Go
// initialises it as soon as os/signal is (the packages of a program are initialised
// in import-path order among those whose imports are done), some milliseconds before
// main: berth-cli, berth-serve and berth-agent import it. The thin berth front
// (cli/front) does not: it calls Start once it knows it runs the command itself,
// and a command it hands to berth-cli costs no signal setup. The command that runs
// then decides: one that handles the signals itself (berth exec, shell, job logs)
// Takes the channel and finds in it whatever came early; every other one Releases it,
// which gives the signals their default action back and delivers again a signal that
// came in the meantime, so it has that action now.
//
// Signals reach a Go program's channels asynchronously: the kernel hands a signal to
// one of the process's threads, whose handler passes it to a goroutine that sends it
// on. Sync waits for that hand-over, so that a command can tell for sure whether a
// signal came before a point of its own (berth exec: before it started anything).
package sigstart

import (
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Caught are the signals caught from the start.
var Caught = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

var (
	ch      = make(chan os.Signal, 16)
	mu      sync.Mutex
	decided bool // Take or Release was called
)

// syncSignal is the signal Sync sends to its own thread: a real-time signal
// (SIGRTMIN+6) that nothing else sends or uses, numbered above every signal in
// Caught.
const syncSignal = syscall.Signal(40)

// synced receives syncSignal; it stays notified for the process's life, so a late
// one never has its default action (termination).
var synced = make(chan os.Signal, 4)

// started is set by Start.
var started atomic.Bool

// Start begins catching Caught into the channel that Take returns, and the signal
// that Sync sends itself. It is idempotent and safe for concurrent use.
func Start() {
	mu.Lock()
	defer mu.Unlock()
	if started.Load() {
		return
	}
	signal.Notify(ch, Caught...)
	signal.Notify(synced, syncSignal)
	started.Store(true)
}

// Sync returns once every signal that was sent to the process before the call has been
// sent on the channels it was notified to: os/signal does that from a goroutine of its
// own, after one of the process's threads has run the signal's handler, which the
// kernel has that thread do whenever it next runs. Sync first waits (at most a
// second) until the kernel holds none of Caught pending for the process (a thread
// has taken each), then sends syncSignal to the calling thread and waits for it to
// arrive: os/signal passes signals on in the order their handlers ran (the lowest
// number first among those that came together, and syncSignal is numbered above them
// all). Only a signal whose handler another thread is in the very middle of running
// can still come after Sync returns, as any signal sent later does. The wait for
// syncSignal is bounded by a second too; neither bound is ever reached in practice.
// Before Start it returns at once.
func Sync() {
	if !started.Load() {
		return // nothing is caught: there is nothing to wait for (and syncSignal would end the process)
	}
	for len(synced) > 0 { // left from an earlier call
		<-synced
	}
	for deadline := time.Now().Add(time.Second); sharedPending() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Microsecond) // lets the thread the kernel chose run
	}
	runtime.LockOSThread()
	tid := syscall.Gettid()
	err := syscall.Tgkill(os.Getpid(), tid, syncSignal)
	runtime.UnlockOSThread()
	if err != nil {
		return
	}
	select {
	case <-synced:
	case <-time.After(time.Second):
	}
}

// sharedPending reports whether one of Caught is pending for the process as a whole
// (the ShdPnd mask of /proc/self/status): sent, and not yet taken by a thread.
func sharedPending() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(line, "ShdPnd:")
		if !ok {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return false
		}
		for _, s := range Caught {
			if mask&(1<<(uint(s.(syscall.Signal))-1)) != 0 {
				return true
			}
		}
		return false
	}
	return false
}

// Take returns the channel that has received Caught since the program started, for a
// command that handles them itself: signals that came before are in it, and later
// ones keep coming. The caller may add signals to it with signal.Notify and ends it
// with signal.Stop. After Take, Release does nothing.
func Take() chan os.Signal {
	mu.Lock()
	defer mu.Unlock()
	decided = true
	return ch
}

// Pending returns a signal of Caught that came since Start and is still in the
// channel (nil when none), taking it out. Call Sync first to see every signal sent
// before the call. After Take it returns nil: the channel is the taker's.
func Pending() os.Signal {
	mu.Lock()
	defer mu.Unlock()
	if decided {
		return nil
	}
	select {
	case s := <-ch:
		return s
	default:
		return nil
	}
}

// Release stops catching Caught for the rest of the program: they get their
// default action again (they end the process), and one that came since the start is
// sent again to the process, which then ends by it as it would have without this
// package. After Take, or a first Release, it does nothing.
func Release() {
	mu.Lock()
	defer mu.Unlock()
	if decided {
		return
	}
	decided = true
	signal.Stop(ch)
	select {
	case s := <-ch:
		sig := s.(syscall.Signal)
		signal.Reset(sig)
		syscall.Kill(os.Getpid(), sig)
		// The signal ends the process at once; should it not, end as it would.
		time.Sleep(time.Second)
		os.Exit(128 + int(sig))
	default:
	}
}
