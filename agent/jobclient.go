package agent

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
)

// JobLogMax is how many bytes of a job's output its log keeps (the newest), 1 MiB.
const JobLogMax = 1 << 20

// Job describes one background job: a process that the agent started in its own
// session and keeps beyond the call that started it, with its stdout and stderr
// together in one bounded log (the newest JobLogMax bytes). It dies with the sandbox.
type Job struct {
	// ID is the job's id, unique within its agent; Session the session it belongs to.
	ID      string `json:"id"`
	Session string `json:"session"`
	// Argv is what it runs; PID its leader's pid in the sandbox.
	Argv []string `json:"argv"`
	PID  int      `json:"pid"`
	// Running is set until the leader has exited; then ExitCode and Signal are its
	// result (as in backend.ExecResult: 128+N for signal N).
	Running  bool `json:"running"`
	ExitCode int  `json:"exit_code"`
	Signal   int  `json:"signal"`
	// Started and Ended are when it started and ended (Ended is zero while running).
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	// LogBytes is how many bytes it has written in all; DroppedBytes how many of those
	// the log no longer keeps.
	LogBytes     int64 `json:"log_bytes"`
	DroppedBytes int64 `json:"dropped_bytes"`
}

func jobFromPB(j *agentpb.Job) Job {
	out := Job{
		ID: j.Id, Session: j.Session, Argv: j.Argv, PID: int(j.Pid), Running: j.Running,
		ExitCode: int(j.ExitCode), Signal: int(j.Signal), Started: time.Unix(0, j.StartedNs).UTC(),
		LogBytes: j.LogBytes, DroppedBytes: j.DroppedBytes,
	}
	if j.EndedNs != 0 {
		out.Ended = time.Unix(0, j.EndedNs).UTC()
	}
	return out
}

// StartJobRequest is a job to start (Client.StartJob).
type StartJobRequest struct {
	// Session is the session the job belongs to; required.
	Session string
	// Argv is the program and its arguments (no implicit shell); Env KEY=VALUE pairs
	// over the sandbox's environment; Dir the working directory (empty: the agent's);
	// User the user (empty: the agent's default exec user).
	Argv []string
	Env  []string
	Dir  string
	User string
}

// StartJob starts req as a background job and returns it. Errors: an empty argv or
// session, a command that cannot be run (ErrInvalid, naming it and the reason: not
// found, not executable), a working directory that does not exist (ErrInvalid);
// those of the connection.
func (c *Client) StartJob(ctx context.Context, req StartJobRequest) (Job, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return Job{}, backend.Errorf(backend.ErrInvalid, "job start: empty argv")
	}
	if err := backend.CheckExecText(backend.ExecRequest{Argv: req.Argv, Env: req.Env, Dir: req.Dir, User: req.User}); err != nil {
		return Job{}, err
	}
	j, err := c.rpc.StartJob(ctx, &agentpb.StartJobRequest{Session: req.Session, Argv: req.Argv, Env: req.Env, Dir: req.Dir, User: req.User})
	if err != nil {
		return Job{}, wireErr("job start", err)
	}
	return jobFromPB(j), nil
}

// Jobs lists session's jobs, oldest first, ended ones included (the agent keeps the
// newest 32 ended jobs).
func (c *Client) Jobs(ctx context.Context, session string) ([]Job, error) {
	return c.listJobs(ctx, &agentpb.ListJobsRequest{Session: session})
}

// AllJobs lists the jobs of every session of the sandbox, oldest first.
func (c *Client) AllJobs(ctx context.Context) ([]Job, error) {
	return c.listJobs(ctx, &agentpb.ListJobsRequest{AllSessions: true})
}

func (c *Client) listJobs(ctx context.Context, req *agentpb.ListJobsRequest) ([]Job, error) {
	resp, err := c.rpc.ListJobs(ctx, req)
	if err != nil {
		return nil, wireErr("job list", err)
	}
	out := make([]Job, 0, len(resp.Jobs))
	for _, j := range resp.Jobs {
		out = append(out, jobFromPB(j))
	}
	return out, nil
}

// JobLogsRequest asks for a job's output (Client.JobLogs).
type JobLogsRequest struct {
	// Session and ID name the job.
	Session, ID string
	// Offset is the absolute byte offset into the job's output to start from (0: the
	// oldest kept byte). Output before the oldest kept byte is a gap.
	Offset int64
	// Follow keeps the call going, writing new output as it comes, until the job has
	// ended and its output is drained.
	Follow bool
	// OnGap, when set, is told how many bytes before the kept log were dropped;
	// without it a line "[... N bytes dropped ...]" is written to the writer instead.
	OnGap func(dropped int64)
}

// JobLogsEnd is how a JobLogs call ended.
type JobLogsEnd struct {
	// Offset is the offset after the last byte written: pass it as the next
	// request's Offset to continue.
	Offset int64
	// Ended is set when the job has ended and its output is drained; ExitCode and
	// Signal are then its result.
	Ended    bool
	ExitCode int
	Signal   int
}

// JobLogs writes the output of job req.ID of req.Session to w from req.Offset (and
// with Follow what comes until it has ended). Errors: an unknown job or a job of
// another session (ErrNotFound), a negative offset (ErrInvalid), writing w fails,
// ctx ends (a Follow that is interrupted), those of the connection.
func (c *Client) JobLogs(ctx context.Context, req JobLogsRequest, w io.Writer) (JobLogsEnd, error) {
	if req.ID == "" {
		return JobLogsEnd{}, backend.Errorf(backend.ErrInvalid, "job logs: no job id")
	}
	stream, err := c.rpc.JobLogs(ctx, &agentpb.JobLogsRequest{Session: req.Session, Id: req.ID, Offset: req.Offset, Follow: req.Follow})
	if err != nil {
		return JobLogsEnd{}, wireErr("job logs", err)
	}
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return JobLogsEnd{}, backend.Errorf(backend.ErrUnavailable, "job logs: the agent ended the call without its end")
		}
		if err != nil {
			return JobLogsEnd{}, wireErr("job logs", err)
		}
		switch x := m.Msg.(type) {
		case *agentpb.JobLogsOutput_Gap:
			if req.OnGap != nil {
				req.OnGap(x.Gap.Dropped)
			} else if _, err := fmt.Fprintf(w, "[... %d bytes dropped ...]\n", x.Gap.Dropped); err != nil {
				return JobLogsEnd{}, fmt.Errorf("job logs: %w", err)
			}
		case *agentpb.JobLogsOutput_Data:
			if _, err := w.Write(x.Data); err != nil {
				return JobLogsEnd{}, fmt.Errorf("job logs: %w", err)
			}
		case *agentpb.JobLogsOutput_End:
			e := x.End
			return JobLogsEnd{Offset: e.Offset, Ended: e.Ended, ExitCode: int(e.ExitCode), Signal: int(e.Signal)}, nil
		}
	}
}

// KillJob ends job id's process tree (TERM, then KILL after the agent's grace) and
// returns once it is gone. Errors: an unknown job (ErrNotFound); those of the
// connection.
func (c *Client) KillJob(ctx context.Context, session, id string) error {
	_, err := c.rpc.KillJob(ctx, &agentpb.KillJobRequest{Session: session, Id: id})
	return wireErr("job kill", err)
}
