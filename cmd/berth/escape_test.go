package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// A rule that mounts a directory holding the state dir (as mounting $HOME does with
// the default state dir) is reported by `config check` at the rule's file:line:col,
// and refused by exec before any sandbox is made; allow_host_paths = true turns the
// error into a warning that says what it grants.
func TestMountOfStateDirRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	parent := filepath.Dir(e.state)
	e.config = e.writeFile("config.hcl", fmt.Sprintf("scope \"*\" {\n  mount {\n    source = %q\n    target = \"/home\"\n    read_only = true\n  }\n}\n", parent))
	want := []string{e.config + ":1:1", "mount source " + parent + " contains berth's state dir " + e.state, "run commands in every one of those sandboxes", "allow_host_paths = true"}
	r := e.run("config", "check")
	for _, w := range want {
		if r.code != 125 || !strings.Contains(r.stderr, w) {
			t.Errorf("config check: want exit 125 saying %q\n%v", w, r)
		}
	}
	r = e.run("exec", "--", "true")
	for _, w := range want {
		if r.code != 125 || !strings.Contains(r.stderr, w) {
			t.Errorf("exec: want exit 125 saying %q\n%v", w, r)
		}
	}
	if rows := e.sessions(); len(rows) != 0 {
		t.Errorf("sessions after a refused exec: %+v", rows)
	}

	e.config = e.writeFile("allowed.hcl", fmt.Sprintf("scope \"*\" {\n  allow_host_paths = true\n  mount {\n    source = %q\n    target = \"/home\"\n  }\n}\n", parent))
	r = e.must("config", "check")
	if !strings.Contains(r.stderr, e.config+":1:1: warning:") || !strings.Contains(r.stderr, "allow_host_paths = true accepts this") {
		t.Errorf("config check with allow_host_paths: want a warning saying what it grants\n%v", r)
	}
}
