package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/agent"
	"github.com/berth-sh/berth/internal/testimage"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/registry/config"
)

// sandboxHostDirs lists, relative to the state dir, the per-sandbox host dirs under
// STATE/sandboxes (those holding an agent or run dir), whatever their layout.
func sandboxHostDirs(state string) []string {
	var out []string
	filepath.WalkDir(filepath.Join(state, "sandboxes"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || (d.Name() != "agent" && d.Name() != "run") {
			return nil
		}
		if rel, err := filepath.Rel(state, filepath.Dir(p)); err == nil && !slices.Contains(out, rel) {
			out = append(out, rel)
		}
		return fs.SkipDir
	})
	sort.Strings(out)
	return out
}

// filesUnder lists the non-directories under root (relative to it): what a removed
// sandbox must not leave behind.
func filesUnder(root string) []string {
	var out []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// askAgent runs argv in dir through the agent whose socket is in sockDir (as a
// driver does) and returns its stdout; an error when no agent answers there or the
// command fails.
func askAgent(sockDir, dir string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := agent.NewClient(ctx, agent.DialSocketDir(sockDir))
	if err != nil {
		return "", err
	}
	defer c.Close()
	var out, errb bytes.Buffer
	p, err := c.Exec(ctx, backend.ExecRequest{Argv: argv, Dir: dir, Stdout: &out, Stderr: &errb})
	if err != nil {
		return "", err
	}
	res, err := p.Wait()
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return out.String(), fmt.Errorf("%q: exit %d: %s", argv, res.ExitCode, errb.String())
	}
	return out.String(), nil
}

// driverChange is one change of the driver that a session's rule selects.
type driverChange struct {
	name     string
	from, to string
	// setup checks the runtimes, prepares the env and returns the config text that
	// goes before the scope rule (driver blocks, plugin_dirs); scope returns a rule's
	// body for a driver.
	setup func(t *testing.T, e *env) string
	scope func(driver string) string
}

func importImage(t *testing.T, e *env, drivers ...string) {
	t.Helper()
	archive, err := testimage.Archive()
	if err != nil {
		t.Fatal(err)
	}
	path := e.writeFile("busybox.tar", string(archive))
	for _, d := range drivers {
		e.must("image", "import", "--driver", d, path)
	}
}

var driverChanges = []driverChange{
	{
		name: "local-to-tlocal", from: "local", to: "tlocal",
		setup: func(t *testing.T, e *env) string {
			dir, _ := tlocalPlugin(t)
			return fmt.Sprintf("plugin_dirs = [%q]\n", dir)
		},
		scope: func(driver string) string { return fmt.Sprintf("driver = %q", driver) },
	},
	{
		name: "local-to-docker", from: "local", to: "docker",
		setup: func(t *testing.T, e *env) string {
			testimage.RequireEngine(t)
			importImage(t, e, "docker")
			return ""
		},
		scope: func(driver string) string {
			if driver == "local" {
				return `driver = "local"`
			}
			return fmt.Sprintf("driver = %q\n  image = %q", driver, testimage.Ref)
		},
	},
	{
		name: "docker-to-containerd", from: "docker", to: "containerd",
		setup: func(t *testing.T, e *env) string {
			testimage.RequireEngine(t)
			addr := testimage.RequireContainerd(t, testimage.ContainerdEnvs[0])
			block := fmt.Sprintf("driver \"containerd\" {\n  address   = %q\n  namespace = %q\n}\n", addr, containerdCLINamespace)
			e.config = e.writeFile("config.hcl", block)
			importImage(t, e, "docker", "containerd")
			return block
		},
		scope: func(driver string) string {
			return fmt.Sprintf("driver = %q\n  image = %q", driver, testimage.Ref)
		},
	},
}

// TestDriverChangeKeepsSandboxesApart: when the driver that a session's rule selects
// changes while the session's sandbox exists, the next exec creates a sandbox of the
// same name on the new driver with host files (agent dir, socket dir) of its own and
// says so on stderr. The old sandbox's agent keeps answering on its own socket, and its
// background processes keep running, until the old sandbox itself is removed: berth rm
// of the session (the new sandbox) leaves it alone, and prune removes it as an orphan.
// Then nothing of either sandbox is left in the state dir.
func TestDriverChangeKeepsSandboxesApart(t *testing.T) {
	for _, c := range driverChanges {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			head := c.setup(t, e)
			config := func(driver string) string {
				return fmt.Sprintf("%sscope \"s:*\" {\n  %s\n}\n", head, c.scope(driver))
			}
			e.config = e.writeFile("config.hcl", config(c.from))
			token, mark := randHex(8), newMark()
			r := e.must("exec", "-s", "s:1", "-e", markEnv(mark), "--", "sh", "-c",
				"echo "+token+" > mark && (sleep 600 >/dev/null 2>&1 &) && pwd")
			cwd := strings.TrimSpace(r.stdout)
			old, _ := findSession(e.sessions(), "s:1")
			if old.Driver != c.from || cwd == "" {
				t.Fatalf("first exec: session %+v, cwd %q, want driver %s\n%v", old, cwd, c.from, r)
			}
			dirs := sandboxHostDirs(e.state)
			if len(dirs) != 1 {
				t.Fatalf("host dirs after one sandbox: %v", dirs)
			}
			relOld := dirs[0]
			oldDir := filepath.Join(e.state, relOld)
			oldSock := filepath.Join(oldDir, "run")
			// Which sandbox answers on a socket: its files have the mark, and its agent
			// has its HOME (local and tlocal share the host's files, not their HOME).
			who := func() (string, error) { return askAgent(oldSock, cwd, "sh", "-c", `cat mark && echo "$HOME"`) }
			want, err := who()
			if err != nil || !strings.HasPrefix(want, token+"\n") {
				t.Fatalf("the %s sandbox's agent: %q, %v", c.from, want, err)
			}

			e.writeFile("config.hcl", config(c.to))
			r = e.must("exec", "-s", "s:1", "--", "sh", "-c", "cat mark 2>/dev/null || echo none")
			if strings.TrimSpace(r.stdout) != "none" {
				t.Errorf("exec after the driver change: want a new, empty sandbox\n%v", r)
			}
			if !strings.Contains(r.stderr, "berth: session s:1:") || !strings.Contains(r.stderr, c.from) || !strings.Contains(r.stderr, "prune") {
				t.Errorf("exec after the driver change: want a line on stderr saying that the %s sandbox is left for prune\n%v", c.from, r)
			}
			cur, _ := findSession(e.sessions(), "s:1")
			if cur.Driver != c.to {
				t.Fatalf("session after the change: %+v, want driver %s", cur, c.to)
			}
			if dirs := sandboxHostDirs(e.state); len(dirs) != 2 || !slices.Contains(dirs, relOld) {
				t.Errorf("host dirs of the %s and the %s sandbox: %v, want two", c.from, c.to, dirs)
			}
			if got, err := who(); err != nil || got != want {
				t.Errorf("after the %s sandbox was made: the old socket dir reaches %q, %v; want the %s sandbox's agent (%q)", c.to, got, err, c.from, want)
			}

			// rm removes the session's (new) sandbox; the old one keeps everything.
			e.must("rm", "s:1")
			if dirs := sandboxHostDirs(e.state); len(dirs) != 1 || filepath.Join(e.state, dirs[0]) != oldDir {
				t.Errorf("host dirs after rm: %v, want only the %s sandbox's %s", dirs, c.from, oldDir)
			}
			for _, p := range []string{filepath.Join(oldDir, "agent", backend.AgentBinaryName), filepath.Join(oldSock, backend.AgentSocketName)} {
				if _, err := os.Lstat(p); err != nil {
					t.Errorf("rm of the %s sandbox deleted the %s sandbox's %s: %v", c.to, c.from, p, err)
				}
			}
			if got, err := who(); err != nil || got != want {
				t.Errorf("after rm: the old socket dir reaches %q, %v; want the %s sandbox's agent (%q)", got, err, c.from, want)
			}
			if len(marked(mark)) == 0 {
				t.Errorf("after rm: the %s sandbox's background process is gone", c.from)
			}

			// prune removes the old one, which no rule maps to any more.
			rep := decodePrune(t, e.at("1h").must("prune", "--json"))
			removed := false
			for _, a := range rep.Actions {
				if a.Driver == c.from && a.Sandbox == old.Sandbox {
					removed = a.Action == "remove" && a.Cause == "orphan" && a.Done
				}
			}
			if !removed {
				t.Errorf("prune: want the %s sandbox %s removed as an orphan: %+v", c.from, old.Sandbox, rep.Actions)
			}
			if !waitFor(10*time.Second, func() bool { return len(marked(mark)) == 0 }) {
				t.Errorf("the %s sandbox's background process outlived prune:\n%s", c.from, describe(marked(mark)))
			}
			if left := filesUnder(filepath.Join(e.state, "sandboxes")); len(left) > 0 {
				t.Errorf("files left in STATE/sandboxes after both sandboxes were removed: %v", left)
			}
			for _, f := range filesUnder(filepath.Join(e.state, "locks")) {
				if strings.Contains(f, old.Sandbox) {
					t.Errorf("left in STATE/locks after both sandboxes were removed: %s", f)
				}
			}
		})
	}
}

// makeOldLayout creates, for each session, a sandbox as berth before the
// per-driver layout did: through a registry in this process whose agent files are
// prepared in STATE/sandboxes/SANDBOX (the old path; the registry itself is today's),
// with the old busy markers (STATE/locks/SANDBOX.busy), all dated an hour back. In each
// sandbox it writes the file mark holding the session's token and leaves a background
// process with the session's marker. It returns the sandboxes' cwds.
func makeOldLayout(t *testing.T, e *env, tokens, marks map[string]string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := agent.Install(e.state, berthBin)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(e.config)
	if err != nil {
		t.Fatal(err)
	}
	r, err := registry.Open(ctx, cfg, registry.WithStateDir(e.state), registry.WithBerthBinary(berthBin),
		registry.WithAgentPreparer(func(dir string) (backend.AgentFiles, error) {
			return agent.PrepareSandbox(filepath.Join(e.state, "sandboxes", filepath.Base(dir)), bin)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cwds := map[string]string{}
	for s, token := range tokens {
		var out bytes.Buffer
		p, _, err := r.Exec(ctx, s, backend.ExecRequest{Argv: []string{"sh", "-c", "echo " + token + " > mark && (sleep 600 >/dev/null 2>&1 &) && pwd"},
			Env: []string{markEnv(marks[s])}, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec in %s: %+v %v", s, res, err)
		}
		cwds[s] = strings.TrimSpace(out.String())
	}
	// What today's registry made that the old one did not: the empty driver dirs
	// (the agent files went elsewhere) and the per-driver busy markers.
	ents, _ := os.ReadDir(filepath.Join(e.state, "sandboxes"))
	past := time.Now().Add(-time.Hour)
	for _, d := range ents {
		p := filepath.Join(e.state, "sandboxes", d.Name())
		if !strings.HasPrefix(d.Name(), "b-") {
			if err := os.Remove(p); err != nil {
				t.Fatalf("the old-layout registry made files in %s: %v", p, err)
			}
			continue
		}
		os.Chtimes(p, past, past)
	}
	busy, _ := filepath.Glob(filepath.Join(e.state, "locks", "*.*.busy"))
	for _, p := range busy {
		name, _, _ := strings.Cut(filepath.Base(p), ".")
		if err := os.Rename(p, filepath.Join(e.state, "locks", name+".busy")); err != nil {
			t.Fatal(err)
		}
	}
	locks, _ := os.ReadDir(filepath.Join(e.state, "locks"))
	for _, l := range locks {
		os.Chtimes(filepath.Join(e.state, "locks", l.Name()), past, past)
	}
	return cwds
}

// TestOldLayoutSandboxes: sandboxes made before the per-driver layout, with their
// host dirs at STATE/sandboxes/SANDBOX, keep working after the upgrade: exec reaches
// them (after a stop too) without new dirs being made for them; prune keeps the old
// dirs that they use; rm deletes a removed one's old dir. When the session's rule then
// moves to another driver, the new sandbox gets a per-driver dir while the old one
// keeps its dir and agent through rm of the session, and prune (which finds the old
// driver although nothing names it any more) removes the old sandbox and its old dir.
// Then nothing is left.
func TestOldLayoutSandboxes(t *testing.T) {
	for _, c := range driverChanges {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			head := c.setup(t, e)
			config := func(driver string) string {
				return fmt.Sprintf("%sscope \"s:*\" {\n  %s\n  retention {\n    on_close = \"stop\"\n  }\n}\n", head, c.scope(driver))
			}
			e.config = e.writeFile("config.hcl", config(c.from))
			tokens := map[string]string{"s:1": randHex(8), "s:2": randHex(8)}
			marks := map[string]string{"s:1": newMark(), "s:2": newMark()}
			cwds := makeOldLayout(t, e, tokens, marks)
			rows := e.sessions()
			sb1, _ := findSession(rows, "s:1")
			sb2, _ := findSession(rows, "s:2")
			old1 := filepath.Join(e.state, "sandboxes", sb1.Sandbox)
			old2 := filepath.Join(e.state, "sandboxes", sb2.Sandbox)
			if got := sandboxHostDirs(e.state); !slices.Equal(got, []string{"sandboxes/" + sb1.Sandbox, "sandboxes/" + sb2.Sandbox}) &&
				!slices.Equal(got, []string{"sandboxes/" + sb2.Sandbox, "sandboxes/" + sb1.Sandbox}) {
				t.Fatalf("old-layout host dirs: %v", got)
			}
			who := func() (string, error) {
				return askAgent(filepath.Join(old1, "run"), cwds["s:1"], "sh", "-c", `cat mark && echo "$HOME"`)
			}
			want, err := who()
			if err != nil || !strings.HasPrefix(want, tokens["s:1"]+"\n") {
				t.Fatalf("the old sandbox's agent: %q, %v", want, err)
			}
			onlyOld := func(when string, dirs ...string) {
				t.Helper()
				var want []string
				for _, d := range dirs {
					rel, _ := filepath.Rel(e.state, d)
					want = append(want, rel)
				}
				sort.Strings(want)
				if got := sandboxHostDirs(e.state); !slices.Equal(got, want) {
					t.Errorf("%s: host dirs %v, want %v", when, got, want)
				}
			}

			// Exec, stop and exec again: the same sandbox, in its old dir.
			r := e.must("exec", "-s", "s:1", "--", "cat", "mark")
			if strings.TrimSpace(r.stdout) != tokens["s:1"] || r.stderr != "" {
				t.Errorf("exec in an old-layout sandbox\n%v", r)
			}
			e.must("close", "s:1")
			if row, _ := findSession(e.sessions(), "s:1"); row.State != "stopped" {
				t.Errorf("after close: %+v", row)
			}
			if len(marked(marks["s:1"])) > 0 {
				t.Errorf("the background process of a stopped sandbox still runs")
			}
			r = e.must("exec", "-s", "s:1", "-e", markEnv(marks["s:1"]), "--", "sh", "-c", "(sleep 600 >/dev/null 2>&1 &) && cat mark")
			if strings.TrimSpace(r.stdout) != tokens["s:1"] || r.stderr != "" {
				t.Errorf("exec in a stopped old-layout sandbox\n%v", r)
			}
			onlyOld("after exec, stop and exec", old1, old2)
			if got, err := who(); err != nil || !strings.HasPrefix(got, tokens["s:1"]+"\n") {
				t.Errorf("the restarted old sandbox's agent on its old socket: %q, %v", got, err)
			} else {
				want = got
			}

			// Prune keeps the old dirs that live sandboxes use, however old they are.
			rep := decodePrune(t, e.at("1h").must("prune", "--json"))
			for _, a := range rep.Actions {
				if a.Action != "keep" {
					t.Errorf("prune with two live old-layout sandboxes: %+v", a)
				}
			}
			onlyOld("after prune", old1, old2)

			// rm of one deletes its old dir, and leaves the other's.
			e.must("rm", "s:2")
			onlyOld("after rm s:2", old1)
			if !waitFor(10*time.Second, func() bool { return len(marked(marks["s:2"])) == 0 }) {
				t.Errorf("s:2's background process outlived rm")
			}

			// The rule moves to another driver.
			e.writeFile("config.hcl", config(c.to))
			r = e.must("exec", "-s", "s:1", "--", "sh", "-c", "cat mark 2>/dev/null || echo none")
			if strings.TrimSpace(r.stdout) != "none" || !strings.Contains(r.stderr, "berth prune") {
				t.Errorf("exec after the driver change: want a new, empty sandbox and a note on stderr\n%v", r)
			}
			newDir := filepath.Join(e.state, "sandboxes", c.to, sb1.Sandbox)
			onlyOld("after the move", old1, newDir)
			if got, err := who(); err != nil || got != want {
				t.Errorf("after the move: the old socket reaches %q, %v; want the old sandbox's agent (%q)", got, err, want)
			}
			e.must("rm", "s:1")
			onlyOld("after rm s:1 (the new sandbox)", old1)
			if got, err := who(); err != nil || got != want {
				t.Errorf("after rm of the new sandbox: the old socket reaches %q, %v; want the old sandbox's agent (%q)", got, err, want)
			}
			if len(marked(marks["s:1"])) == 0 {
				t.Errorf("after rm of the new sandbox: the old sandbox's background process is gone")
			}
			rep = decodePrune(t, e.at("1h").must("prune", "--json"))
			removed := false
			for _, a := range rep.Actions {
				removed = removed || a.Driver == c.from && a.Sandbox == sb1.Sandbox && a.Action == "remove" && a.Cause == "orphan" && a.Done
			}
			if !removed {
				t.Errorf("prune: want the old %s sandbox removed as an orphan: %+v", c.from, rep)
			}
			if !waitFor(10*time.Second, func() bool { return len(marked(marks["s:1"])) == 0 }) {
				t.Errorf("the old sandbox's background process outlived prune")
			}
			if left := filesUnder(filepath.Join(e.state, "sandboxes")); len(left) > 0 {
				t.Errorf("files left in STATE/sandboxes after every sandbox was removed: %v", left)
			}
			for _, f := range filesUnder(filepath.Join(e.state, "locks")) {
				if strings.Contains(f, sb1.Sandbox) || strings.Contains(f, sb2.Sandbox) {
					t.Errorf("left in STATE/locks after every sandbox was removed: %s", f)
				}
			}
		})
	}
}

// TestDriverChangeBack: when the rule maps a session back to a driver that still has
// its earlier sandbox, the next exec adopts that sandbox (files kept) and says, on
// stderr or as moved/moved_reason in --json, that the sandbox it leaves keeps running
// until prune; prune then removes that one.
func TestDriverChangeBack(t *testing.T) {
	t.Parallel()
	c := driverChanges[0] // local <-> tlocal: no daemon needed
	e := newEnv(t)
	head := c.setup(t, e)
	config := func(driver string) string {
		return fmt.Sprintf("%sscope \"s:*\" {\n  %s\n}\n", head, c.scope(driver))
	}
	e.config = e.writeFile("config.hcl", config(c.from))
	e.must("exec", "-s", "s:1", "--", "sh", "-c", "echo kept > back-mark")
	e.writeFile("config.hcl", config(c.to))
	e.must("exec", "-s", "s:1", "--", "true")
	e.writeFile("config.hcl", config(c.from))
	r := e.must("exec", "-s", "s:1", "--", "cat", "back-mark")
	if r.stdout != "kept\n" || !strings.Contains(r.stderr, "back in its earlier sandbox") || !strings.Contains(r.stderr, "on driver "+c.to+") keeps its files and processes until berth prune") {
		t.Errorf("exec after moving back: want the earlier sandbox's file and a line naming the %s sandbox left for prune\n%v", c.to, r)
	}
	var out struct {
		Moved       bool   `json:"moved"`
		MovedReason string `json:"moved_reason"`
		Recreated   bool   `json:"recreated"`
	}
	e.writeFile("config.hcl", config(c.to))
	e.must("exec", "-s", "s:1", "--", "true")
	e.writeFile("config.hcl", config(c.from))
	decodeOne(t, e.must("exec", "-s", "s:1", "--json", "--", "true"), &out)
	if !out.Moved || out.Recreated || !strings.Contains(out.MovedReason, "back in its earlier sandbox") {
		t.Errorf("exec --json after moving back: %+v, want moved with its reason, not recreated", out)
	}
	rep := decodePrune(t, e.at("1h").must("prune", "--json"))
	removed := false
	for _, a := range rep.Actions {
		removed = removed || a.Driver == c.to && a.Action == "remove" && a.Done
	}
	if !removed {
		t.Errorf("prune: want the %s sandbox removed: %+v", c.to, rep.Actions)
	}
}
