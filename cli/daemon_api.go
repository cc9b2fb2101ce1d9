package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/client"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// The api of a daemon: each method is one call of the HTTP API (docs/api.md).

// Sessions, Pools, CloseSession, StopSession, RemoveSession and Jobs are the
// client's.

func (d *daemonClient) Prune(ctx context.Context, opts registry.PruneOptions) (*registry.PruneReport, error) {
	var rep registry.PruneReport
	if err := d.Call(ctx, http.MethodPost, "/v1/prune", apiv1.PruneRequest{DryRun: opts.DryRun, Owner: opts.Owner}, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

func (d *daemonClient) JobStart(ctx context.Context, session string, req registry.JobStartRequest) (apiv1.Job, error) {
	return d.StartJob(ctx, session, apiv1.JobStartRequest{Argv: req.Argv, Env: client.EnvMap(req.Env), Cwd: req.Dir})
}

func (d *daemonClient) JobKill(ctx context.Context, session, id string) error {
	return d.KillJob(ctx, session, id)
}

// JobLogs reads GET .../jobs/{id}/logs: output events go to w, a gap is reported as
// the agent client reports it (req.OnGap, else a line in w).
func (d *daemonClient) JobLogs(ctx context.Context, session string, req registry.JobLogsRequest, w io.Writer) (agent.JobLogsEnd, error) {
	end, err := d.Client.JobLogs(ctx, session, req.ID, req.Offset, req.Follow, func(ev apiv1.LogEvent) error {
		switch ev.Event {
		case "gap":
			if req.OnGap != nil {
				req.OnGap(ev.Dropped)
			} else if _, err := fmt.Fprintf(w, "[... %d bytes dropped ...]\n", ev.Dropped); err != nil {
				return fmt.Errorf("job logs: %w", err)
			}
		case "output":
			if _, err := w.Write(ev.Data); err != nil {
				return fmt.Errorf("job logs: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return agent.JobLogsEnd{}, err
	}
	return agent.JobLogsEnd{Offset: end.Offset, Ended: end.Ended, ExitCode: end.ExitCode, Signal: end.Signal}, nil
}

// DriverRows is GET /v1/drivers: the daemon's drivers (its running plugins).
func (d *daemonClient) DriverRows(ctx context.Context) ([]apiv1.Driver, error) {
	return d.Drivers(ctx)
}

// Explanation is GET /v1/config/explain: how the daemon's config places session.
func (d *daemonClient) Explanation(ctx context.Context, session string) (apiv1.Explanation, error) {
	return d.Explain(ctx, session)
}

// Exec runs a plain exec through the daemon as a streamed request and answer
// (docs/api.md), or one with a terminal (req.TTY) over the TTY WebSocket
// (execTTY): the returned Process sends stdin, signals and, when ctx is
// cancelled, a cancel event; its output events go to req.Stdout and req.Stderr.
func (d *daemonClient) Exec(ctx context.Context, session string, req backend.ExecRequest) (backend.Process, *apiv1.ExecStarted, error) {
	if req.TTY {
		return d.execTTY(ctx, session, req)
	}
	p, err := d.Client.Exec(ctx, session, req)
	if err != nil {
		return nil, nil, err
	}
	return p, p.Started(), nil
}

// Shell makes a shell-mode call through the daemon: req.Stdin is sent as stdin
// events, req.Started is called at the "started" event, and a cancelled ctx sends a
// cancel event (the answer then says canceled).
func (d *daemonClient) Shell(ctx context.Context, session string, req registry.ShellRequest) (registry.ShellResult, error) {
	first := apiv1.ExecRequest{Command: req.Command, Env: client.EnvMap(req.Env), Cwd: req.Dir, Timeout: client.DurationText(req.Timeout)}
	if req.MaxOutput > 0 {
		first.MaxOutput = &req.MaxOutput
	}
	// The result carries the capped text; the output events are not needed.
	stdout, stderr := orDiscard(req.Stdout), orDiscard(req.Stderr)
	p, err := d.Stream(ctx, session, first, stdout, stderr, req.Stdin == nil)
	if err != nil {
		return registry.ShellResult{}, err
	}
	if req.Started != nil {
		req.Started()
	}
	if req.Stdin != nil {
		go func() {
			io.Copy(execrun.ProcessWriter{P: p}, req.Stdin)
			p.CloseStdin()
		}()
	}
	r, err := p.Result()
	if err != nil {
		return registry.ShellResult{}, err
	}
	return registry.ShellResult{
		ExecResult: backend.ExecResult{ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, Canceled: r.Canceled, OOMKilled: r.OOMKilled,
			Duration: time.Duration(r.DurationMS) * time.Millisecond, Cwd: r.Cwd},
		Session: r.Session, Driver: r.Driver, Sandbox: r.Sandbox,
		Recreated: r.Recreated, RecreatedReason: r.RecreatedReason, Moved: r.Moved, MovedReason: r.MovedReason, Pooled: r.Pooled,
		Stdout: r.Stdout, Stderr: r.Stderr, StdoutTruncatedBytes: r.StdoutTruncatedBytes, StderrTruncatedBytes: r.StderrTruncatedBytes,
		StdoutFile: r.StdoutFile, StderrFile: r.StderrFile,
		StdoutFileTruncatedBytes: r.StdoutFileTruncatedBytes, StderrFileTruncatedBytes: r.StderrFileTruncatedBytes,
		OutputFilesRemoved: r.OutputFilesRemoved,
	}, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
