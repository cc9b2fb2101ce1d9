package registry

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry/config"
)

// Prune's file phase in both layouts: files nothing references go once old enough
// (a stray per-driver dir and busy marker, a stray old-layout dir and lock, an empty
// driver dir); the files of live sandboxes stay whatever their age, in either layout
// (an old-layout dir that a listed sandbox uses, a per-driver dir and busy marker of a
// recorded one). While one driver is down, the other drivers' per-driver files are
// still cleaned, but old-layout dirs and locks, which do not say whose they are, and
// the down driver's dirs are kept; the dirs of a driver that is not known are kept
// too.
func TestPruneFilesBothLayouts(t *testing.T) {
	e := newEnv(t, reconcileRules+`
scope "docker:*" {
  driver = "down"
}
`)
	r, err := e.openWith([]string{"local", "down", "spare"},
		WithDriver("down", func() backend.TerminalBackend { return &downDriver{} }),
		WithDriver("spare", func() backend.TerminalBackend { return &hostDriver{} }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, live := run(t, r, "keep:1", "true")
	owner := mustOwner(t, r)
	// A listed, unrecorded sandbox that uses an old-layout dir (made before the
	// upgrade; within the grace period, so prune keeps it as it is).
	oldUser := plant(t, r, "keep:old-user", time.Now(), nil)
	state := e.stateDir
	p := func(parts ...string) string { return filepath.Join(append([]string{state}, parts...)...) }
	strayNew, strayOld := config.SandboxName(owner, "keep:stray-new"), config.SandboxName(owner, "keep:stray-old")
	mk := []string{
		p("sandboxes", "local", strayNew, "run"), // stray, current layout
		p("sandboxes", strayOld, "run"),          // stray, old layout
		p("sandboxes", oldUser, "run"),           // used by a listed sandbox
		p("sandboxes", "down", strayNew, "run"),  // the down driver's
		p("sandboxes", "ghost", strayNew, "run"), // a driver that is not known
		p("sandboxes", "spare"),                  // an empty driver dir (known, no sandboxes)
	}
	for _, d := range mk {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	files := []string{p("locks", strayNew+".local.busy"), p("locks", strayOld+".lock"), p("locks", strayOld+".busy")}
	for _, f := range files {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-DefaultOrphanGrace - time.Minute)
	filepath.WalkDir(state, func(path string, d os.DirEntry, err error) error {
		if err == nil {
			os.Chtimes(path, past, past)
		}
		return nil
	})
	exists := func(path string) bool { _, err := os.Lstat(path); return err == nil }
	kept := []string{p("sandboxes", "local", live.Sandbox), p("locks", live.Sandbox+".lock"), p("locks", live.Sandbox+".local.busy"),
		p("sandboxes", oldUser), p("sandboxes", "down", strayNew), p("sandboxes", "ghost", strayNew)}
	for _, k := range kept {
		if !exists(k) {
			t.Fatalf("setup: %s missing", k)
		}
	}

	// One driver down.
	rep := prune(t, r, false)
	gone := []string{p("sandboxes", "local", strayNew), p("locks", strayNew+".local.busy"), p("sandboxes", "spare")}
	for _, g := range gone {
		if exists(g) {
			t.Errorf("with another driver down: %s (the healthy driver's, or empty) is still there", g)
		}
	}
	for _, k := range append(kept, p("sandboxes", strayOld), p("locks", strayOld+".lock"), p("locks", strayOld+".busy")) {
		if !exists(k) {
			t.Errorf("with a driver down: prune deleted %s", k)
		}
	}
	ghostKept := slices.ContainsFunc(rep.Actions, func(a PruneAction) bool {
		return a.Path == p("sandboxes", "ghost") && a.Action == PruneKeep
	})
	if !ghostKept {
		t.Errorf("no keep action for the unknown driver's dirs: %+v", rep.Actions)
	}

	// The down driver out of the config: old-layout strays go too; what live
	// sandboxes use stays.
	e.writeConfig(reconcileRules)
	r2, err := e.openWith(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	rep = prune(t, r2, false)
	for _, g := range []string{p("sandboxes", strayOld), p("locks", strayOld+".lock"), p("locks", strayOld+".busy")} {
		if exists(g) {
			t.Errorf("%s (unreferenced, old layout) is still there: %+v", g, rep.Actions)
		}
	}
	for _, k := range append(kept[:4], p("sandboxes", "ghost", strayNew)) {
		if !exists(k) {
			t.Errorf("prune deleted %s", k)
		}
	}
	// "down" is no longer known: its dirs are kept like ghost's.
	if !exists(p("sandboxes", "down", strayNew)) {
		t.Error("prune deleted the dir of a driver that it could not list")
	}

	// When prune removes a sandbox that uses an old-layout dir, it deletes that dir
	// too, at once (it knows whose it was), however young the dir.
	orphan := plant(t, r2, "gone:1", time.Now().Add(-time.Hour), nil)
	if err := os.MkdirAll(p("sandboxes", orphan, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	rep = prune(t, r2, false)
	if a := actionFor(t, rep, orphan); a.Action != PruneRemove || !a.Done {
		t.Errorf("the orphan: %+v", a)
	}
	if exists(p("sandboxes", orphan)) {
		t.Errorf("the old-layout dir of the sandbox that prune removed is still there: %+v", rep.Actions)
	}
	if !exists(p("sandboxes", oldUser)) {
		t.Error("prune deleted the old-layout dir of a listed sandbox")
	}
}

// isSandboxName accepts exactly SandboxName's shape.
func TestIsSandboxName(t *testing.T) {
	if n := config.SandboxName("o", "s"); !isSandboxName(n) || !isSandboxName(config.SharedSandboxName("o", "p")) {
		t.Errorf("%s is not recognised", n)
	}
	for _, n := range []string{"local", "docker", "b-1234567-0123456789abcdef", "b-0123456g-0123456789abcdef", "b-01234567-0123456789abcdef0", "b-01234567_0123456789abcdef"} {
		if isSandboxName(n) {
			t.Errorf("%s is taken for a sandbox name", n)
		}
	}
}
