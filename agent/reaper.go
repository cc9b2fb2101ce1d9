package agent

import (
	"errors"
	"log"
	"sync"
	"syscall"
	"time"
)

// exitInfo is a reaped child's wait status and when it was reaped.
type exitInfo struct {
	status syscall.WaitStatus
	at     time.Time
}

// reaper is the one owner of every wait in the agent: a wait4(-1) loop that reaps
// every child (including orphans reparented to the agent) and hands the status of
// registered pids to their waiters.
type reaper struct {
	// mu is held from before a fork until its pid is registered, and by the reaper
	// before it looks a reaped pid up, so an early exit is never lost.
	mu      sync.Mutex
	waiters map[int]chan exitInfo
	changed chan struct{} // closed and replaced after every reap
	kick    chan struct{} // a child may exist now
}

func newReaper() *reaper {
	return &reaper{
		waiters: map[int]chan exitInfo{},
		changed: make(chan struct{}),
		kick:    make(chan struct{}, 1),
	}
}

// start runs fork (which returns the new child's pid) under the reaper's lock and
// registers the pid. The returned channel receives the child's exit exactly once.
func (r *reaper) start(fork func() (int, error)) (int, <-chan exitInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	c := make(chan exitInfo, 1)
	r.waiters[pid] = c
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return pid, c, nil
}

// notify returns a channel that is closed at the next reap.
func (r *reaper) notify() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

func (r *reaper) run(logger *log.Logger) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.ECHILD):
			<-r.kick
			continue
		case err != nil:
			logger.Printf("wait4: %v", err)
			<-r.kick
			continue
		}
		now := time.Now()
		r.mu.Lock()
		c := r.waiters[pid]
		delete(r.waiters, pid)
		changed := r.changed
		r.changed = make(chan struct{})
		r.mu.Unlock()
		close(changed)
		if c != nil {
			c <- exitInfo{status: ws, at: now}
		}
	}
}
