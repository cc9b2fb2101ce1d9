package registry

import (
	"context"
	"errors"
	"io"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
)

// JobStartRequest is a background job to start (Registry.JobStart).
type JobStartRequest struct {
	// Argv is the program and its arguments (no implicit shell).
	Argv []string
	// Env is KEY=VALUE pairs for the job, over the sandbox's environment.
	Env []string
	// Dir is the working directory; empty means the sandbox's default.
	Dir string
}

// agentCall reaches session's sandbox with mode and runs f on its agent, ending the
// call afterwards. A driver without berth's agent is ErrUnsupported (lacks says what
// is missing). With openRunning, a sandbox that is not running is errNotRunning. When
// f returns errRetry (the start of its call failed on a kept connection that had
// gone: nothing ran), the call is made once more on a new connection.
func (r *Registry) agentCall(ctx context.Context, session string, mode openMode, lacks string, f func(*sessionConn) error) error {
	for attempt := 0; ; attempt++ {
		c, err := r.open(ctx, session, mode)
		if err != nil {
			return err
		}
		if c.client == nil {
			c.fail()
			return backend.Errorf(backend.ErrUnsupported, "session %q: driver %s %s", session, c.lease.Driver, lacks)
		}
		if err := c.commit(); err != nil {
			c.fail()
			return err
		}
		err = f(c)
		c.done()
		if errors.Is(err, errRetry) && attempt == 0 {
			continue
		}
		return err
	}
}

// errRetry is what a call's f returns when sessionConn.lost says to make the call
// once more.
var errRetry = errors.New("the kept connection to the agent had gone; making the call again")

const noJobs = "has no background jobs (its sandboxes run no berth agent); run the command with & in a plain exec instead"

// jobsCall is agentCall for the job operations on existing jobs: the session must
// have a running sandbox (jobs end with it, and asking about them must not start it
// again). notRunning is what a sandbox that is not running gives.
func (r *Registry) jobsCall(ctx context.Context, session string, notRunning error, f func(*sessionConn) error) error {
	err := r.agentCall(ctx, session, openRunning, noJobs, f)
	switch {
	case errors.Is(err, errNoSession):
		return backend.Errorf(backend.ErrNotFound, "session %q has no sandbox, so no jobs; start one with berth job start -s %s -- CMD", session, session)
	case errors.Is(err, errNotRunning):
		return notRunning
	}
	return err
}

// jobGone is what logs and kill of job id say when the session's sandbox is not
// running.
func jobGone(session, id string) error {
	return backend.Errorf(backend.ErrNotFound, "session %q: job %s: the session's sandbox is not running, and its jobs ended with it", session, id)
}

// JobStart starts req as a background job of session, creating the session's sandbox
// when needed, and returns the job. The job outlives the call; its output (stdout and
// stderr together, the newest agent.JobLogMax bytes) stays in the sandbox's agent;
// it dies with the sandbox. Errors: those of Exec; ErrInvalid for an empty argv or a
// command that cannot be run (not found: the agent's reason is in the message);
// ErrUnsupported when the driver runs no berth agent.
func (r *Registry) JobStart(ctx context.Context, session string, req JobStartRequest) (agent.Job, error) {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return agent.Job{}, err
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return agent.Job{}, backend.Errorf(backend.ErrInvalid, "session %q: job start: empty argv", session)
	}
	var j agent.Job
	err = r.agentCall(ctx, session, openCreate, noJobs, func(c *sessionConn) (err error) {
		j, err = c.client.StartJob(ctx, agent.StartJobRequest{Session: session, Argv: req.Argv, Env: withDefaultEnv(c.lease.Rule, req.Env), Dir: req.Dir})
		return c.callErr("job start", err)
	})
	return j, err
}

// Jobs lists session's jobs, oldest first (ended ones included, with their result);
// none when the session's sandbox is not running (its jobs ended with it). Errors:
// ErrNotFound when the session has no sandbox; those of the connection.
func (r *Registry) Jobs(ctx context.Context, session string) ([]agent.Job, error) {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return nil, err
	}
	jobs := []agent.Job{}
	err = r.jobsCall(ctx, session, nil, func(c *sessionConn) (err error) {
		jobs, err = c.client.Jobs(ctx, session)
		return c.callErr("job list", err)
	})
	if err != nil {
		return nil, err
	}
	return jobs, nil
}

// JobLogsRequest asks for a job's output (Registry.JobLogs).
type JobLogsRequest struct {
	// ID is the job; Offset the byte offset into its output to start from (0: the
	// oldest kept byte); Follow keeps writing new output until the job has ended.
	ID     string
	Offset int64
	Follow bool
	// OnGap, when set, is told how many bytes before the kept log were dropped;
	// without it a line "[... N bytes dropped ...]" is written instead.
	OnGap func(dropped int64)
}

// JobLogs writes job req.ID's log to w: what the agent keeps from req.Offset (after a
// line "[... N bytes dropped ...]" when older output was dropped) and, with Follow,
// new output until the job has ended; the end says the offset reached and, for an
// ended job, its result (exit code, signal). Errors: ErrNotFound for a session
// without a running sandbox or an unknown job; those of the connection.
func (r *Registry) JobLogs(ctx context.Context, session string, req JobLogsRequest, w io.Writer) (agent.JobLogsEnd, error) {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return agent.JobLogsEnd{}, err
	}
	var end agent.JobLogsEnd
	err = r.jobsCall(ctx, session, jobGone(session, req.ID), func(c *sessionConn) (err error) {
		end, err = c.client.JobLogs(ctx, agent.JobLogsRequest{Session: session, ID: req.ID, Offset: req.Offset, Follow: req.Follow, OnGap: req.OnGap}, w)
		return c.callErr("job logs", err)
	})
	return end, err
}

// JobKill ends job id's process tree (TERM, then KILL) and returns once it is gone.
// Errors: ErrNotFound for a session without a running sandbox or an unknown job;
// those of the connection.
func (r *Registry) JobKill(ctx context.Context, session, id string) error {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return err
	}
	return r.jobsCall(ctx, session, jobGone(session, id), func(c *sessionConn) error {
		return c.callErr("job kill", c.client.KillJob(ctx, session, id))
	})
}

// jobsRunning reports whether any job runs in sandbox (of any session), asking its
// agent; a driver without agent, a sandbox that is not running, or an agent that
// does not answer count as none.
func (r *Registry) jobsRunning(ctx context.Context, b backend.TerminalBackend, driver, sandbox string) bool {
	c, err := r.dialSandbox(ctx, b, driver, sandbox)
	if err != nil {
		return false
	}
	defer c.Close()
	jobs, err := c.AllJobs(ctx)
	if err != nil {
		return false
	}
	for _, j := range jobs {
		if j.Running {
			return true
		}
	}
	return false
}

// notIdleIfJobs turns a verdict that sandbox is idle into "in use" when a background
// job runs in it.
func (r *Registry) notIdleIfJobs(ctx context.Context, b backend.TerminalBackend, driver, sandbox string, v verdict) verdict {
	if v.cause != CauseIdle || v.action == PruneKeep || !r.jobsRunning(ctx, b, driver, sandbox) {
		return v
	}
	return verdict{PruneKeep, CauseInUse, "a background job is running in it, so it is not idle"}
}
