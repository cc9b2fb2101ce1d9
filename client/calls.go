package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berth-sh/berth/server/apiv1"
)

// The API's calls, one method each (docs/api.md has the routes). Every method's
// errors: an *APIError for the daemon's error answer (its Info.Kind says which,
// e.g. "not_found" for an unknown session, "invalid" for a bad name), a *GoneError when the daemon
// takes no connection or breaks it, ctx's error when ctx ended first.

// Status is GET /v1/status: what the daemon says of itself (pid, version, state
// dir, config file and its SHA-256, clock offset, retention interval).
func (c *Client) Status(ctx context.Context) (apiv1.Status, error) {
	var st apiv1.Status
	err := c.Get(ctx, "/v1/status", &st)
	return st, err
}

// Sessions is GET /v1/sessions: every session the daemon knows, one row each, as
// berth sessions --json prints them.
func (c *Client) Sessions(ctx context.Context) ([]apiv1.Session, error) {
	var rows []apiv1.Session
	err := c.Get(ctx, "/v1/sessions", &rows)
	return rows, err
}

// Pools is GET /v1/pools: the daemon's warm pools.
func (c *Client) Pools(ctx context.Context) ([]apiv1.Pool, error) {
	var rows []apiv1.Pool
	err := c.Get(ctx, "/v1/pools", &rows)
	return rows, err
}

// CloseSession is POST /v1/sessions/{name}/close: the session's rule's on_close
// applies to its sandbox (keep, stop or remove).
func (c *Client) CloseSession(ctx context.Context, session string) error {
	return c.Call(ctx, http.MethodPost, SessionPath(session, "close"), nil, nil)
}

// StopSession is POST /v1/sessions/{name}/stop: the sandbox stops (its files stay
// where the driver keeps them); the next exec starts it again.
func (c *Client) StopSession(ctx context.Context, session string) error {
	return c.Call(ctx, http.MethodPost, SessionPath(session, "stop"), nil, nil)
}

// RemoveSession is DELETE /v1/sessions/{name}: the sandbox and the session's record
// are removed.
func (c *Client) RemoveSession(ctx context.Context, session string) error {
	return c.Call(ctx, http.MethodDelete, SessionPath(session, ""), nil, nil)
}

// StartJob is POST /v1/sessions/{name}/jobs: req.Argv runs in the background in the
// session's sandbox, outliving the call; its output is kept for JobLogs.
func (c *Client) StartJob(ctx context.Context, session string, req apiv1.JobStartRequest) (apiv1.Job, error) {
	var j apiv1.Job
	err := c.Call(ctx, http.MethodPost, SessionPath(session, "jobs"), req, &j)
	return j, err
}

// Jobs is GET /v1/sessions/{name}/jobs: the session's jobs, running and ended.
func (c *Client) Jobs(ctx context.Context, session string) ([]apiv1.Job, error) {
	var jobs []apiv1.Job
	err := c.Get(ctx, SessionPath(session, "jobs"), &jobs)
	return jobs, err
}

// KillJob is POST /v1/sessions/{name}/jobs/{id}/kill: the job's process group is
// killed.
func (c *Client) KillJob(ctx context.Context, session, id string) error {
	return c.Call(ctx, http.MethodPost, SessionPath(session, "jobs/"+url.PathEscape(id)+"/kill"), nil, nil)
}

// JobLogs is GET /v1/sessions/{name}/jobs/{id}/logs from byte offset (0 for the
// start of what is kept), following the output until the job ends when follow is
// set: each event ("gap", "output") goes to onEvent as it comes, and JobLogs returns
// the "end" event, whose Offset is where the next call goes on. An "error" event is
// an *APIError; an answer that ends without its end event is a *GoneError. An error
// of onEvent ends the call and is returned.
func (c *Client) JobLogs(ctx context.Context, session, id string, offset int64, follow bool, onEvent func(apiv1.LogEvent) error) (apiv1.LogEvent, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if follow {
		q.Set("follow", "true")
	}
	resp, err := c.Request(ctx, http.MethodGet, SessionPath(session, "jobs/"+url.PathEscape(id)+"/logs")+"?"+q.Encode(), nil, "", apiv1.NDJSON)
	if err != nil {
		return apiv1.LogEvent{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev apiv1.LogEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return apiv1.LogEvent{}, c.Gone(fmt.Errorf("a log event: %w", err))
		}
		switch ev.Event {
		case "end":
			return ev, nil
		case "error":
			if ev.Error != nil {
				return apiv1.LogEvent{}, &APIError{StatusCode: http.StatusOK, Info: *ev.Error}
			}
		default:
			if err := onEvent(ev); err != nil {
				return apiv1.LogEvent{}, err
			}
		}
	}
	if ctx.Err() != nil {
		return apiv1.LogEvent{}, ctx.Err()
	}
	return apiv1.LogEvent{}, c.Gone(fmt.Errorf("the log ended without its end event: %v", sc.Err()))
}

// Drivers is GET /v1/drivers: the daemon's drivers (health, capabilities, the
// executables of the plugins it runs), as berth drivers --json prints them.
func (c *Client) Drivers(ctx context.Context) ([]apiv1.Driver, error) {
	var rows []apiv1.Driver
	err := c.Get(ctx, "/v1/drivers", &rows)
	return rows, err
}

// Explain is GET /v1/config/explain: how the daemon's config places session (its
// rule, driver, sandbox spec and retention), as berth config explain --json prints it.
func (c *Client) Explain(ctx context.Context, session string) (apiv1.Explanation, error) {
	var ex apiv1.Explanation
	err := c.Get(ctx, "/v1/config/explain?"+url.Values{"session": {session}}.Encode(), &ex)
	return ex, err
}

// CheckConfig is POST /v1/config/check: the daemon checks its own config file as
// berth config check does; a file that fails is an answer (OK false), not an error.
func (c *Client) CheckConfig(ctx context.Context) (apiv1.ConfigCheck, error) {
	var chk apiv1.ConfigCheck
	err := c.Call(ctx, http.MethodPost, "/v1/config/check", nil, &chk)
	return chk, err
}

// CopyIn is PUT /v1/sessions/{name}/archive: the tar stream r is extracted into the
// directory dir of the session's sandbox (which must exist); maxBytes bounds the
// stream (0: the daemon's default, 1 GiB; -1: no bound). The daemon checks the
// whole stream before the sandbox gets any of it (spooled to its disk, not held in
// memory): a bad entry (a link out of dir, a path with ..) or one past the bound
// fails the call with an *APIError that names it, and the sandbox is unchanged.
func (c *Client) CopyIn(ctx context.Context, session, dir string, r io.Reader, maxBytes int64) error {
	q := url.Values{"path": {dir}}
	switch {
	case maxBytes < 0:
		q.Set("max_size", "unlimited")
	case maxBytes > 0:
		q.Set("max_size", strconv.FormatInt(maxBytes, 10))
	}
	resp, err := c.Request(ctx, http.MethodPut, SessionPath(session, "archive")+"?"+q.Encode(), r, apiv1.TarType, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return nil
}

// CopyOut is GET /v1/sessions/{name}/archive: path (a file or a directory) in the
// session's sandbox is written to w as a tar stream, as it comes. The stream comes
// from inside the sandbox: extract it with care (agent.ExtractTar is berth cp's).
// A stream that breaks off is a *GoneError.
func (c *Client) CopyOut(ctx context.Context, session, path string, w io.Writer) error {
	resp, err := c.Request(ctx, http.MethodGet, SessionPath(session, "archive")+"?"+url.Values{"path": {path}}.Encode(), nil, "", "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return c.Gone(fmt.Errorf("session %s: copying %s out: the stream broke off: %w", session, path, err))
	}
	return nil
}

// Run runs argv in session and waits for it, with no stdin: a plain exec (Exec)
// whose output is collected. It returns the command's result (its ExitCode, which
// is not an error) and its stdout and stderr. For a long command or large output,
// use Exec and give it writers.
func (c *Client) Run(ctx context.Context, session string, argv ...string) (apiv1.ExecResult, []byte, []byte, error) {
	// The answer's reader writes the buffers before it ends the answer, and Result
	// waits for that end: no lock is needed.
	var stdout, stderr bytes.Buffer
	p, err := c.Stream(ctx, session, apiv1.ExecRequest{Argv: argv}, &stdout, &stderr, true)
	if err != nil {
		return apiv1.ExecResult{}, nil, nil, err
	}
	res, err := p.Result()
	return res, stdout.Bytes(), stderr.Bytes(), err
}
