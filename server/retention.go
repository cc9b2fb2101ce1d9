package server

import (
	"context"
	"net/http"
	"time"

	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// RunRetention prunes (registry.Prune: reconcile every configured driver, apply
// idle_ttl, max_age and on_close leftovers, clean up files) now and then every
// interval (0: WithPruneInterval's, else DefaultRetentionInterval), with the
// registry current at each round, until ctx is done. Every
// action that changes something is logged at info with its cause and reason, a
// failed action or an unreachable driver at warn; a round that fails as a whole (the
// store cannot be used) is logged and the next round tries again. after, when set,
// is called with each round's report (nil and the error for a failed round).
func (s *Server) RunRetention(ctx context.Context, interval time.Duration, after func(*registry.PruneReport, error)) {
	if interval <= 0 {
		interval = s.pruneEvery
	}
	if interval <= 0 {
		interval = apiv1.DefaultRetentionInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rep, err := s.pruneOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if after != nil {
			after(rep, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pruneOnce runs one round on the current registry and logs it.
func (s *Server) pruneOnce(ctx context.Context) (*registry.PruneReport, error) {
	ref := s.acquire()
	defer s.release(ref)
	rep, err := ref.reg.Prune(ctx, registry.PruneOptions{})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("prune failed; trying again next round", "error", err)
		}
		return nil, err
	}
	// The registry has logged each action and each driver it skipped.
	changed := 0
	for _, a := range rep.Actions {
		if a.Action != registry.PruneKeep || a.Error != "" {
			changed++
		}
	}
	s.log.Debug("prune round done", "actions", changed)
	return rep, nil
}

// prune is POST /v1/prune: one round now, as berth prune does, answered with its
// report (the object berth prune --json prints). A body is optional.
func (s *Server) prune(w http.ResponseWriter, r *http.Request) {
	var req apiv1.PruneRequest
	if r.ContentLength != 0 {
		if err := s.readJSON(w, r, &req); err != nil {
			s.writeError(w, r, err, "")
			return
		}
	}
	ref := s.acquire()
	defer s.release(ref)
	rep, err := ref.reg.Prune(r.Context(), registry.PruneOptions{DryRun: req.DryRun, Owner: req.Owner})
	if err != nil {
		s.writeError(w, r, err, "")
		return
	}
	writeJSON(w, http.StatusOK, rep)
}
