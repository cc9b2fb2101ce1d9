package apiv1

import (
	"github.com/berth-sh/berth/backend"
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
