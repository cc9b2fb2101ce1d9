package server

import (
	"net/http"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/server/apiconv"
)

// drivers is GET /v1/drivers: every driver the daemon knows, as berth drivers
// --json lists them (each is started, or asked if it runs, for its Info).
func (s *Server) drivers(w http.ResponseWriter, r *http.Request) {
	ref := s.acquire()
	defer s.release(ref)
	rows, err := apiconv.DriversOf(r.Context(), ref.reg, nil)
	if err != nil {
		s.writeError(w, r, err, "")
		return
	}
	writeJSON(w, http.StatusOK, rows)
}

// explain is GET /v1/config/explain?session=NAME: how the daemon's config places
// the session (no driver is started). A missing session parameter, a name that
// breaks the rules or one that no rule matches is 400 (invalid).
func (s *Server) explain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("session")
	if !q.Has("session") || name == "" {
		s.writeError(w, r, errorf("invalid", "give the session to explain: /v1/config/explain?session=NAME (percent-encoded)"), "")
		return
	}
	ref := s.acquire()
	defer s.release(ref)
	ex, err := ref.reg.Explain(name)
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	writeJSON(w, http.StatusOK, apiconv.ExplanationOf(ex))
}

// configCheck is POST /v1/config/check: the daemon reads its config file again from
// disk and checks it as berth config check does (WithConfigCheck), changing
// nothing: what a SIGHUP would meet. It takes no body. A daemon that runs with no
// config file, or without a check, is 400 (invalid) or 501 (unsupported).
func (s *Server) configCheck(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > 0 {
		s.writeError(w, r, errorf("invalid", "POST /v1/config/check takes no body: it checks the daemon's own config file"), "")
		return
	}
	if s.checkConfig == nil {
		s.writeError(w, r, backend.Errorf(backend.ErrUnsupported, "this server has no config check"), "")
		return
	}
	ref := s.acquire()
	path := ref.reg.Config().Path
	s.release(ref)
	if path == "" {
		s.writeError(w, r, errorf("invalid", "berth serve runs with no config file (the built-in default): there is nothing to check"), "")
		return
	}
	writeJSON(w, http.StatusOK, s.checkConfig(r.Context(), path))
}
