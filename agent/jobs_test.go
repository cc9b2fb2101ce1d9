package agent

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

func startJob(t *testing.T, c *Client, session string, argv ...string) Job {
	t.Helper()
	j, err := c.StartJob(testCtx(t), StartJobRequest{Session: session, Argv: argv})
	if err != nil {
		t.Fatalf("StartJob %q: %v", argv, err)
	}
	return j
}

func jobLogs(t *testing.T, c *Client, req JobLogsRequest) (string, JobLogsEnd, error) {
	t.Helper()
	var out bytes.Buffer
	end, err := c.JobLogs(testCtx(t), req, &out)
	return out.String(), end, err
}

func jobList(t *testing.T, c *Client, session string) []Job {
	t.Helper()
	jobs, err := c.Jobs(testCtx(t), session)
	if err != nil {
		t.Fatal(err)
	}
	return jobs
}

func TestJobs(t *testing.T) {
	a := startAgent(t)
	c := a.c
	j := startJob(t, c, "s1", "sh", "-c", "echo started; echo err >&2; read x < /dev/zero; exit 3")
	if j.ID == "" || !j.Running || j.PID == 0 || j.Session != "s1" || j.Started.IsZero() {
		t.Fatalf("started job %+v", j)
	}
	jobs := jobList(t, c, "s1")
	if len(jobs) != 1 || jobs[0].ID != j.ID || !jobs[0].Running || jobs[0].Argv[0] != "sh" {
		t.Fatalf("job list %+v, want job %s running", jobs, j.ID)
	}
	if other := jobList(t, c, "s2"); len(other) != 0 {
		t.Errorf("another session lists %+v", other)
	}
	if all, err := c.AllJobs(testCtx(t)); err != nil || len(all) != 1 {
		t.Errorf("all jobs: %+v %v", all, err)
	}
	if _, _, err := jobLogs(t, c, JobLogsRequest{Session: "s2", ID: j.ID}); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("logs of another session's job: %v, want ErrNotFound", err)
	}
	// The start call has ended; the job runs on and its output is kept.
	var end JobLogsEnd
	testwait.Until(t, "the job's output", func() bool {
		var out string
		out, end, _ = jobLogs(t, c, JobLogsRequest{Session: "s1", ID: j.ID})
		return strings.Contains(out, "started\n") && strings.Contains(out, "err\n")
	})
	if end.Ended || end.Offset != int64(len("started\nerr\n")) {
		t.Errorf("logs of a running job ended %+v, want not ended at offset 12", end)
	}
	// From an offset: only what comes after it.
	if out, _, err := jobLogs(t, c, JobLogsRequest{Session: "s1", ID: j.ID, Offset: 8}); err != nil || out != "err\n" {
		t.Errorf("logs from offset 8: %q %v", out, err)
	}
	// Follow returns the job's result once it has been killed.
	follow := make(chan JobLogsEnd, 1)
	go func() {
		_, end, _ := jobLogs(t, c, JobLogsRequest{Session: "s1", ID: j.ID, Follow: true})
		follow <- end
	}()
	if err := c.KillJob(testCtx(t), "s1", j.ID); err != nil {
		t.Fatalf("job kill: %v", err)
	}
	select {
	case end := <-follow:
		if !end.Ended || end.Signal != 15 && end.Signal != 9 {
			t.Errorf("followed logs of a killed job: %+v, want ended with its signal", end)
		}
	case <-time.After(testwait.Limit):
		t.Fatal("logs --follow did not end when the job was killed")
	}
	if jobs := jobList(t, c, "s1"); len(jobs) != 1 || jobs[0].Running || jobs[0].Ended.IsZero() {
		t.Errorf("after kill: %+v, want the job ended", jobs)
	}
	if len(procsWithArgs("sh", "-c", "echo started; echo err >&2; read x < /dev/zero; exit 3")) != 0 {
		t.Error("the killed job's process is still alive")
	}

	// A job that exits by itself reports its exit code through a followed log.
	j2 := startJob(t, c, "s1", "sh", "-c", "seq 1 3; exit 4")
	logs, end, err := jobLogs(t, c, JobLogsRequest{Session: "s1", ID: j2.ID, Follow: true})
	if err != nil || logs != "1\n2\n3\n" || !end.Ended || end.ExitCode != 4 || end.Offset != 6 {
		t.Errorf("followed logs of a job that exits 4: %q %+v %v", logs, end, err)
	}
	if err := c.KillJob(testCtx(t), "s1", "999"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("kill of an unknown job: %v, want ErrNotFound", err)
	}
	if _, err := c.StartJob(testCtx(t), StartJobRequest{Session: "s1", Argv: []string{"/nonexistent/cmd"}}); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "/nonexistent/cmd") {
		t.Errorf("start of a missing command: %v, want ErrInvalid naming it", err)
	}
	if _, err := c.StartJob(testCtx(t), StartJobRequest{Argv: []string{"true"}}); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("start without a session: %v, want ErrInvalid", err)
	}
	if _, _, err := jobLogs(t, c, JobLogsRequest{Session: "s1", ID: j2.ID, Offset: -1}); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("negative offset: %v, want ErrInvalid", err)
	}
}

func TestJobLogBounded(t *testing.T) {
	a := startAgent(t)
	j := startJob(t, a.c, "s", "sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x")
	// Following streams everything as it comes; it ends with the job.
	followed, end, err := jobLogs(t, a.c, JobLogsRequest{Session: "s", ID: j.ID, Follow: true})
	if err != nil || end.ExitCode != 0 || !end.Ended || strings.Count(followed, "x") < JobLogMax {
		t.Fatalf("logs --follow: %v %+v, %d bytes", err, end, len(followed))
	}
	logs, end, err := jobLogs(t, a.c, JobLogsRequest{Session: "s", ID: j.ID})
	if err != nil {
		t.Fatal(err)
	}
	want := "[... 1951424 bytes dropped ...]\n" + strings.Repeat("x", JobLogMax)
	if logs != want || end.Offset != 3000000 {
		t.Errorf("log of 3000000 bytes: %d bytes starting %q (offset %d), want the marker and the last %d bytes", len(logs), logs[:min(len(logs), 40)], end.Offset, JobLogMax)
	}
	var gap int64
	var out bytes.Buffer
	if _, err := a.c.JobLogs(testCtx(t), JobLogsRequest{Session: "s", ID: j.ID, OnGap: func(n int64) { gap += n }}, &out); err != nil || gap != 1951424 || out.Len() != JobLogMax {
		t.Errorf("with OnGap: gap %d, %d bytes, %v", gap, out.Len(), err)
	}
}

func TestJobsEndWithAgent(t *testing.T) {
	a := startAgent(t)
	argv := []string{"sleep", "3600"}
	startJob(t, a.c, "s", argv...)
	if len(procsWithArgs(argv...)) == 0 {
		t.Fatal("the job is not running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
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
		j := startJob(t, a.c, "s", "true")
		jobLogs(t, a.c, JobLogsRequest{Session: "s", ID: j.ID, Follow: true})
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
	j := startJob(t, a.c, "s", "sh", "-c", "setsid sleep 3601 & exec sleep 3600")
	startJob(t, a.c, "s", other...)
	testwait.Until(t, "both jobs' processes", func() bool {
		return len(procsWithArgs(escaper...)) == 1 && len(procsWithArgs(other...)) == 1
	})
	if err := a.c.KillJob(testCtx(t), "s", j.ID); err != nil {
		t.Fatal(err)
	}
	if pids := procsWithArgs(escaper...); len(pids) != 0 {
		t.Errorf("the job's setsid descendant %v outlived job kill", pids)
	}
	if len(procsWithArgs(other...)) != 1 {
		t.Error("job kill ended another job's process")
	}
}
