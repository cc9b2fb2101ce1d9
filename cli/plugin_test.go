package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/server/apiv1"
)

var (
	tlocalOnce sync.Once
	tlocalPath string
	tlocalErr  error
)

// tlocalPlugin builds testdata/tlocal (a third-party driver plugin wrapping local)
// once and returns a copy of it named berth-driver-tlocal in a fresh directory.
func tlocalPlugin(t *testing.T) (dir, path string) {
	t.Helper()
	return testPlugin(t, "tlocal")
}

// testPlugin is tlocalPlugin for the driver name (tlocal, or tdial: see
// testdata/tlocal).
func testPlugin(t *testing.T, name string) (dir, path string) {
	t.Helper()
	tlocalOnce.Do(func() {
		out := filepath.Join(filepath.Dir(berthBin), "tlocal-build")
		cmd := exec.Command("go", "build", "-o", out, "./cli/testdata/tlocal")
		cmd.Dir = testbin.ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			tlocalErr = err
			t.Logf("%s", b)
			return
		}
		tlocalPath = out
	})
	if tlocalErr != nil {
		t.Fatalf("building testdata/tlocal: %v", tlocalErr)
	}
	dir = t.TempDir()
	path = filepath.Join(dir, "berth-driver-"+name)
	b, err := os.ReadFile(tlocalPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, path
}

// A scope rule whose driver is a berth-driver-NAME in plugin_dirs runs execs through
// that plugin; berth drivers lists it with its negotiated protocol and path.
func TestPluginDiscoveredExec(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir, path := tlocalPlugin(t)
	e.config = e.writeFile("config.hcl", `plugin_dirs = ["`+dir+`"]
scope "t:*" {
  driver = "tlocal"
}
scope "*" {
  driver = "local"
}
`)
	r := e.must("exec", "-s", "t:1", "--", "sh", "-c", "echo via plugin; echo $HOME")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || lines[0] != "via plugin" || !strings.Contains(lines[1], filepath.Join("drivers", "tlocal")) {
		t.Errorf("exec through the tlocal plugin: want its output and a HOME under the tlocal driver's state dir\n%v", r)
	}
	if row, ok := findSession(e.sessions(), "t:1"); !ok || row.Driver != "tlocal" {
		t.Errorf("session t:1: %+v, want driver tlocal", row)
	}

	var list []apiv1.Driver
	decodeOne(t, e.must("drivers", "--json"), &list)
	i := slices.IndexFunc(list, func(d apiv1.Driver) bool { return d.Name == "tlocal" })
	if i < 0 || list[i].Protocol != 2 || list[i].Health != "ok" || list[i].Version != "0.0.1-test" || list[i].Path != path {
		t.Errorf("drivers --json: want tlocal at protocol 2 from %s: %+v", path, list)
	}
	r = e.must("drivers")
	if !strings.Contains(r.stdout, "tlocal") || !strings.Contains(r.stdout, path) {
		t.Errorf("drivers: want a tlocal row naming %s\n%v", path, r)
	}
}

// $BERTH_PLUGIN_PATH is searched before plugin_dirs; a matching sha256 pin starts it.
func TestPluginPathEnvAndPin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir, path := tlocalPlugin(t)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	// plugin_dirs holds a broken berth-driver-tlocal: the one in $BERTH_PLUGIN_PATH wins.
	shadow := t.TempDir()
	if err := os.WriteFile(filepath.Join(shadow, "berth-driver-tlocal"), []byte("#!/bin/sh\nexit 9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.config = e.writeFile("config.hcl", `plugin_dirs = ["`+shadow+`"]
driver "tlocal" {
  sha256 = "`+hex.EncodeToString(sum[:])+`"
  start_timeout = "20s"
}
scope "*" {
  driver = "tlocal"
}
`)
	cmd := e.command("exec", "-s", "p:1", "--", "echo", "pinned")
	cmd.Env = append(cmd.Env, "BERTH_PLUGIN_PATH="+dir)
	out, err := cmd.Output()
	if err != nil || string(out) != "pinned\n" {
		t.Errorf("exec with the plugin from $BERTH_PLUGIN_PATH: %q %v", out, err)
	}
	// The pinned file's sum is cached, so the next start does not hash it again.
	if ents, err := os.ReadDir(filepath.Join(e.state, "plugin-sums")); err != nil || len(ents) != 1 {
		t.Errorf("STATE/plugin-sums: %v %v, want one cached sum", ents, err)
	}
	// cleanup's berth calls (sessions, rm) run without $BERTH_PLUGIN_PATH: point
	// plugin_dirs at the real plugin for them.
	e.writeFile("config.hcl", "plugin_dirs = [\""+dir+"\"]\nscope \"*\" {\n  driver = \"tlocal\"\n}\n")
}

// Broken berth-driver-* files: each gives one clear error naming the file and the fix,
// exit 125, and leaves no process behind.
func TestPluginBadInput(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, script string
		mode         os.FileMode
		extra        string // more lines of the driver block
		want         []string
	}{
		{"not-executable", "#!/bin/sh\nexit 0\n", 0o644, "", []string{"not executable", "chmod +x"}},
		{"garbage-on-stdout", "#!/bin/sh\necho hello from a shell script\nexec sleep 300\n", 0o755, "", []string{"hello from a shell script", "never write to stdout"}},
		{"exits-at-once", "#!/bin/sh\necho missing libfrob >&2\nexit 3\n", 0o755, "", []string{"exited before the plugin handshake", "exit status 3", "missing libfrob"}},
		{"hangs", "#!/bin/sh\nsleep 300 &\nwait\n", 0o755, "  start_timeout = \"700ms\"\n", []string{"did not complete the plugin handshake within 700ms", "backends.Serve"}},
		{"checksum-mismatch", "#!/bin/sh\ntouch \"$0.ran\"\nexec sleep 300\n", 0o755, "  sha256 = \"" + strings.Repeat("0", 64) + "\"\n", []string{"sha256 mismatch", strings.Repeat("0", 64), "set sha256 ="}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			path := filepath.Join(t.TempDir(), "berth-driver-bad")
			if err := os.WriteFile(path, []byte(c.script), c.mode); err != nil {
				t.Fatal(err)
			}
			e.config = e.writeFile("config.hcl", "driver \"bad\" {\n  plugin = \""+path+"\"\n"+c.extra+"}\nscope \"*\" {\n  driver = \"bad\"\n}\n")
			r := e.run("exec", "-s", "x", "--", "true")
			if r.code != 125 {
				t.Errorf("want exit 125\n%v", r)
			}
			msg := strings.TrimSpace(r.stderr)
			if strings.Count(msg, "\n") > 0 {
				t.Errorf("want one line of error\n%v", r)
			}
			for _, w := range append([]string{path}, c.want...) {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q\n%v", w, r)
				}
			}
			if c.name == "checksum-mismatch" {
				if _, err := os.Stat(path + ".ran"); err == nil {
					t.Error("the plugin ran although its checksum did not match")
				}
				sum := sha256.Sum256([]byte(c.script))
				if !strings.Contains(msg, hex.EncodeToString(sum[:])) {
					t.Errorf("error does not show the file's sum %x\n%v", sum, r)
				}
			}
			// No process that berth started for the plugin (they carry the state dir
			// in their environment) is left.
			if left := procsOf(e.state); len(left) > 0 {
				t.Errorf("processes left behind: %s", describe(left))
			}
			e.config = ""
		})
	}
}

// berth conformance --plugin PATH tests an executable that is not installed: its name
// comes from describe; bad plugins are refused before the run with exit 125.
func TestConformancePlugin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, path := tlocalPlugin(t)
	junit := filepath.Join(e.dir, "report.xml")
	r := e.run("conformance", "--plugin", path, "--run", "^exec/exit-code|^isolation/sessions-isolated", "--json", "--junit", junit)
	if r.code != 0 {
		t.Fatalf("want exit 0\n%v", r)
	}
	var rep struct {
		Driver string `json:"driver"`
		Passed int    `json:"passed"`
		Failed int    `json:"failed"`
	}
	decodeOne(t, r, &rep)
	if rep.Driver != "tlocal" || rep.Passed != 4 || rep.Failed != 0 {
		t.Errorf("report: %+v, want tlocal with 4 passed (3 exit-code cases and the registry case through the plugin)", rep)
	}
	if b, err := os.ReadFile(junit); err != nil || !strings.Contains(string(b), `<testsuites`) {
		t.Errorf("--junit: %v %.200s", err, b)
	}

	notDriver := filepath.Join(e.dir, "berth-driver-notone")
	if err := os.WriteFile(notDriver, []byte("#!/bin/sh\necho I am a shell script\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r = e.run("conformance", "--plugin", notDriver)
	if r.code != 125 || !strings.Contains(r.stderr, notDriver) || !strings.Contains(r.stderr, "describe") {
		t.Errorf("--plugin that is no driver: want 125 naming the file and describe\n%v", r)
	}
	r = e.run("conformance", "--plugin", path, "--driver", "other")
	if r.code != 125 || !strings.Contains(r.stderr, `serves driver "tlocal"`) {
		t.Errorf("--plugin and --driver disagreeing: want 125\n%v", r)
	}
}

// A config that names a plugin found only through the daemon's $BERTH_PLUGIN_PATH
// fails this command's own check ("Unknown driver") though its bytes are the ones the
// daemon took: commands go through the daemon without a note (the daemon's check
// counts, as in the front); --no-daemon still fails on it.
func TestDaemonPluginOfItsEnvironment(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir, _ := tlocalPlugin(t)
	e.config = e.writeFile("config.hcl", "scope \"*\" {\n  driver = \"tlocal\"\n}\n")
	e.extra = []string{"BERTH_PLUGIN_PATH=" + dir}
	e.serve()
	e.extra = nil
	for _, args := range [][]string{{"status"}, {"sessions"}} {
		if r := e.run(args...); r.code != 0 || strings.Contains(r.stderr, "does not parse now") {
			t.Errorf("berth %q beside a daemon that found the plugin: want exit 0 and no note\n%v", args, r)
		}
	}
	if r := e.run("--no-daemon", "sessions"); r.code != 125 || !strings.Contains(r.stderr, `driver "tlocal" is not known`) {
		t.Errorf("--no-daemon without the plugin: want exit 125, Unknown driver\n%v", r)
	}
	e.extra = []string{"BERTH_PLUGIN_PATH=" + dir} // for the cleanup's commands
}
