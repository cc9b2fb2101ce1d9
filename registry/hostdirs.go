package registry

import (
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berth-sh/berth/backend"
)

// Host-side files of a sandbox. A sandbox is a (driver, name) pair: after a change of
// the driver that a session's rule selects, the old driver's sandbox and the new one
// have the same name, so everything that belongs to one of them is keyed by both:
//
//	STATE/sandboxes/DRIVER/SANDBOX/   agent dir and socket dir (sandboxDir)
//	STATE/locks/SANDBOX.DRIVER.busy   busy marker (busyPath)
//
// The lock STATE/locks/SANDBOX.lock stays per name: it serialises every change of any
// sandbox of that name.

// sandboxDir is the host dir of sandbox on driver in the current layout:
// STATE/sandboxes/DRIVER/SANDBOX.
func (r *Registry) sandboxDir(driver, sandbox string) string {
	return filepath.Join(r.stateDir, "sandboxes", driver, sandbox)
}

// PrepareAgent prepares the agent files of sandbox on driver where the registry keeps
// them (STATE/sandboxes/DRIVER/SANDBOX: the agent binary's link and the token in
// agent/, the socket dir run/), with the registry's agent binary, and returns them
// for backend.CreateRequest.Agent: a sandbox made with them is one the registry can
// reach (a tool or a test that creates a sandbox for it outside a call, as
// reconcile's tests do). Errors: a bad sandbox or driver name (ErrInvalid); those of
// the agent's install.
func (r *Registry) PrepareAgent(driver, sandbox string) (backend.AgentFiles, error) {
	if err := backend.ValidateSandboxName(sandbox); err != nil {
		return backend.AgentFiles{}, err
	}
	if driver == "" || strings.ContainsAny(driver, "/\x00") || driver == "." || driver == ".." {
		return backend.AgentFiles{}, backend.Errorf(backend.ErrInvalid, "driver name %q cannot name a directory", driver)
	}
	if err := r.ensure(); err != nil {
		return backend.AgentFiles{}, err
	}
	dir := r.sandboxDir(driver, sandbox)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return backend.AgentFiles{}, stateDirError(r.stateDir, err.Error())
	}
	return r.prepare(dir)
}

// busyPath is the busy marker of sandbox on driver: STATE/locks/SANDBOX.DRIVER.busy.
// Every exec started through the registry holds a shared flock on it until its Wait
// returns (or its process dies), so any berth process can tell that an exec is in
// flight.
func (r *Registry) busyPath(driver, sandbox string) string {
	return filepath.Join(r.stateDir, "locks", sandbox+"."+driver+".busy")
}

// sandboxBusy reports whether an exec is in flight in sandbox on driver (its busy
// marker is held). Call it with the name's lock held.
func (r *Registry) sandboxBusy(driver, sandbox string) (bool, error) {
	return isBusy(r.busyPath(driver, sandbox))
}

// removeHostFiles deletes the host dir and busy marker of sandbox on driver, which its
// driver has just removed.
func (r *Registry) removeHostFiles(driver, sandbox string) {
	os.Remove(r.busyPath(driver, sandbox))
	if err := os.RemoveAll(r.sandboxDir(driver, sandbox)); err != nil {
		r.log.Warn("deleting sandbox dir", "dir", r.sandboxDir(driver, sandbox), "error", err)
	}
}

// markDriver makes STATE/sandboxes/DRIVER, which tells Prune that driver may hold
// sandboxes of ours even when no rule, record or driver block names it any more.
func (r *Registry) markDriver(driver string) {
	if err := os.MkdirAll(filepath.Join(r.stateDir, "sandboxes", driver), 0o700); err != nil {
		r.log.Warn("recording a driver for prune", "driver", driver, "error", err)
	}
}

// driverDirs returns the drivers that have a dir in STATE/sandboxes (or markDriver),
// sorted.
func (r *Registry) driverDirs() []string {
	ents, _ := os.ReadDir(filepath.Join(r.stateDir, "sandboxes"))
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// hostDrivers returns, sorted, every known driver that may hold sandboxes of ours:
// those of the rules, of recs and of the config's driver blocks, and those with a dir
// in STATE/sandboxes (driverDirs).
func (r *Registry) hostDrivers(recs []record) []string {
	set := map[string]bool{}
	for _, rule := range r.cfg.Rules {
		set[rule.Driver] = true
	}
	for _, rec := range recs {
		set[rec.Driver] = true
	}
	for name := range r.cfg.Drivers {
		set[name] = true
	}
	for _, name := range r.driverDirs() {
		if slices.Contains(r.known, name) {
			set[name] = true
		}
	}
	out := make([]string, 0, len(set))
	for name := range set {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
