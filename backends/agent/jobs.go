package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/agent/agentpb"
)

// job is one background job: a process in its own session whose combined output the
// agent keeps, the newest backend.JobLogMax bytes of it.
type job struct {
	id      string
	session string
	argv    []string
	pid     int
	marker  string // jobMarkerVar=AGENTPID.SEQ in the job's environment
	started time.Time

	mu      sync.Mutex
	log     []byte // ring of the newest bytes, in order once linearised by tail()
	total   int64  // bytes written in all
	ended   time.Time
	running bool
	drained bool // the output written before the leader's exit is in the log
	code    int
	sig     int
	changed chan struct{} // closed and replaced on every change
}

// notifyLocked wakes the followers; j.mu is held.
func (j *job) notifyLocked() {
	close(j.changed)
	j.changed = make(chan struct{})
}

func (j *job) append(b []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.total += int64(len(b))
	j.log = append(j.log, b...)
	if over := len(j.log) - backend.JobLogMax; over > 0 {
		j.log = append(j.log[:0:0], j.log[over:]...)
	}
	j.notifyLocked()
}

// since returns the log bytes from absolute offset off on, how many bytes before off
// are no longer kept when off is older than the log, the new offset, and whether the
// job is over (exited and its output drained), with the change channel to wait on.
func (j *job) since(off int64) (b []byte, dropped, next int64, over bool, changed <-chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	first := j.total - int64(len(j.log))
	if off < first {
		dropped = first - off
		off = first
	}
	b = append([]byte(nil), j.log[off-first:]...)
	return b, dropped, j.total, !j.running && j.drained, j.changed
}

func (j *job) info() backend.JobInfo {
	j.mu.Lock()
	defer j.mu.Unlock()
	return backend.JobInfo{
		ID: j.id, Argv: j.argv, PID: j.pid, Running: j.running, ExitCode: j.code, Signal: j.sig,
		Started: j.started, Ended: j.ended, LogBytes: j.total, DroppedBytes: j.total - int64(len(j.log)),
	}
}

// jobMarkerVar is set in every job's environment (AGENTPID.N, N unique in the agent),
// so that kill also
// finds the job's descendants that left its session (setsid) while keeping its
// environment.
const jobMarkerVar = "BERTH_JOB"

// jobTree selects the processes of job j: its session, and every process whose
// environment carries j's marker.
func jobTree(j *job) func([]procInfo) []procInfo {
	want := append([]byte(j.marker), 0)
	return func(all []procInfo) []procInfo {
		var out []procInfo
		for _, p := range all {
			if p.sid == j.pid {
				out = append(out, p)
				continue
			}
			env, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/environ")
			if err == nil && bytes.Contains(append([]byte{0}, env...), append([]byte{0}, want...)) {
				out = append(out, p)
			}
		}
		return out
	}
}

// jobTable holds the agent's jobs.
type jobTable struct {
	mu    sync.Mutex
	next  int
	byID  map[string]*job
	order []*job
}

// maxEndedJobs is how many ended jobs (with their logs) the agent keeps; older ended
// jobs are forgotten when a new one starts.
const maxEndedJobs = 32

func (t *jobTable) add(j *job) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ended := 0
	for i := len(t.order) - 1; i >= 0; i-- {
		o := t.order[i]
		o.mu.Lock()
		running := o.running
		o.mu.Unlock()
		if running {
			continue
		}
		if ended++; ended >= maxEndedJobs {
			delete(t.byID, o.id)
			t.order = append(t.order[:i], t.order[i+1:]...)
		}
	}
	t.next++
	j.id = strconv.Itoa(t.next)
	if t.byID == nil {
		t.byID = map[string]*job{}
	}
	t.byID[j.id] = j
	t.order = append(t.order, j)
}

// get returns job id of session, or a NOT_FOUND status.
func (t *jobTable) get(session, id string) (*job, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if j := t.byID[id]; j != nil && j.session == session {
		return j, nil
	}
	return nil, status.Errorf(codes.NotFound, "session %q has no job %q (berth job ls lists its jobs)", session, id)
}

// list returns session's jobs, oldest first; session AllSessions lists every job.
func (t *jobTable) list(session string) []*job {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*job
	for _, j := range t.order {
		if j.session == session || session == backend.AllSessions {
			out = append(out, j)
		}
	}
	return out
}

// jobExec serves an Exec whose start carries a job operation.
func (s *server) jobExec(stream agentpb.Agent_ExecServer, st *agentpb.ExecStart) error {
	req := st.Job
	if st.Session == "" {
		return status.Error(codes.InvalidArgument, "job: no session")
	}
	snd := &execSender{stream: stream}
	defer snd.close()
	id := s.nextID.Add(1)
	ctx := stream.Context()
	result := func(code, sig int) error {
		return snd.send(&agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Result{Result: &agentpb.ExecResult{ExitCode: int32(code), Signal: int32(sig)}}})
	}
	stdout := func(b []byte) error {
		for len(b) > 0 {
			n := min(len(b), ChunkSize)
			if err := snd.send(&agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Stdout{Stdout: b[:n]}}); err != nil {
				return err
			}
			b = b[n:]
		}
		return nil
	}
	started := func(pid int) error {
		return snd.send(&agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Started{Started: &agentpb.ExecStarted{ExecId: id, Pid: int32(pid)}}})
	}
	switch backend.JobOp(req.GetOp()) {
	case backend.JobStart:
		plan, err := s.prepare(st)
		if err != nil {
			return err
		}
		if plan.fail != nil {
			return s.sendFailure(snd, id, plan.name, plan.fail)
		}
		j, fail, err := s.startJob(plan, st.Session)
		if err != nil {
			return err
		}
		if fail != nil {
			return s.sendFailure(snd, id, plan.name, fail)
		}
		if err := started(j.pid); err != nil {
			return err
		}
		if err := stdout([]byte(j.id + "\n")); err != nil {
			return err
		}
		return result(0, 0)
	case backend.JobList:
		var b []byte
		for _, j := range s.jobs.list(st.Session) {
			line, _ := json.Marshal(j.info())
			b = append(append(b, line...), '\n')
		}
		if err := started(0); err != nil {
			return err
		}
		if err := stdout(b); err != nil {
			return err
		}
		return result(0, 0)
	case backend.JobLogs:
		j, err := s.jobs.get(st.Session, req.GetId())
		if err != nil {
			return err
		}
		if err := started(j.pid); err != nil {
			return err
		}
		var off int64
		for {
			b, dropped, next, over, changed := j.since(off)
			if dropped > 0 {
				if err := stdout(fmt.Appendf(nil, "[... %d bytes dropped ...]\n", dropped)); err != nil {
					return err
				}
			}
			if err := stdout(b); err != nil {
				return err
			}
			off = next
			if !req.GetFollow() {
				return result(0, 0)
			}
			if over {
				info := j.info()
				return result(info.ExitCode, info.Signal)
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
	case backend.JobKill:
		j, err := s.jobs.get(st.Session, req.GetId())
		if err != nil {
			return err
		}
		if err := started(j.pid); err != nil {
			return err
		}
		s.killTree(jobTree(j), s.grace)
		return result(0, 0)
	}
	return status.Errorf(codes.InvalidArgument, "job operation %q: want start, list, logs or kill", req.GetOp())
}

// startJob starts plan as a job of session: its own session, stdin /dev/null, stdout
// and stderr into one pipe that a goroutine reads into the job's log.
func (s *server) startJob(plan *execPlan, session string) (*job, *execFailure, error) {
	devnull, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "opening /dev/null: %v", err)
	}
	defer unix.Close(devnull)
	r, w, err := pipe(true, "job output")
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "job output pipe: %v", err)
	}
	marker := fmt.Sprintf("%s=%d.%d", jobMarkerVar, os.Getpid(), s.nextID.Add(1))
	attr := &syscall.ProcAttr{
		Dir:   plan.dir,
		Env:   append(append([]string(nil), plan.env...), marker),
		Files: []uintptr{uintptr(devnull), uintptr(w), uintptr(w)},
		Sys:   &syscall.SysProcAttr{Setsid: true, Credential: plan.cred},
	}
	s.blk.enter()
	pid, exitCh, ferr := s.reaper.start(func() (int, error) { return syscall.ForkExec(plan.path, plan.argv, attr) })
	s.blk.leave()
	unix.Close(w)
	if ferr != nil {
		r.Close()
		if f := failureOf(ferr); f != nil {
			return nil, f, nil
		}
		return nil, nil, status.Errorf(codes.Unavailable, "starting job %s: %v", plan.name, ferr)
	}
	j := &job{session: session, argv: plan.argv, pid: pid, marker: marker, started: time.Now().UTC(), running: true, changed: make(chan struct{})}
	s.jobs.add(j)
	s.mu.Lock()
	if s.trackSessions {
		s.sids[pid] = struct{}{}
	}
	s.mu.Unlock()
	s.log.Printf("job %s of session %q: started %s (pid %d)", j.id, session, plan.name, pid)
	// The reader keeps reading for as long as anything holds the pipe (background
	// children of the job); when the leader exits, a read deadline in the past makes it
	// drain what is already in the pipe and mark the job's output complete.
	go func() {
		buf := make([]byte, ChunkSize)
		markDrained := func() {
			j.mu.Lock()
			if !j.drained {
				j.drained = true
				j.notifyLocked()
			}
			j.mu.Unlock()
		}
		defer func() {
			r.Close()
			markDrained()
		}()
		for {
			n, err := r.Read(buf)
			if n > 0 {
				j.append(buf[:n])
			}
			if err == nil {
				continue
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				ended := drainNonBlocking(r, buf, j.append)
				markDrained()
				if ended {
					return
				}
				r.SetReadDeadline(time.Time{})
				continue
			}
			return
		}
	}()
	go func() {
		ex := <-exitCh
		code, sig := exitCode(ex.status)
		j.mu.Lock()
		j.running, j.code, j.sig, j.ended = false, code, sig, ex.at.UTC()
		j.notifyLocked()
		j.mu.Unlock()
		r.SetReadDeadline(past)
		s.log.Printf("job %s of session %q: exited %d (signal %d)", j.id, session, code, sig)
	}()
	return j, nil, nil
}
