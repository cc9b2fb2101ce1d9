package cli

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

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
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
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	c, err := agent.NewClient(ctx, agent.DialSocketDir(sockDir), agent.WithTokenFrom(filepath.Join(filepath.Dir(sockDir), "agent")))
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
			if !testwait.For(context.Background(), 0, func() bool { return len(marked(mark)) == 0 }) {
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
