package apiv1

import (
	"context"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry"
)

// Driver is one row of GET /v1/drivers and of berth drivers --json.
type Driver struct {
	Name             string `json:"name"`
	Version          string `json:"version"`
	Protocol         int    `json:"protocol"`
	ProtocolVersions []int  `json:"protocol_versions"`
	// Served is "plugin" or "in-process".
	Served string `json:"served"`
	// Health is "ok" or why the driver could not be started, configured or asked.
	Health       string               `json:"health"`
	Capabilities backend.Capabilities `json:"capabilities"`
	// Path is the executable serving the driver's plugin (the berth binary for
	// local, berth-driver-NAME for docker, containerd and third-party drivers);
	// empty in process or when it could not start.
	Path string `json:"path,omitempty"`
}

// DriversOf starts (or reuses) every driver reg knows and describes each
// (registry.Drivers), with the executable of each running plugin; inProcess says
// which drivers reg runs in process. A driver that fails is a row whose Health says
// why; the error is the store's.
func DriversOf(ctx context.Context, reg *registry.Registry, inProcess func(name string) bool) ([]Driver, error) {
	list, err := reg.Drivers(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]Driver, 0, len(list))
	for _, d := range list {
		row := Driver{Name: d.Name, Version: d.Info.Version, Protocol: d.Info.Protocol,
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

// Explanation is the answer of GET /v1/config/explain and what berth config
// explain --json prints: which rule a session matches, its driver, its sandbox's
// name and final spec, and its retention.
type Explanation struct {
	Session string `json:"session"`
	// Rule is the matching rule's glob, RuleIndex its index among the config's
	// rules (from 0) and Position its FILE:LINE:COL.
	Rule      string              `json:"rule"`
	RuleIndex int                 `json:"rule_index"`
	Position  string              `json:"position"`
	Driver    string              `json:"driver"`
	Isolation string              `json:"isolation"`
	Sandbox   string              `json:"sandbox"`
	SpecHash  string              `json:"spec_hash"`
	Retention ExplainRetention    `json:"retention"`
	Spec      backend.SandboxSpec `json:"spec"`
}

// ExplainRetention is an Explanation's retention: durations as Go prints them
// ("1h0m0s"), empty when unset.
type ExplainRetention struct {
	OnClose    string `json:"on_close"`
	IdleTTL    string `json:"idle_ttl,omitempty"`
	IdleAction string `json:"idle_action,omitempty"`
	MaxAge     string `json:"max_age,omitempty"`
}

// ExplanationOf converts a registry.Explanation into the API's shape.
func ExplanationOf(ex registry.Explanation) Explanation {
	out := Explanation{
		Session: ex.Session, Rule: ex.Rule.Glob, RuleIndex: ex.RuleIndex, Position: ex.Position,
		Driver: ex.Driver, Isolation: string(ex.Isolation), Sandbox: ex.Sandbox, SpecHash: ex.SpecHash,
		Spec: ex.Spec, Retention: ExplainRetention{OnClose: string(ex.Rule.Retention.OnClose)},
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
