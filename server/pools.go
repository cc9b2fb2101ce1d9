package server

import (
	"context"
	"net/http"
	"time"

	"github.com/berth-sh/berth/server/apiconv"
)

// listPools is GET /v1/pools: every rule's warm pool, in rule order, from the store
// (no driver is asked; [] when no rule has a pool).
func (s *Server) listPools(w http.ResponseWriter, r *http.Request) {
	ref := s.acquire()
	defer s.release(ref)
	list, err := ref.reg.Pools(r.Context())
	if err != nil {
		s.writeError(w, r, err, "")
		return
	}
	writeJSON(w, http.StatusOK, apiconv.PoolsOf(list))
}

// RunPools keeps the warm pools of the current registry filled
// (registry.RunPools, every interval; 0: registry.DefaultPoolInterval) until ctx is
// done or the server shuts down. When Reload replaces the registry, the old one's
// loop is stopped (a member it was making is removed) and has returned before the
// new one's starts, so one filler runs at a time. Members that are ready stay when
// it returns: the next berth serve on the state dir finds them in the store.
func (s *Server) RunPools(ctx context.Context, interval time.Duration) {
	for {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			return
		}
		ref := s.cur
		ref.n++
		s.mu.Unlock()
		loopCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			ref.reg.RunPools(loopCtx, interval)
		}()
		select {
		case <-ctx.Done():
		case <-ref.gone:
		}
		cancel()
		<-done
		s.release(ref)
		if ctx.Err() != nil {
			return
		}
	}
}
