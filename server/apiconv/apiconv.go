// Package apiconv converts the registry's values into berth serve's API v1 wire
// types (package server/apiv1): the sessions, jobs, pools, drivers and explanations
// that the server answers and that berth's CLI prints in --json.
//
// It is apart from apiv1 so that apiv1 links no registry: the thin berth front
// (cli/front) speaks the API with apiv1's types and must start fast.
package apiconv

import (
	"context"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// DriversOf starts (or reuses) every driver reg knows and describes each
// (registry.Drivers), with the executable of each running plugin; inProcess says
// which drivers reg runs in process. A driver that fails is a row whose Health says
// why; the error is the store's.
func DriversOf(ctx context.Context, reg *registry.Registry, inProcess func(name string) bool) ([]apiv1.Driver, error) {
	list, err := reg.Drivers(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]apiv1.Driver, 0, len(list))
	for _, d := range list {
		row := apiv1.Driver{Name: d.Name, Version: d.Info.Version, Protocol: d.Info.Protocol,
			ProtocolVersions: d.Info.ProtocolVersions, Served: "plugin", Capabilities: d.Info.Capabilities, Health: "ok"}
		if inProcess != nil && inProcess(d.Name) {
			row.Served = "in-process"
		}
		if d.Err != nil {
			row.Health = d.Err.Error()
		} else if b, err := reg.Backend(ctx, d.Name); err == nil {
			// The plugin is running already: this only reads its path.
			if p, ok := b.(interface{ Path() string }); ok {
				row.Path = p.Path()
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// ExplanationOf converts a registry.Explanation into the API's shape.
func ExplanationOf(ex registry.Explanation) apiv1.Explanation {
	out := apiv1.Explanation{
		Session: ex.Session, Rule: ex.Rule.Glob, RuleIndex: ex.RuleIndex, Position: ex.Position,
		Driver: ex.Driver, Isolation: string(ex.Isolation), Sandbox: ex.Sandbox, SpecHash: ex.SpecHash,
		Spec: ex.Spec, Retention: apiv1.ExplainRetention{OnClose: string(ex.Rule.Retention.OnClose)},
	}
	if d := ex.Rule.Retention.IdleTTL; d > 0 {
		out.Retention.IdleTTL = d.String()
		out.Retention.IdleAction = string(ex.Rule.Retention.IdleAction)
	}
	if d := ex.Rule.Retention.MaxAge; d > 0 {
		out.Retention.MaxAge = d.String()
	}
	return out
}

// SessionOf converts a registry row into the API's (and berth sessions --json's)
// shape.
func SessionOf(s registry.SessionInfo) apiv1.Session {
	return apiv1.Session{
		Session: s.Session, Driver: s.Driver, Sandbox: s.Sandbox, Scope: s.Scope, State: s.State,
		Created: s.Created, LastUsed: s.LastUsed, Drift: s.Drift, DriftReason: s.DriftReason, Error: s.Error,
		RemovedReason: s.RemovedReason, Pooled: s.Pooled,
	}
}

// JobOf converts a job as the registry reports it into the API's (and berth job ls
// --json's) shape.
func JobOf(j agent.Job) apiv1.Job {
	return apiv1.Job{ID: j.ID, Session: j.Session, Argv: j.Argv, PID: j.PID, Running: j.Running, ExitCode: j.ExitCode,
		Signal: j.Signal, Started: j.Started, Ended: j.Ended, LogBytes: j.LogBytes, DroppedBytes: j.DroppedBytes}
}

// PoolsOf converts the registry's pools (registry.Pools) into the API's shape.
func PoolsOf(list []registry.PoolStatus) []apiv1.Pool {
	out := make([]apiv1.Pool, 0, len(list))
	for _, p := range list {
		row := apiv1.Pool{Scope: p.Scope, Position: p.Position, Driver: p.Driver, Size: p.Size, MaxIdleMS: p.MaxIdle.Milliseconds(),
			Ready: p.Ready, Creating: p.Creating, Claiming: p.Claiming, Draining: p.Draining, Members: make([]apiv1.PoolMember, 0, len(p.Members))}
		for _, m := range p.Members {
			row.Members = append(row.Members, apiv1.PoolMember{Sandbox: m.Sandbox, State: m.State, Created: m.Created, Ready: m.Ready, Session: m.Session})
		}
		out = append(out, row)
	}
	return out
}

// StartedOf is where lease says a command runs (session, driver, sandbox, and
// whether the sandbox was recreated, moved or taken from a pool, with the reasons),
// as the API's "started" event and berth exec --json say it: the one conversion of
// a registry.Lease onto the wire.
func StartedOf(lease *registry.Lease) *apiv1.ExecStarted {
	return &apiv1.ExecStarted{Session: lease.Session, Driver: lease.Driver, Sandbox: lease.Sandbox,
		Recreated: lease.Recreated, RecreatedReason: lease.RecreatedReason, Moved: lease.Moved, MovedReason: lease.MovedReason, Pooled: lease.Pooled}
}
