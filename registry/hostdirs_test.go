package registry

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
)

// Prune's file phase: files nothing references go once old enough (a stray
// per-driver dir and busy marker, a stray name lock, a stray last-use file, an empty
// driver dir); the files of live sandboxes stay whatever their age. While one driver
// is down, the other drivers' files are still cleaned, but name locks, which do not
// say whose they are, and the down driver's dirs are kept; the dirs of a driver that
// is not known are kept too.
func TestPruneFiles(t *testing.T) {
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
	state := e.stateDir
	p := func(parts ...string) string { return filepath.Join(append([]string{state}, parts...)...) }
	stray, strayLock := config.SandboxName(owner, "keep:stray"), config.SandboxName(owner, "keep:stray-lock")
	for _, d := range []string{
		p("sandboxes", "local", stray, "run"), // stray
		p("sandboxes", "down", stray, "run"),  // the down driver's
		p("sandboxes", "ghost", stray, "run"), // a driver that is not known
		p("sandboxes", "spare"),               // an empty driver dir (known, no sandboxes)
		p("lastuse"),
	} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	strayUse := p("lastuse", "00112233445566778899aabbccddeeff")
	for _, f := range []string{p("locks", stray+".local.busy"), p("locks", strayLock+".lock"), strayUse} {
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
		r.store.lastUsePath("keep:1"), p("sandboxes", "down", stray), p("sandboxes", "ghost", stray)}
	for _, k := range kept {
		if !exists(k) {
			t.Fatalf("setup: %s missing", k)
		}
	}

	// One driver down.
	rep := prune(t, r, false)
	for _, g := range []string{p("sandboxes", "local", stray), p("locks", stray+".local.busy"), p("sandboxes", "spare"), strayUse} {
		if exists(g) {
			t.Errorf("with another driver down: %s (the healthy driver's, or empty) is still there", g)
		}
	}
	for _, k := range append(kept, p("locks", strayLock+".lock")) {
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

	// The down driver out of the config: the stray name lock goes too; what live
	// sandboxes use stays.
	e.writeConfig(reconcileRules)
	r2, err := e.openWith(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	rep = prune(t, r2, false)
	if exists(p("locks", strayLock+".lock")) {
		t.Errorf("the stray name lock is still there: %+v", rep.Actions)
	}
	for _, k := range append(kept[:4], p("sandboxes", "ghost", stray)) {
		if !exists(k) {
			t.Errorf("prune deleted %s", k)
		}
	}
	// "down" is no longer known: its dirs are kept like ghost's.
	if !exists(p("sandboxes", "down", stray)) {
		t.Error("prune deleted the dir of a driver that it could not list")
	}
}
