package server

import (
	"context"
	"net/http"

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

// drivers is GET /v1/drivers: every driver the daemon knows, as berth drivers
// --json lists them (each is started, or asked if it runs, for its Info).
func (s *Server) drivers(w http.ResponseWriter, r *http.Request) {
	ref := s.acquire()
	defer s.release(ref)
	rows, err := DriversOf(r.Context(), ref.reg, nil)
	if err != nil {
		s.writeError(w, r, err, "")
		return
	}
	writeJSON(w, http.StatusOK, rows)
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
	writeJSON(w, http.StatusOK, ExplanationOf(ex))
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
