package agent

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// procInfo is what the agent reads from /proc/PID/stat.
type procInfo struct {
	pid, ppid, pgrp, sid int
	state                byte
	// start is the process's start time (clock ticks after boot): with pid, it
	// names one process even after its pid is reused.
	start uint64
}

// readStat parses /proc/PID/stat; ok is false when the process is gone.
func readStat(pid int) (procInfo, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	return parseStat(pid, b)
}

func parseStat(pid int, b []byte) (procInfo, bool) {
	// "pid (comm) state ppid pgrp session ..."; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procInfo{}, false
	}
	// Field 22 of the line (starttime) is the 20th after the closing parenthesis.
	f := bytes.Fields(b[i+2:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procInfo{}, false
	}
	p := procInfo{pid: pid, state: f[0][0]}
	var err1, err2, err3, err4 error
	p.ppid, err1 = strconv.Atoi(string(f[1]))
	p.pgrp, err2 = strconv.Atoi(string(f[2]))
	p.sid, err3 = strconv.Atoi(string(f[3]))
	p.start, err4 = strconv.ParseUint(string(f[19]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return procInfo{}, false
	}
	return p, true
}

// scanProcs lists every live (not zombie) process but the agent itself, and with
// zombies also the zombies (state Z), which still count against a pids limit until
// they are reaped.
func (s *server) scanProcs(zombies bool) []procInfo {
	s.blk.enter()
	defer s.blk.leave()
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	self := os.Getpid()
	out := make([]procInfo, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self {
			continue
		}
		p, ok := readStat(pid)
		if !ok || p.state == 'X' || p.state == 'Z' && !zombies {
			continue
		}
		out = append(out, p)
	}
	return out
}

// signalProc sends sig to p if the pid still names the process p (same start time)
// in p's session (a pidfd pins the process between the check and the signal, so a
// reused pid is never hit).
func signalProc(p procInfo, sig syscall.Signal) {
	same := func() bool {
		q, ok := readStat(p.pid)
		return ok && q.sid == p.sid && q.start == p.start
	}
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return
		}
		// No pidfd support: plain kill after a fresh check.
		if same() {
			unix.Kill(p.pid, sig)
		}
		return
	}
	defer unix.Close(fd)
	if same() {
		unix.PidfdSendSignal(fd, sig, nil, 0)
	}
}

// killGiveUp is how long killTree keeps sending SIGKILL before it gives up on
// processes that do not die (stuck in uninterruptible sleep).
const killGiveUp = 30 * time.Second

// killTree sends SIGTERM to every process that selectFn picks, waits up to grace for
// them to go (woken by the reaper, rescanning /proc), then sends SIGKILL repeatedly
// until selectFn picks none. It returns when no selected process is left, not even as
// a zombie of the agent awaiting its reaper (a zombie still holds a pid of the
// sandbox's pids limit, so the next exec could not fork), or after killGiveUp of
// SIGKILLs, logging the survivors.
func (s *server) killTree(selectFn func([]procInfo) []procInfo, grace time.Duration) {
	deadline := time.Now().Add(grace)
	giveUp := deadline.Add(killGiveUp)
	termed := map[int]bool{}
	self := os.Getpid()
	for {
		changed := s.reaper.notify()
		var procs []procInfo
		reaping := 0
		for _, p := range selectFn(s.scanProcs(true)) {
			switch {
			case p.state != 'Z':
				procs = append(procs, p)
			case p.ppid == self:
				reaping++ // the reaper's; other zombies go with their parent
			}
		}
		if len(procs) == 0 && reaping == 0 {
			return
		}
		if time.Now().After(giveUp) {
			if len(procs) > 0 {
				s.log.Printf("giving up killing %d processes (first: pid %d state %c)", len(procs), procs[0].pid, procs[0].state)
			} else {
				s.log.Printf("giving up waiting for %d zombies to be reaped", reaping)
			}
			return
		}
		kill := !time.Now().Before(deadline)
		for _, p := range procs {
			switch {
			case kill:
				signalProc(p, syscall.SIGKILL)
			case !termed[p.pid]:
				termed[p.pid] = true
				signalProc(p, syscall.SIGTERM)
				// A stopped process only acts on SIGTERM once continued.
				signalProc(p, syscall.SIGCONT)
			}
		}
		wait := 20 * time.Millisecond
		if kill {
			wait = 5 * time.Millisecond
		} else if d := time.Until(deadline); d < wait {
			wait = d
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// killEverything kills every descendant of the agent and every process in a session
// that one of its execs created, with their descendants.
func (s *server) killEverything(grace time.Duration) {
	self := os.Getpid()
	s.killTree(func(all []procInfo) []procInfo {
		s.mu.Lock()
		sids := make(map[int]bool, len(s.sids))
		for sid := range s.sids {
			sids[sid] = true
		}
		s.mu.Unlock()
		return withDescendants(all, func(p procInfo) bool { return p.ppid == self || sids[p.sid] })
	}, grace)
}

// pruneSessions forgets the exec sessions in which no process is left (the set is
// used by Shutdown to find background processes that are not descendants).
func (s *server) pruneSessions() {
	defer s.pruning.Store(false)
	// Only sessions known before the scan may be dropped: a newer one may have
	// started after it.
	s.mu.Lock()
	known := make([]int, 0, len(s.sids))
	for sid := range s.sids {
		known = append(known, sid)
	}
	s.mu.Unlock()
	live := map[int]bool{}
	for _, p := range s.scanProcs(false) {
		live[p.sid] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sid := range known {
		if !live[sid] {
			delete(s.sids, sid)
		}
	}
}
