package server

import (
	"context"
	"net/http"
	"time"

	"github.com/berth-sh/berth/registry"
)

// Pool is one rule's warm pool, as GET /v1/pools lists it; berth sessions --pool
// --json prints the same objects.
type Pool struct {
	// Scope is the rule's glob, Position its FILE:LINE:COL ("(no rule with a
	// pool)" for members of a scope whose rule has no pool any more), Driver its
	// driver.
	Scope    string `json:"scope"`
	Position string `json:"position"`
	Driver   string `json:"driver"`
	// Size is the pool block's size (0 for members left by an earlier config);
	// MaxIdleMS its max_idle in milliseconds (0: members are never replaced for
	// their age).
	Size      int   `json:"size"`
	MaxIdleMS int64 `json:"max_idle_ms"`
	// Ready counts members ready to be claimed, Creating those being made,
	// Claiming those claimed by a call that has not recorded its session yet,
	// Draining those left from an earlier spec, which the daemon removes.
	Ready    int `json:"ready"`
	Creating int `json:"creating"`
	Claiming int `json:"claiming"`
	Draining int `json:"draining"`
	// Members are the pool's members, oldest first ([] for none).
	Members []PoolMember `json:"members"`
}

// PoolMember is one member of a Pool.
type PoolMember struct {
	// Sandbox is the member's sandbox name.
	Sandbox string `json:"sandbox"`
	// State is ready, creating, claiming or draining.
	State string `json:"state"`
	// Created is when the member was reserved, Ready when its agent first
	// answered (left out while it is being made); RFC 3339, UTC.
	Created time.Time `json:"created"`
	Ready   time.Time `json:"ready,omitzero"`
	// Session is the claiming session (state claiming).
	Session string `json:"session,omitempty"`
}

// PoolsOf converts the registry's pools (registry.Pools) into the API's shape.
func PoolsOf(list []registry.PoolStatus) []Pool {
	out := make([]Pool, 0, len(list))
	for _, p := range list {
		row := Pool{Scope: p.Scope, Position: p.Position, Driver: p.Driver, Size: p.Size, MaxIdleMS: p.MaxIdle.Milliseconds(),
			Ready: p.Ready, Creating: p.Creating, Claiming: p.Claiming, Draining: p.Draining, Members: make([]PoolMember, 0, len(p.Members))}
		for _, m := range p.Members {
			row.Members = append(row.Members, PoolMember{Sandbox: m.Sandbox, State: m.State, Created: m.Created, Ready: m.Ready, Session: m.Session})
		}
		out = append(out, row)
	}
	return out
}

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
	writeJSON(w, http.StatusOK, PoolsOf(list))
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
