package apiv1

import (
	"time"
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
	// Claiming those claimed but not recorded (left by a berth that claimed in two
	// transactions; a claim is one now, so 0 unless such a store is reused),
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
