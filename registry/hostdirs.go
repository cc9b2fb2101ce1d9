package registry

import (
	"context"
	"errors"
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
// sandbox of that name, which is what makes the choice of a sandbox's dir (below)
// race-free.
//
// Earlier versions kept the dir at STATE/sandboxes/SANDBOX and the busy marker at
// STATE/locks/SANDBOX.busy, shared by every driver's sandbox of the name. Those
// sandboxes' drivers still reach their agents by those paths (local's meta.json, the
// containers' bind mounts), so the dirs cannot move while the sandboxes exist: such a
// sandbox keeps using its old dir (hostDir) until it is removed, and its next
// incarnation gets the new layout. A sandbox uses the old dir exactly when its driver
// has it, no new-layout dir exists for it, and the old dir does: every sandbox made by
// this version had its new-layout dir prepared before its driver created it.

// sandboxDir is the host dir of sandbox on driver in the current layout:
// STATE/sandboxes/DRIVER/SANDBOX.
func (r *Registry) sandboxDir(driver, sandbox string) string {
	return filepath.Join(r.stateDir, "sandboxes", driver, sandbox)
}

// legacySandboxDir is the host dir of sandboxes made by earlier versions:
// STATE/sandboxes/SANDBOX, whatever their driver.
func (r *Registry) legacySandboxDir(sandbox string) string {
	return filepath.Join(r.stateDir, "sandboxes", sandbox)
}

// busyPath is the busy marker of sandbox on driver: STATE/locks/SANDBOX.DRIVER.busy.
// Every exec started through the registry holds a shared flock on it until its Wait
// returns (or its process dies), so any berth process can tell that an exec is in
// flight.
func (r *Registry) busyPath(driver, sandbox string) string {
	return filepath.Join(r.stateDir, "locks", sandbox+"."+driver+".busy")
}

// legacyBusyPath is the busy marker that earlier versions held, per name.
func (r *Registry) legacyBusyPath(sandbox string) string {
	return filepath.Join(r.stateDir, "locks", sandbox+".busy")
}

// sandboxBusy reports whether an exec is in flight in sandbox on driver: one of this
// version (busyPath), or one that a berth of an earlier version, still running during
// an upgrade, started (legacyBusyPath; that marker does not say which driver, so
// it counts for every sandbox of the name). Call it with the name's lock held.
func (r *Registry) sandboxBusy(driver, sandbox string) (bool, error) {
	if busy, err := isBusy(r.busyPath(driver, sandbox)); err != nil || busy {
		return busy, err
	}
	return isBusy(r.legacyBusyPath(sandbox))
}

// hostDir returns the host dir that sandbox on driver uses, given whether the driver
// has the sandbox: its old-layout dir when it has, the new one does not exist and the
// old one does (legacy); the new-layout dir otherwise. Call it with the name's lock
// held.
func (r *Registry) hostDir(driver, sandbox string, exists bool) (dir string, legacy bool) {
	dir = r.sandboxDir(driver, sandbox)
	if !exists || fileExists(dir) {
		return dir, false
	}
	if old := r.legacySandboxDir(sandbox); fileExists(old) {
		return old, true
	}
	return dir, false
}

// resolveHostDir is hostDir for a sandbox whose existence is not known: it asks the
// driver only when an old-layout dir could be the answer. An Inspect error other than
// ErrNotFound counts as "has it", so no new dir is made for a sandbox that may exist
// (the caller's next driver call reports the error). Call it with the name's lock
// held.
func (r *Registry) resolveHostDir(ctx context.Context, b backend.TerminalBackend, driver, sandbox string) (dir string, legacy bool) {
	if fileExists(r.sandboxDir(driver, sandbox)) || !fileExists(r.legacySandboxDir(sandbox)) {
		return r.sandboxDir(driver, sandbox), false
	}
	_, err := b.Inspect(ctx, sandbox)
	return r.hostDir(driver, sandbox, !errors.Is(err, backend.ErrNotFound))
}

// legacyDirFree reports whether no sandbox named sandbox, on a driver other than
// except, may still use the old-layout dir: each such driver that may hold
// sandboxes of ours (hostDrivers) either has a new-layout dir for the name or says it
// has no such sandbox. A driver that cannot be asked makes it false. Only sandboxes
// made by earlier versions get here, so the drivers it starts are a one-time cost.
func (r *Registry) legacyDirFree(ctx context.Context, except, sandbox string) bool {
	recs, err := r.store.all()
	if err != nil {
		return false
	}
	for _, d := range r.hostDrivers(recs) {
		if d == except || fileExists(r.sandboxDir(d, sandbox)) {
			continue
		}
		b, err := r.driver(ctx, d)
		if err != nil {
			return false
		}
		if _, err := b.Inspect(ctx, sandbox); !errors.Is(err, backend.ErrNotFound) {
			return false
		}
	}
	return true
}

// removeHostFiles deletes the host dir and busy marker of sandbox on driver, which its
// driver has just removed (dir and legacy as hostDir said before the removal). An
// old-layout dir is deleted only when no other driver's sandbox of the name may use
// it (legacyDirFree); otherwise Prune deletes it once none does.
func (r *Registry) removeHostFiles(ctx context.Context, driver, sandbox, dir string, legacy bool) {
	os.Remove(r.busyPath(driver, sandbox))
	if legacy && !r.legacyDirFree(ctx, driver, sandbox) {
		r.log.Info("old-layout sandbox dir left for prune: another driver may have a sandbox of the name", "dir", dir)
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		r.log.Warn("deleting sandbox dir", "dir", dir, "error", err)
	}
}

// markDriver makes STATE/sandboxes/DRIVER, which tells Prune that driver may hold
// sandboxes of ours even when no rule, record or driver block names it any more (a
// session moved away from a sandbox made by an earlier version, which has no dir
// there).
func (r *Registry) markDriver(driver string) {
	if err := os.MkdirAll(filepath.Join(r.stateDir, "sandboxes", driver), 0o700); err != nil {
		r.log.Warn("recording a driver for prune", "driver", driver, "error", err)
	}
}

// isLegacyEntry reports whether name, an entry of STATE/sandboxes, is an old-layout
// sandbox dir rather than a driver's dir: it has the shape of the sandbox names that
// the registry makes and is no known driver's name.
func (r *Registry) isLegacyEntry(name string) bool {
	return isSandboxName(name) && !slices.Contains(r.known, name)
}

// isSandboxName reports whether name has the shape of SandboxName's results:
// "b-" + 8 hex digits + "-" + 16 hex digits.
func isSandboxName(name string) bool {
	rest, ok := strings.CutPrefix(name, "b-")
	if !ok || len(rest) != 8+1+16 || rest[8] != '-' {
		return false
	}
	return isHex(rest[:8]) && isHex(rest[9:])
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return s != ""
}

// driverDirs returns the drivers that have a dir in STATE/sandboxes (the new layout,
// or markDriver), sorted.
func (r *Registry) driverDirs() []string {
	ents, _ := os.ReadDir(filepath.Join(r.stateDir, "sandboxes"))
	var out []string
	for _, e := range ents {
		if e.IsDir() && !r.isLegacyEntry(e.Name()) {
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
