package server

import (
	"context"
	"net/http"
	"os"
	"sort"

	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiconv"
	"github.com/berth-sh/berth/server/apiv1"
)

// listSessions is GET /v1/sessions: every recorded session, sorted by name
// ([] when there are none).
func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	ref := s.acquire()
	defer s.release(ref)
	list, err := ref.reg.Sessions(r.Context())
	if err != nil {
		s.writeError(w, r, err, "")
		return
	}
	out := make([]apiv1.Session, 0, len(list))
	for _, si := range list {
		out = append(out, apiconv.SessionOf(si))
	}
	writeJSON(w, http.StatusOK, out)
}

// sessionName returns the path's session name as given and in its normal form
// (config.NormalizeSession); a name that breaks the rules is answered 400 and ok is
// false.
func (s *Server) sessionName(w http.ResponseWriter, r *http.Request) (name, session string, ok bool) {
	name = r.PathValue("name")
	session, err := config.NormalizeSession(name)
	if err != nil {
		s.writeError(w, r, err, name)
		return name, "", false
	}
	return name, session, true
}

// getSession is GET /v1/sessions/{name}: the session's row, or 404 (not_found)
// when it has no recorded sandbox.
func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	name, session, ok := s.sessionName(w, r)
	if !ok {
		return
	}
	ref := s.acquire()
	defer s.release(ref)
	list, err := ref.reg.Sessions(r.Context())
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	for _, si := range list {
		if si.Session == session {
			writeJSON(w, http.StatusOK, apiconv.SessionOf(si))
			return
		}
	}
	s.writeError(w, r, errorf("not_found", "session %q has no sandbox recorded (it never ran a command, or it was removed)", session), name)
}

// sessionCall answers a call on one session that returns only an error: 204 on
// success.
func (s *Server) sessionCall(w http.ResponseWriter, r *http.Request, f func(*registry.Registry, context.Context, string) error) {
	name := r.PathValue("name")
	ref := s.acquire()
	defer s.release(ref)
	if err := f(ref.reg, r.Context(), name); err != nil {
		s.writeError(w, r, err, name)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// closeSession is POST /v1/sessions/{name}/close: the rule's on_close (berth close).
func (s *Server) closeSession(w http.ResponseWriter, r *http.Request) {
	s.sessionCall(w, r, (*registry.Registry).CloseSession)
}

// stopSession is POST /v1/sessions/{name}/stop: stop the sandbox, keep its files
// (berth stop).
func (s *Server) stopSession(w http.ResponseWriter, r *http.Request) {
	s.sessionCall(w, r, (*registry.Registry).StopSession)
}

// removeSession is DELETE /v1/sessions/{name}: remove the sandbox and its files
// and forget the session (berth rm); idempotent.
func (s *Server) removeSession(w http.ResponseWriter, r *http.Request) {
	s.sessionCall(w, r, (*registry.Registry).RemoveSession)
}

// recreateSession is POST /v1/sessions/{name}/recreate: remove the session's
// sandbox so that its next exec starts from the rule's current config.
func (s *Server) recreateSession(w http.ResponseWriter, r *http.Request) {
	name, session, ok := s.sessionName(w, r)
	if !ok {
		return
	}
	ref := s.acquire()
	defer s.release(ref)
	removed, err := ref.reg.Recreate(r.Context(), session)
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	writeJSON(w, http.StatusOK, apiv1.RecreateAnswer{Session: session, Removed: removed})
}

// health is GET /v1/health: the store and the drivers the config's rules name.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	ref := s.acquire()
	defer s.release(ref)
	reg := ref.reg
	h := apiv1.Health{Status: "ok", Version: s.version, PID: os.Getpid(), StateDir: reg.StateDir(), Config: reg.Config().Path, Store: "ok", Drivers: []apiv1.DriverHealth{}}
	status := http.StatusOK
	if _, err := reg.Owner(); err != nil {
		h.Status, h.Store, status = "unavailable", err.Error(), http.StatusServiceUnavailable
	}
	names := map[string]bool{}
	for _, rule := range reg.Config().Rules {
		names[rule.Driver] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		dh := apiv1.DriverHealth{Name: n, Health: "ok"}
		b, err := reg.Backend(r.Context(), n)
		if err == nil {
			_, err = b.Info(r.Context())
		}
		if err != nil {
			dh.Health = err.Error()
			if h.Status == "ok" {
				h.Status = "degraded"
			}
		}
		h.Drivers = append(h.Drivers, dh)
	}
	writeJSON(w, status, h)
}

// status is GET /v1/status: the daemon's identity (version, pid, state dir, config
// file, clock offset), asking no driver: what berth's CLI checks before it uses the
// daemon.
func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	ref := s.acquire()
	defer s.release(ref)
	reg := ref.reg
	writeJSON(w, http.StatusOK, apiv1.Status{API: "v1", Version: s.version, PID: os.Getpid(), StateDir: reg.StateDir(),
		Config: reg.Config().Path, ConfigSHA256: reg.Config().SHA256, ClockOffsetMS: reg.ClockOffset().Milliseconds(),
		PruneIntervalMS: s.pruneEvery.Milliseconds()})
}
