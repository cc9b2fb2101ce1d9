package registry

import (
	"fmt"
	"path/filepath"

	"github.com/hashicorp/hcl/v2"

	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/hostpaths"
)

// CheckMounts applies berth's own part of the mount policy to every rule of c, as
// the registry does before it creates a sandbox: unless a rule sets allow_host_paths,
// no mount source may be, contain or lie inside stateDir (the state dir the config is
// used with, as given to Open; a relative one is made absolute as Open does), another
// berth state dir berth can recognise, or a directory where berth's driver plugins
// put their sockets (see docs/security.md). Links are resolved on both sides. It
// applies to every driver, built-in or not; the drivers' own checks (sockets, /,
// existence) are theirs. A rule with allow_host_paths = true gets a warning instead,
// saying what it grants. Errors: a *config.Error with one diagnostic per refused
// mount, at its rule's position.
//
// The other state dirs are the host's, not settings of this registry: package
// internal/hostpaths finds them (the default state dirs of the invoking user, of
// SUDO_USER, of root and of the users in /etc/passwd, the state dir that
// $BERTH_STATE_DIR names, the go-plugin socket dirs), reading the environment and
// /etc/passwd when a rule has mounts, at each call; CheckMounts itself reads no
// environment variable, and Open does not call it.
func CheckMounts(c *config.Config, stateDir string) (warnings hcl.Diagnostics, err error) {
	if stateDir != "" {
		if abs, err := filepath.Abs(stateDir); err == nil {
			stateDir = abs
		}
	}
	var diags hcl.Diagnostics
	var dirs []hostpaths.Dir
	for i := range c.Rules {
		rule := &c.Rules[i]
		for _, m := range rule.Mounts {
			if dirs == nil {
				dirs = hostpaths.Known(stateDir)
			}
			err := hostpaths.Check(m.Source, dirs)
			if err == nil {
				continue
			}
			d := &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Mount exposes berth's own files",
				Detail:   fmt.Sprintf("scope %q: %v.", rule.Glob, err),
			}
			if rule.AllowHostPaths {
				d.Severity = hcl.DiagWarning
				d.Summary = "allow_host_paths lets a mount expose berth's own files"
				d.Detail = fmt.Sprintf("scope %q: allow_host_paths = true accepts this: %v.", rule.Glob, err)
			}
			if rule.Range.Filename != "" {
				rng := rule.Range
				d.Subject = &rng
			}
			if rule.AllowHostPaths {
				warnings = append(warnings, d)
			} else {
				diags = append(diags, d)
			}
		}
	}
	if len(diags) > 0 {
		return warnings, &config.Error{Diagnostics: diags}
	}
	return warnings, nil
}

// checkMounts applies CheckMounts to rule alone, with the registry's state dir, and
// logs its warnings.
func (r *Registry) checkMounts(rule *config.Rule) error {
	warnings, err := CheckMounts(&config.Config{Rules: []config.Rule{*rule}}, r.stateDir)
	for _, w := range warnings {
		r.log.Warn(config.FormatDiagnostics(hcl.Diagnostics{w}))
	}
	return err
}

// writeStateMarker marks the state dir as berth's (hostpaths.MarkerFile), so that a
// mount of it, of a directory inside it or of its parent is refused by any berth
// that uses another state dir. A failure is logged: the other checks still apply.
func (r *Registry) writeStateMarker() {
	if err := hostpaths.WriteMarker(r.stateDir); err != nil {
		r.log.Warn("marking the state dir", "dir", r.stateDir, "error", err)
	}
}
