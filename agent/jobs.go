package agent

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
)

// job is one background job: a process in its own session whose combined output the
// agent keeps, the newest JobLogMax bytes of it.
type job struct {
	id      string
	session string
	argv    []string
	pid     int
	marker  string // jobMarkerVar=INSTANCE.N in the job's environment (tree.go)
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
	if over := len(j.log) - JobLogMax; over > 0 {
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

func (j *job) info() *agentpb.Job {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := &agentpb.Job{
		Id: j.id, Session: j.session, Argv: j.argv, Pid: int32(j.pid), Running: j.running,
		ExitCode: int32(j.code), Signal: int32(j.sig), StartedNs: j.started.UnixNano(),
		LogBytes: j.total, DroppedBytes: j.total - int64(len(j.log)),
	}
	if !j.ended.IsZero() {
		out.EndedNs = j.ended.UnixNano()
	}
	return out
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

// get returns job id of session, or ErrNotFound.
func (t *jobTable) get(session, id string) (*job, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if j := t.byID[id]; j != nil && j.session == session {
		return j, nil
	}
	return nil, backend.Errorf(backend.ErrNotFound, "session %q has no job %q (berth job ls lists its jobs)", session, id)
}

// list returns session's jobs (every job with all), oldest first.
func (t *jobTable) list(session string, all bool) []*job {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*job
	for _, j := range t.order {
		if j.session == session || all {
			out = append(out, j)
		}
	}
	return out
}

// StartJob implements the StartJob RPC: argv runs as a job of the session, with the
// agent's default exec user unless the request names one.
func (s *server) StartJob(ctx context.Context, req *agentpb.StartJobRequest) (*agentpb.Job, error) {
	if req.Session == "" {
		return nil, backend.Errorf(backend.ErrInvalid, "job start: no session")
	}
	if s.closing.Load() {
		return nil, backend.Errorf(backend.ErrUnavailable, "the agent is shutting down")
	}
	st := &agentpb.ExecStart{Argv: req.Argv, Env: req.Env, Dir: req.Dir, User: req.User}
	if st.User == "" {
		st.User = s.execUser
	}
	plan, err := s.prepare(st)
	if err != nil {
		return nil, err
	}
	if plan.fail != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "job %q could not be started: %s: %s", req.Argv, plan.name, plan.fail.reason)
	}
	j, fail, err := s.startJob(plan, req.Session)
	if err != nil {
		return nil, err
	}
	if fail != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "job %q could not be started: %s: %s", req.Argv, plan.name, fail.reason)
	}
	return j.info(), nil
}

// ListJobs implements the ListJobs RPC.
func (s *server) ListJobs(ctx context.Context, req *agentpb.ListJobsRequest) (*agentpb.ListJobsResponse, error) {
	if req.Session == "" && !req.AllSessions {
		return nil, backend.Errorf(backend.ErrInvalid, "job list: no session")
	}
	resp := &agentpb.ListJobsResponse{}
	for _, j := range s.jobs.list(req.Session, req.AllSessions) {
		resp.Jobs = append(resp.Jobs, j.info())
	}
	return resp, nil
}

// JobLogs implements the JobLogs RPC: the kept output from the offset on (a gap
// first when the offset is older than the log), then with follow new output as it
// comes until the job has ended and its output is drained; end comes last.
func (s *server) JobLogs(req *agentpb.JobLogsRequest, stream agentpb.Agent_JobLogsServer) error {
	j, err := s.jobs.get(req.Session, req.Id)
	if err != nil {
		return err
	}
	if req.Offset < 0 {
		return backend.Errorf(backend.ErrInvalid, "job logs: offset %d is negative", req.Offset)
	}
	ctx := stream.Context()
	off := req.Offset
	for {
		b, dropped, next, over, changed := j.since(off)
		if dropped > 0 {
			if err := stream.Send(&agentpb.JobLogsOutput{Msg: &agentpb.JobLogsOutput_Gap{Gap: &agentpb.JobLogsGap{Dropped: dropped}}}); err != nil {
				return err
			}
		}
		for len(b) > 0 {
			n := min(len(b), ChunkSize)
			if err := stream.Send(&agentpb.JobLogsOutput{Msg: &agentpb.JobLogsOutput_Data{Data: b[:n]}}); err != nil {
				return err
			}
			b = b[n:]
		}
		off = next
		if over || !req.Follow {
			end := &agentpb.JobLogsEnd{Offset: off}
			if over {
				info := j.info()
				end.Ended, end.ExitCode, end.Signal = true, info.ExitCode, info.Signal
			}
			return stream.Send(&agentpb.JobLogsOutput{Msg: &agentpb.JobLogsOutput_End{End: end}})
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// KillJob implements the KillJob RPC.
func (s *server) KillJob(ctx context.Context, req *agentpb.KillJobRequest) (*agentpb.KillJobResponse, error) {
	j, err := s.jobs.get(req.Session, req.Id)
	if err != nil {
		return nil, err
	}
	s.killTree(s.treeOf(j.pid, j.marker), s.grace)
	// The tree is gone; the job's end is recorded by its own goroutines (the exit from
	// the reaper, the output once drained), which a loaded machine may run a while
	// later: answer once they have, so that a listing right after says it ended.
	for {
		j.mu.Lock()
		over, changed := !j.running && j.drained, j.changed
		j.mu.Unlock()
		if over {
			return &agentpb.KillJobResponse{}, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// startJob starts plan as a job of session: its own session, stdin /dev/null, stdout
// and stderr into one pipe that a goroutine reads into the job's log.
func (s *server) startJob(plan *execPlan, session string) (*job, *execFailure, error) {
	devnull, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, backend.Errorf(backend.ErrUnavailable, "opening /dev/null: %w", err)
	}
	defer unix.Close(devnull)
	r, w, err := pipe(true, "job output")
	if err != nil {
		return nil, nil, backend.Errorf(backend.ErrUnavailable, "job output pipe: %w", err)
	}
	marker := s.treeMarker(jobMarkerVar, s.nextID.Add(1))
	attr := &syscall.ProcAttr{
		Dir:   plan.dir,
		Env:   withMarker(plan.env, marker),
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
		return nil, nil, forkFailed("job "+plan.name, ferr)
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
