package server

import (
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiconv"
	"github.com/berth-sh/berth/server/apiv1"
)

// checkJob validates req and returns the registry's request; errors are invalid and
// name the field.
func checkJob(req *apiv1.JobStartRequest) (registry.JobStartRequest, error) {
	out := registry.JobStartRequest{Argv: req.Argv, Dir: req.Cwd}
	switch {
	case len(req.Argv) > 0 && req.Command != "":
		return out, errorf("invalid", "give either argv or command, not both")
	case len(req.Argv) == 0 && strings.TrimSpace(req.Command) == "":
		return out, errorf("invalid", "no command: give argv (e.g. [\"sleep\",\"60\"]) or command (run with /bin/sh -c)")
	case len(req.Argv) > 0 && req.Argv[0] == "":
		return out, errorf("invalid", "argv[0]: empty program name")
	case strings.ContainsRune(req.Command, 0) || strings.ContainsRune(req.Cwd, 0):
		return out, errorf("invalid", "command and cwd must not hold a NUL character")
	}
	for i, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return out, errorf("invalid", "argv[%d] holds a NUL character", i)
		}
	}
	if req.Command != "" {
		out.Argv = []string{"/bin/sh", "-c", req.Command}
	}
	env, err := envList(req.Env)
	if err != nil {
		return out, err
	}
	out.Env = env
	return out, nil
}

// envList turns an env object into sorted KEY=VALUE pairs; errors are invalid.
func envList(m map[string]string) ([]string, error) {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, errorf("invalid", "env %q: a name must be non-empty without '=' or NUL, and a value without NUL", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		out = append(out, k+"="+m[k])
	}
	return out, nil
}

// startJob is POST /v1/sessions/{name}/jobs: start a background job, creating the
// sandbox when needed; 201 with the job.
func (s *Server) startJob(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var req apiv1.JobStartRequest
	if err := s.readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err, name)
		return
	}
	jreq, err := checkJob(&req)
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	ref := s.acquire()
	defer s.release(ref)
	j, err := ref.reg.JobStart(r.Context(), name, jreq)
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	writeJSON(w, http.StatusCreated, apiconv.JobOf(j))
}

// listJobs is GET /v1/sessions/{name}/jobs: the session's jobs, oldest first.
func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ref := s.acquire()
	defer s.release(ref)
	jobs, err := ref.reg.Jobs(r.Context(), name)
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	out := make([]apiv1.Job, 0, len(jobs))
	for _, j := range jobs {
		out = append(out, apiconv.JobOf(j))
	}
	writeJSON(w, http.StatusOK, out)
}

// killJob is POST /v1/sessions/{name}/jobs/{id}/kill: end the job's tree (TERM,
// then KILL); 204 once it is gone.
func (s *Server) killJob(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ref := s.acquire()
	defer s.release(ref)
	if err := ref.reg.JobKill(r.Context(), name, r.PathValue("id")); err != nil {
		s.writeError(w, r, err, name)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// jobLogs is GET /v1/sessions/{name}/jobs/{id}/logs?offset=N&follow=true: the job's
// output from byte offset N (default 0, the oldest kept byte) as NDJSON LogEvents,
// each flushed as it comes; with follow, until the job has ended. The answer is
// flow-controlled like a streamed exec's.
func (s *Server) jobLogs(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	q := r.URL.Query()
	var offset int64
	if v := q.Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			s.writeError(w, r, errorf("invalid", "offset %q: want a byte offset, 0 or more", v), name)
			return
		}
		offset = n
	}
	follow := false
	if v := q.Get("follow"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.writeError(w, r, errorf("invalid", "follow %q: want true or false", v), name)
			return
		}
		follow = b
	}
	ref := s.acquire()
	defer s.release(ref)
	st := newStream(w)
	lw := &logWriter{st: st, at: offset}
	end, err := ref.reg.JobLogs(r.Context(), name, registry.JobLogsRequest{ID: r.PathValue("id"), Offset: offset, Follow: follow,
		OnGap: func(dropped int64) {
			lw.at += dropped
			st.logEvent(apiv1.LogEvent{Event: "gap", Dropped: dropped, Offset: lw.at})
		}}, lw)
	switch {
	case err != nil && !st.started():
		s.writeError(w, r, err, name)
	case err != nil:
		info := errorInfo(err, name)
		st.logEvent(apiv1.LogEvent{Event: "error", Offset: lw.at, Error: &info})
	default:
		st.logEvent(apiv1.LogEvent{Event: "end", Offset: end.Offset, Ended: end.Ended, ExitCode: end.ExitCode, Signal: end.Signal})
	}
}

// logWriter sends a job's output as "output" events of at most maxEvent bytes.
type logWriter struct {
	st *stream
	at int64 // the offset of the next byte
}

func (lw *logWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		k := min(len(b), maxEvent)
		if err := lw.st.logEvent(apiv1.LogEvent{Event: "output", Offset: lw.at, Data: b[:k]}); err != nil {
			return 0, err
		}
		lw.at += int64(k)
		b = b[k:]
	}
	return n, nil
}
