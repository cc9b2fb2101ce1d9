package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/berth-sh/berth/backend"
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

// jobExec runs one job operation in session's sandbox and returns its stdout and
// result. Operations other than start need the session to have a sandbox already.
func (r *Registry) jobExec(ctx context.Context, session string, req backend.ExecRequest, w io.Writer) (string, backend.ExecResult, error) {
	if _, _, err := r.cfg.Match(session); err != nil {
		return "", backend.ExecResult{}, err // before the store: the more telling error
	}
	if req.Job.Op != backend.JobStart {
		if err := r.haveSandbox(session, fmt.Sprintf(", so no jobs; start one with berth job start -s %s -- CMD", session)); err != nil {
			return "", backend.ExecResult{}, err
		}
		// Jobs end with their sandbox: asking about them must not start it again.
		if running, err := r.sandboxRunning(ctx, session); err != nil {
			return "", backend.ExecResult{}, err
		} else if !running {
			if req.Job.Op == backend.JobList {
				return "", backend.ExecResult{}, nil
			}
			return "", backend.ExecResult{}, backend.Errorf(backend.ErrNotFound, "session %q: job %s: the session's sandbox is not running, and its jobs ended with it", session, req.Job.ID)
		}
	}
	if _, err := r.sessionDriver(ctx, session, func(c backend.Capabilities) bool { return c.Jobs },
		"has no background jobs (it does not run berth's agent); run the command with & in a plain exec instead"); err != nil {
		return "", backend.ExecResult{}, err
	}
	var out bytes.Buffer
	req.Stdout = &out
	if w != nil {
		req.Stdout = w
	}
	var stderr bytes.Buffer
	req.Stderr = &stderr
	p, _, err := r.Exec(ctx, session, req)
	if err != nil {
		return "", backend.ExecResult{}, err
	}
	res, err := p.Wait()
	if err != nil {
		return "", res, fmt.Errorf("session %q: job %s: %w", session, req.Job.Op, err)
	}
	if req.Job.Op == backend.JobStart && res.ExitCode != 0 {
		return "", res, backend.Errorf(backend.ErrInvalid, "session %q: job %q could not be started (exit %d): %s", session, req.Argv, res.ExitCode, strings.TrimSpace(stderr.String()))
	}
	return out.String(), res, nil
}

// sandboxRunning reports whether session's recorded sandbox is running on its driver
// (false when it is stopped or gone).
func (r *Registry) sandboxRunning(ctx context.Context, session string) (bool, error) {
	rec, ok, err := r.store.get(session)
	if err != nil || !ok {
		return false, err
	}
	b, err := r.driver(ctx, rec.Driver)
	if err != nil {
		return false, fmt.Errorf("session %q: %w", session, err)
	}
	sb, err := b.Inspect(ctx, rec.Sandbox)
	if errors.Is(err, backend.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("session %q: sandbox %s: %w", session, rec.Sandbox, err)
	}
	return sb.State == backend.StateRunning, nil
}

// jobsRunning reports whether any job runs in sandbox (of any session), asking its
// agent; a driver without jobs, a sandbox that is not running, or an agent that does
// not answer count as none.
func (r *Registry) jobsRunning(ctx context.Context, b backend.TerminalBackend, sandbox string) bool {
	if caps, err := r.capabilities(ctx, b); err != nil || !caps.Jobs {
		return false
	}
	var out bytes.Buffer
	p, err := b.Exec(ctx, sandbox, backend.ExecRequest{Session: backend.AllSessions, Job: &backend.JobRequest{Op: backend.JobList}, Stdout: &out, Stderr: io.Discard})
	if err != nil {
		return false
	}
	if _, err := p.Wait(); err != nil {
		return false
	}
	return strings.Contains(out.String(), `"running":true`)
}

// notIdleIfJobs turns a verdict that sandbox is idle into "in use" when a background
// job runs in it.
func (r *Registry) notIdleIfJobs(ctx context.Context, b backend.TerminalBackend, sandbox string, v verdict) verdict {
	if v.cause != CauseIdle || v.action == PruneKeep || !r.jobsRunning(ctx, b, sandbox) {
		return v
	}
	return verdict{PruneKeep, CauseInUse, "a background job is running in it, so it is not idle"}
}

// JobStart starts req as a background job of session, creating the session's sandbox
// when needed, and returns the job. The job outlives the call; its output (stdout and
// stderr together, the newest backend.JobLogMax bytes) stays in the sandbox's agent;
// it dies with the sandbox. Errors: those of Exec; ErrInvalid for an empty argv or a
// command that cannot be run (not found: the agent's reason is in the message);
// ErrUnsupported when the driver has no jobs (Capabilities.Jobs).
func (r *Registry) JobStart(ctx context.Context, session string, req JobStartRequest) (backend.JobInfo, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return backend.JobInfo{}, backend.Errorf(backend.ErrInvalid, "session %q: job start: empty argv", session)
	}
	out, _, err := r.jobExec(ctx, session, backend.ExecRequest{Argv: req.Argv, Env: req.Env, Dir: req.Dir, Job: &backend.JobRequest{Op: backend.JobStart}}, nil)
	if err != nil {
		return backend.JobInfo{}, err
	}
	id := strings.TrimSpace(out)
	jobs, err := r.Jobs(ctx, session)
	if err != nil {
		return backend.JobInfo{ID: id, Argv: req.Argv, Running: true}, nil
	}
	for _, j := range jobs {
		if j.ID == id {
			return j, nil
		}
	}
	return backend.JobInfo{ID: id, Argv: req.Argv, Running: true}, nil
}

// Jobs lists session's jobs, oldest first (ended ones included, with their result).
// Errors: ErrNotFound when the session has no sandbox; those of Exec.
func (r *Registry) Jobs(ctx context.Context, session string) ([]backend.JobInfo, error) {
	out, _, err := r.jobExec(ctx, session, backend.ExecRequest{Job: &backend.JobRequest{Op: backend.JobList}}, nil)
	if err != nil {
		return nil, err
	}
	jobs := []backend.JobInfo{}
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var j backend.JobInfo
		if err := dec.Decode(&j); err != nil {
			return nil, fmt.Errorf("session %q: job list: %w", session, err)
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// JobLogs writes job id's log to w: what the agent keeps (after a line
// "[... N bytes dropped ...]" when older output was dropped) and, with follow, new
// output until the job has ended; the result is then the job's (exit code, signal).
// Errors: ErrNotFound for a session without sandbox or an unknown job; those of Exec.
func (r *Registry) JobLogs(ctx context.Context, session, id string, follow bool, w io.Writer) (backend.ExecResult, error) {
	_, res, err := r.jobExec(ctx, session, backend.ExecRequest{Job: &backend.JobRequest{Op: backend.JobLogs, ID: id, Follow: follow}}, w)
	return res, err
}

// JobKill ends job id's process tree (TERM, then KILL) and returns once it is gone.
// Errors: ErrNotFound for a session without sandbox or an unknown job; those of Exec.
func (r *Registry) JobKill(ctx context.Context, session, id string) error {
	_, _, err := r.jobExec(ctx, session, backend.ExecRequest{Job: &backend.JobRequest{Op: backend.JobKill, ID: id}}, nil)
	return err
}
