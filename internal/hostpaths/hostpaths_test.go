package hostpaths

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Check refuses a source that is, contains or lies inside a berth dir, as written or
// through links on either side, and says what allow_host_paths would grant; it accepts
// the source's siblings.
func TestCheckNamedDirs(t *testing.T) {
	base := t.TempDir()
	home := filepath.Join(base, "home")
	state := filepath.Join(home, ".local", "state", "berth")
	sock := filepath.Join(state, "sandboxes", "docker", "b-1", "run")
	os.MkdirAll(sock, 0o755)
	os.WriteFile(filepath.Join(sock, "agent.sock"), nil, 0o600)
	project := filepath.Join(home, "project")
	os.MkdirAll(project, 0o755)
	link := filepath.Join(base, "link-to-home")
	os.Symlink(home, link)
	stateLink := filepath.Join(base, "state-link")
	os.Symlink(state, stateLink)
	dirs := Known(stateLink) // the state dir named through a link: resolved too

	for _, c := range []struct{ src, rel string }{
		{home, "contains"},
		{link, "contains"}, // the source through a link
		{state, "is"},
		{filepath.Join(state, "sandboxes"), "lies inside"},
		{filepath.Join(sock, "agent.sock"), "lies inside"},
		{base, "contains"},
		{"/", "contains"},
	} {
		err := Check(c.src, dirs)
		if err == nil {
			t.Errorf("Check(%s): accepted, want refused (%s)", c.src, c.rel)
			continue
		}
		for _, words := range []string{"mount source " + c.src, " " + c.rel + " ", "agent socket of every sandbox", "on the host", "allow_host_paths = true"} {
			if !strings.Contains(err.Error(), words) {
				t.Errorf("Check(%s): %v\nwant it to say %q", c.src, err, words)
			}
		}
	}
	if err := Check(project, dirs); err != nil {
		t.Errorf("Check(%s), a sibling of the state dir's parent: %v", project, err)
	}
	// The state dir does not exist yet: a mount of its parent would expose it once
	// berth makes it.
	fresh := filepath.Join(base, "other", "state")
	if err := Check(filepath.Dir(fresh), Known(fresh)); err == nil || !strings.Contains(err.Error(), "contains berth's state dir "+fresh) {
		t.Errorf("Check of the parent of a state dir not made yet: %v", err)
	}
}

// The invoking user's and root's default state dirs are protected whatever the state
// dir in use, and so are the state dirs named by the environment.
func TestKnownDefaults(t *testing.T) {
	home := t.TempDir()
	xdg := t.TempDir()
	env := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_STATE_HOME", xdg)
	t.Setenv("BERTH_STATE_DIR", env)
	have := map[string]string{}
	for _, d := range Known("/srv/berth") {
		have[d.Path] = d.What
	}
	for _, p := range []string{"/srv/berth", filepath.Join(home, ".local/state/berth"), filepath.Join(xdg, "berth"), env, "/root/.local/state/berth"} {
		if have[p] == "" {
			t.Errorf("Known() lacks %s: %v", p, have)
		}
	}
	if err := Check(home, Known()); err == nil || !strings.Contains(err.Error(), "invoking user") {
		t.Errorf("Check($HOME): %v, want refused for the invoking user's default state dir", err)
	}
	if err := Check("/root", Known()); err == nil || !strings.Contains(err.Error(), "root") {
		t.Errorf("Check(/root): %v, want refused for root's default state dir", err)
	}
}

// A directory is recognised as a berth state dir by its marker file, or by an earlier
// version's store next to its lock dir; a mount that is one, lies inside one or holds
// one directly is refused even when nothing names it.
func TestCheckRecognisesStateDirs(t *testing.T) {
	base := t.TempDir()
	marked := filepath.Join(base, "srv", "berth")
	os.MkdirAll(filepath.Join(marked, "sandboxes", "local"), 0o700)
	if err := WriteMarker(marked); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarker(marked); err != nil {
		t.Errorf("WriteMarker on a marked dir: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(marked, MarkerFile)); err != nil || string(b) != MarkerContent {
		t.Errorf("marker: %q %v", b, err)
	}
	legacy := filepath.Join(base, "old")
	os.MkdirAll(filepath.Join(legacy, "locks"), 0o700)
	os.WriteFile(filepath.Join(legacy, "state.db"), nil, 0o600)
	notOne := filepath.Join(base, "notone")
	os.MkdirAll(filepath.Join(notOne, "locks"), 0o700) // a lock dir alone is no state dir

	for _, c := range []struct{ src, rel string }{
		{marked, "is"},
		{filepath.Join(marked, "sandboxes", "local"), "lies inside"},
		{filepath.Join(base, "srv"), "contains"},
		{legacy, "is"},
		{filepath.Join(legacy, "locks"), "lies inside"},
	} {
		err := Check(c.src, nil)
		if err == nil || !strings.Contains(err.Error(), " "+c.rel+" a berth state dir") {
			t.Errorf("Check(%s): %v, want refused: %s a berth state dir", c.src, err, c.rel)
		}
	}
	for _, src := range []string{notOne, filepath.Join(notOne, "locks")} {
		if err := Check(src, nil); err != nil {
			t.Errorf("Check(%s): %v, want accepted", src, err)
		}
	}
	if IsStateDir(notOne) || !IsStateDir(marked) || !IsStateDir(legacy) {
		t.Errorf("IsStateDir: notone %v marked %v legacy %v", IsStateDir(notOne), IsStateDir(marked), IsStateDir(legacy))
	}
}

// The temporary directory holds go-plugin's sockets: mounting it (or an ancestor) or
// a plugin*/berth-* entry of it is refused; its other entries are not.
func TestCheckPluginSocketDir(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("PLUGIN_UNIX_SOCKET_DIR", "")
	for _, d := range []string{"plugin-dir123", "plugin456", "berth-0", "work"} {
		os.Mkdir(filepath.Join(tmp, d), 0o700)
	}
	dirs := Known()
	for _, src := range []string{tmp, filepath.Dir(tmp), filepath.Join(tmp, "plugin-dir123"), filepath.Join(tmp, "plugin456"), filepath.Join(tmp, "berth-0")} {
		if err := Check(src, dirs); err == nil || !strings.Contains(err.Error(), "driver plugins") {
			t.Errorf("Check(%s): %v, want refused for the plugin sockets", src, err)
		}
	}
	if err := Check(filepath.Join(tmp, "work"), dirs); err != nil {
		t.Errorf("Check(%s): %v, want accepted", filepath.Join(tmp, "work"), err)
	}
	sockDir := filepath.Join(t.TempDir(), "socks")
	t.Setenv("PLUGIN_UNIX_SOCKET_DIR", sockDir)
	if err := Check(filepath.Join(sockDir, "x"), Known()); err == nil || !strings.Contains(err.Error(), "PLUGIN_UNIX_SOCKET_DIR") {
		t.Errorf("Check inside $PLUGIN_UNIX_SOCKET_DIR: %v", err)
	}
}
