package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
)

// jobCall runs one job operation for session and returns its stdout and result.
func jobCall(t *testing.T, c *Client, session string, job backend.JobRequest, argv ...string) (string, backend.ExecResult, error) {
	t.Helper()
	var out bytes.Buffer
	p, err := c.Exec(testCtx(t), backend.ExecRequest{Argv: argv, Session: session, Job: &job, Stdout: &out})
	if err != nil {
		return "", backend.ExecResult{}, err
	}
	res, err := p.Wait()
	return out.String(), res, err
}

func jobList(t *testing.T, c *Client, session string) []backend.JobInfo {
	t.Helper()
	out, _, err := jobCall(t, c, session, backend.JobRequest{Op: backend.JobList})
	if err != nil {
		t.Fatal(err)
	}
	var jobs []backend.JobInfo
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var j backend.JobInfo
		if err := json.Unmarshal([]byte(line), &j); err != nil {
			t.Fatalf("job list line %q: %v", line, err)
		}
		jobs = append(jobs, j)
	}
	return jobs
}

func TestJobs(t *testing.T) {
	a := startAgent(t)
	c := a.c
	out, res, err := jobCall(t, c, "s1", backend.JobRequest{Op: backend.JobStart}, "sh", "-c", "echo started; echo err >&2; read x < /dev/zero; exit 3")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("job start: %v %+v", err, res)
	}
	id := strings.TrimSpace(out)
	jobs := jobList(t, c, "s1")
	if len(jobs) != 1 || jobs[0].ID != id || !jobs[0].Running || jobs[0].PID == 0 || jobs[0].Argv[0] != "sh" {
		t.Fatalf("job list %+v, want job %s running", jobs, id)
	}
	if other := jobList(t, c, "s2"); len(other) != 0 {
		t.Errorf("another session lists %+v", other)
	}
	if _, _, err := jobCall(t, c, "s2", backend.JobRequest{Op: backend.JobLogs, ID: id}); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("logs of another session's job: %v, want ErrNotFound", err)
	}
	// The start call has ended; the job runs on and its output is kept.
	eventually(t, 10*time.Second, "the job's output", func() bool {
		out, _, _ := jobCall(t, c, "s1", backend.JobRequest{Op: backend.JobLogs, ID: id})
		return strings.Contains(out, "started\n") && strings.Contains(out, "err\n")
	})
	// Follow returns the job's result once it has been killed.
	follow := make(chan backend.ExecResult, 1)
	go func() {
		_, res, _ := jobCall(t, c, "s1", backend.JobRequest{Op: backend.JobLogs, ID: id, Follow: true})
		follow <- res
	}()
	if _, res, err := jobCall(t, c, "s1", backend.JobRequest{Op: backend.JobKill, ID: id}); err != nil || res.ExitCode != 0 {
		t.Fatalf("job kill: %v %+v", err, res)
	}
	select {
	case res := <-follow:
		if res.Signal != 15 && res.Signal != 9 {
			t.Errorf("followed logs of a killed job: %+v, want its signal", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("logs --follow did not end when the job was killed")
	}
	if jobs := jobList(t, c, "s1"); len(jobs) != 1 || jobs[0].Running || jobs[0].Ended.IsZero() {
		t.Errorf("after kill: %+v, want the job ended", jobs)
	}
	if len(procsWithArgs("sh", "-c", "echo started; echo err >&2; read x < /dev/zero; exit 3")) != 0 {
		t.Error("the killed job's process is still alive")
	}

	// A job that exits by itself reports its exit code through a followed log.
	out, _, _ = jobCall(t, c, "s1", backend.JobRequest{Op: backend.JobStart}, "sh", "-c", "seq 1 3; exit 4")
	id2 := strings.TrimSpace(out)
	logs, res, err := jobCall(t, c, "s1", backend.JobRequest{Op: backend.JobLogs, ID: id2, Follow: true})
	if err != nil || logs != "1\n2\n3\n" || res.ExitCode != 4 {
		t.Errorf("followed logs of a job that exits 4: %q %+v %v", logs, res, err)
	}
	if _, _, err := jobCall(t, c, "s1", backend.JobRequest{Op: backend.JobKill, ID: "999"}); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("kill of an unknown job: %v, want ErrNotFound", err)
	}
	if _, _, err := jobCall(t, c, "s1", backend.JobRequest{Op: backend.JobStart}, "/nonexistent/cmd"); err != nil {
		t.Errorf("start of a missing command: %v (want a 127 result, not an error)", err)
	}
}

func TestJobLogBounded(t *testing.T) {
	a := startAgent(t)
	out, _, err := jobCall(t, a.c, "s", backend.JobRequest{Op: backend.JobStart}, "sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	// Following streams everything as it comes; it ends with the job.
	followed, res, err := jobCall(t, a.c, "s", backend.JobRequest{Op: backend.JobLogs, ID: id, Follow: true})
	if err != nil || res.ExitCode != 0 || strings.Count(followed, "x") < backend.JobLogMax {
		t.Fatalf("logs --follow: %v %+v, %d bytes", err, res, len(followed))
	}
	logs, _, err := jobCall(t, a.c, "s", backend.JobRequest{Op: backend.JobLogs, ID: id})
	if err != nil {
		t.Fatal(err)
	}
	want := "[... 1951424 bytes dropped ...]\n" + strings.Repeat("x", backend.JobLogMax)
	if logs != want {
		t.Errorf("log of 3000000 bytes: %d bytes starting %q, want the marker and the last %d bytes", len(logs), logs[:min(len(logs), 40)], backend.JobLogMax)
	}
}

func TestJobsEndWithAgent(t *testing.T) {
	a := startAgent(t)
	argv := []string{"sleep", "3600"}
	if _, _, err := jobCall(t, a.c, "s", backend.JobRequest{Op: backend.JobStart}, argv...); err != nil {
		t.Fatal(err)
	}
	if len(procsWithArgs(argv...)) == 0 {
		t.Fatal("the job is not running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.c.Shutdown(ctx, 100*time.Millisecond)
	<-a.exited
	if pids := procsWithArgs(argv...); len(pids) != 0 {
		t.Errorf("job processes %v outlived the agent", pids)
	}
}

// Ended jobs are kept up to maxEndedJobs: the oldest go when new ones start.
func TestEndedJobsCapped(t *testing.T) {
	a := startAgent(t)
	for i := 0; i < maxEndedJobs+5; i++ {
		out, _, err := jobCall(t, a.c, "s", backend.JobRequest{Op: backend.JobStart}, "true")
		if err != nil {
			t.Fatal(err)
		}
		jobCall(t, a.c, "s", backend.JobRequest{Op: backend.JobLogs, ID: strings.TrimSpace(out), Follow: true})
	}
	jobs := jobList(t, a.c, "s")
	if len(jobs) > maxEndedJobs || len(jobs) < maxEndedJobs-1 || jobs[0].ID == "1" {
		t.Errorf("%d jobs kept (first %s), want about %d, the oldest dropped", len(jobs), jobs[0].ID, maxEndedJobs)
	}
}

// Kill also ends a job's descendant that left its session (setsid), and only the
// killed job's processes.
func TestJobKillFindsSetsidDescendants(t *testing.T) {
	a := startAgent(t)
	escaper := []string{"sleep", "3601"}
	other := []string{"sleep", "3602"}
	out, _, err := jobCall(t, a.c, "s", backend.JobRequest{Op: backend.JobStart}, "sh", "-c", "setsid sleep 3601 & exec sleep 3600")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	if _, _, err := jobCall(t, a.c, "s", backend.JobRequest{Op: backend.JobStart}, other...); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "both jobs' processes", func() bool {
		return len(procsWithArgs(escaper...)) == 1 && len(procsWithArgs(other...)) == 1
	})
	if _, _, err := jobCall(t, a.c, "s", backend.JobRequest{Op: backend.JobKill, ID: id}); err != nil {
		t.Fatal(err)
	}
	if pids := procsWithArgs(escaper...); len(pids) != 0 {
		t.Errorf("the job's setsid descendant %v outlived job kill", pids)
	}
	if len(procsWithArgs(other...)) != 1 {
		t.Error("job kill ended another job's process")
	}
}
