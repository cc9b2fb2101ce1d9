package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// pruneReport is `berth prune --json`.
type pruneReport struct {
	Owner   string `json:"owner"`
	DryRun  bool   `json:"dry_run"`
	Drivers []struct {
		Name      string `json:"name"`
		Sandboxes int    `json:"sandboxes"`
		Error     string `json:"error"`
	} `json:"drivers"`
	Actions []struct {
		Driver    string    `json:"driver"`
		Sandbox   string    `json:"sandbox"`
		Sessions  []string  `json:"sessions"`
		Path      string    `json:"path"`
		Action    string    `json:"action"`
		Cause     string    `json:"cause"`
		Reason    string    `json:"reason"`
		IdleSince time.Time `json:"idle_since"`
		Done      bool      `json:"done"`
		Error     string    `json:"error"`
	} `json:"actions"`
}

func decodePrune(t *testing.T, r result) pruneReport {
	t.Helper()
	var rep pruneReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("prune --json: %v\n%v", err, r)
	}
	return rep
}

// at returns the env with berth's clock moved by offset (BERTH_CLOCK_OFFSET).
func (e *env) at(offset string) *env {
	c := *e
	c.extra = append(append([]string(nil), e.extra...), "BERTH_CLOCK_OFFSET="+offset)
	return &c
}

const pruneConfig = `
scope "tmp:*" {
  retention {
    idle_ttl    = "1h"
    idle_action = "remove"
  }
}
scope "*" {
}
`

// Done when: `berth prune --dry-run --json` lists what it would do with the reason
// for each; prune then does it; the next exec says the sandbox is new, on stderr or
// in --json.
func TestPrune(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", pruneConfig)
	e.must("exec", "-s", "tmp:1", "--", "sh", "-c", "echo data > file")
	e.must("exec", "-s", "main", "--", "true")
	rows := e.sessions()
	tmp, _ := findSession(rows, "tmp:1")

	// Within the TTL: nothing to do.
	rep := decodePrune(t, e.at("30m").must("prune", "--dry-run", "--json"))
	if !rep.DryRun || len(rep.Drivers) != 1 || rep.Drivers[0].Name != "local" || rep.Drivers[0].Sandboxes != 2 {
		t.Errorf("dry run report: %+v", rep)
	}
	for _, a := range rep.Actions {
		if a.Action != "keep" {
			t.Errorf("30 minutes after use (idle_ttl 1h): %+v", a)
		}
	}

	later := e.at("2h")
	r := later.must("prune", "--dry-run", "--json")
	rep = decodePrune(t, r)
	found := false
	for _, a := range rep.Actions {
		if a.Sandbox == tmp.Sandbox {
			found = true
			if a.Action != "remove" || a.Cause != "idle" || a.Done || !strings.Contains(a.Reason, "idle since") || a.IdleSince.IsZero() {
				t.Errorf("dry run, idle sandbox: %+v", a)
			}
		} else if a.Sandbox != "" && a.Action != "keep" {
			t.Errorf("dry run, main (no idle_ttl): %+v", a)
		}
	}
	if !found {
		t.Fatalf("the dry run does not mention %s\n%v", tmp.Sandbox, r)
	}
	if row, _ := findSession(e.sessions(), "tmp:1"); row.State != "running" {
		t.Fatalf("a dry run changed the sandbox: %+v", row)
	}
	text := later.must("prune", "--dry-run")
	if !strings.Contains(text.stdout, "WOULD ACTION") || !strings.Contains(text.stdout, "remove") || !strings.Contains(text.stdout, "idle since") {
		t.Errorf("dry run text output:\n%v", text)
	}

	rep = decodePrune(t, later.must("prune", "--json"))
	for _, a := range rep.Actions {
		if a.Sandbox == tmp.Sandbox && (a.Action != "remove" || !a.Done) {
			t.Errorf("prune: %+v", a)
		}
	}
	if row, _ := findSession(e.sessions(), "tmp:1"); row.State != "removed" {
		t.Errorf("sessions after prune: %+v, want state removed", row)
	}
	// The next exec gets a new sandbox and says so on stderr; its output is clean.
	r = later.must("exec", "-s", "tmp:1", "--", "sh", "-c", "cat file 2>/dev/null || echo none")
	if r.stdout != "none\n" || !strings.Contains(r.stderr, "berth: session tmp:1: its previous sandbox was removed by retention: idle since") ||
		strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("exec after the idle removal: want \"none\" and one line on stderr\n%v", r)
	}
	// --json says recreated: true (and only the first time).
	e.must("exec", "-s", "tmp:1", "--", "true")
	later.must("prune", "--json")
	var out struct {
		Recreated       bool   `json:"recreated"`
		RecreatedReason string `json:"recreated_reason"`
	}
	r = later.must("exec", "--json", "-s", "tmp:1", "--", "true")
	decodeOne(t, r, &out)
	if !out.Recreated || !strings.Contains(out.RecreatedReason, "idle since") || r.stderr != "" {
		t.Errorf("exec --json after the idle removal: %+v\n%v", out, r)
	}
	// The exec 2h ahead recorded its use at the real time, not 2h ahead: seen from
	// the real clock the sandbox was just used, so the next exec finds it as it is.
	out.Recreated = false
	r = e.must("exec", "--json", "-s", "tmp:1", "--", "true")
	decodeOne(t, r, &out)
	if out.Recreated {
		t.Errorf("the second exec says recreated too\n%v", r)
	}

	if r := e.at("soon").run("prune"); r.code != 125 || !strings.Contains(r.stderr, "BERTH_CLOCK_OFFSET") {
		t.Errorf("bad BERTH_CLOCK_OFFSET: want 125 naming it\n%v", r)
	}
	if r := e.run("prune", "--watch", "0s"); r.code != 125 || !strings.Contains(r.stderr, "--watch") {
		t.Errorf("--watch 0s: want 125 naming the flag\n%v", r)
	}
	if r := e.run("prune", "--owner", "not an id"); r.code != 125 || !strings.Contains(r.stderr, `"not an id"`) {
		t.Errorf("bad --owner: want 125 naming it\n%v", r)
	}
}

// A driver whose runtime is down is reported and skipped; the rest are reconciled,
// and prune exits 1.
func TestPruneDriverDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", `
driver "docker" {
  host = "unix:///nonexistent/docker.sock"
}
scope "box:*" {
  driver = "docker"
  image  = "busybox"
}
scope "*" {
}
`)
	e.must("exec", "--", "true")
	r := e.run("prune", "--json")
	if r.code != 1 {
		t.Errorf("prune with a driver down: want exit 1\n%v", r)
	}
	rep := decodePrune(t, r)
	if len(rep.Drivers) != 2 || rep.Drivers[0].Name != "docker" || rep.Drivers[0].Error == "" ||
		rep.Drivers[1].Name != "local" || rep.Drivers[1].Error != "" || rep.Drivers[1].Sandboxes != 1 {
		t.Errorf("drivers: %+v\n%v", rep.Drivers, r)
	}
	text := e.run("prune")
	if text.code != 1 || !strings.Contains(text.stdout, "driver docker skipped:") {
		t.Errorf("text output with a driver down:\n%v", text)
	}
}

// --watch prunes every interval with one registry, and its plugin, until SIGINT,
// then exits 0; a plugin killed meanwhile is started again for the next round.
func TestPruneWatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--", "true")
	p := e.start("prune", "--watch", "100ms", "--json")
	// next reads one report and its line.
	next := func() (pruneReport, string) {
		t.Helper()
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("prune --watch ended early; stderr %q", p.stderr.String())
			}
			var rep pruneReport
			if err := json.Unmarshal([]byte(l), &rep); err != nil {
				t.Fatalf("prune --watch --json line %q: %v", l, err)
			}
			return rep, l
		case <-time.After(testwait.Limit):
			t.Fatalf("prune --watch printed no report for %v; stderr %q", testwait.Limit, p.stderr.String())
		}
		return pruneReport{}, ""
	}
	plugins := func() []int {
		return pids(liveProcs(func(pi procInfo) bool {
			return pi.ppid == p.cmd.Process.Pid && slices.Contains(pi.cmdline, "serve")
		}))
	}
	first, _ := next()
	var plugin []int
	for range 3 {
		if rep, _ := next(); rep.Owner == "" || rep.Owner != first.Owner || len(rep.Drivers) != 1 || rep.Drivers[0].Error != "" {
			t.Errorf("round report %+v, first %+v", rep, first)
		}
		now := plugins()
		if len(now) != 1 || (plugin != nil && now[0] != plugin[0]) {
			t.Errorf("plugin processes %v, then %v: want one, kept across rounds", plugin, now)
		}
		plugin = now
	}
	if len(plugin) == 1 {
		syscall.Kill(plugin[0], syscall.SIGKILL)
		// Rounds may fail while the plugin is gone; a later one works again, with a
		// new plugin. However many rounds that takes on a loaded machine: the only
		// clock is the safety net, and the rounds seen are in the failure message.
		deadline := time.Now().Add(testwait.Limit)
		var seen []string
		for {
			rep, line := next()
			seen = append(seen, line)
			now := plugins()
			if len(rep.Drivers) == 1 && rep.Drivers[0].Error == "" && rep.Drivers[0].Sandboxes == 1 && len(now) == 1 && now[0] != plugin[0] {
				t.Logf("a good round with a new plugin (pid %d) after %d rounds", now[0], len(seen))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after its plugin (pid %d) was killed, prune --watch had no good round with a new plugin within %v; plugins now %v; rounds:\n%s\nstderr %q",
					plugin[0], testwait.Limit, now, strings.Join(seen, "\n"), p.stderr.String())
			}
		}
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	if code := p.finish(t); code != 0 {
		t.Errorf("prune --watch after SIGINT: exit %d, want 0; stderr %q", code, p.stderr.String())
	}
}

// `berth conformance --restart-hook CMD` runs recovery/runtime-restart with CMD as
// the restart; without it the case is skipped saying why. The retention and
// recovery groups run from the CLI too.
func TestConformanceRetentionAndRestartHook(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	marker := filepath.Join(e.dir, "restarted")
	type report struct {
		Passed, Failed, Skipped int
		Cases                   []struct {
			Name, Group, Status, Reason string
		}
	}
	var rep report
	r := e.run("conformance", "--driver", "local", "--run", "^(recovery|retention)/", "--restart-hook", "touch "+marker, "--json")
	decodeOne(t, r, &rep)
	if r.code != 0 || rep.Failed != 0 || rep.Passed < 11 {
		t.Errorf("retention and recovery from the CLI: %+v\n%v", rep, r)
	}
	for _, c := range rep.Cases {
		if c.Status == "skip" && c.Name != "plugin-sigkill" {
			t.Errorf("case %s/%s skipped: %s", c.Group, c.Name, c.Reason)
		}
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the restart hook did not run: %v", err)
	}
	r = e.run("conformance", "--driver", "local", "--run", "^recovery/runtime-restart$", "--json")
	decodeOne(t, r, &rep)
	if len(rep.Cases) != 1 || rep.Cases[0].Status != "skip" || !strings.Contains(rep.Cases[0].Reason, "--restart-hook") {
		t.Errorf("runtime-restart without a hook: %+v", rep)
	}
}

// 20 concurrent berth execs over 5 sessions while `berth prune --watch` (its clock
// two hours ahead, so every sandbox whose exec has ended is idle past its TTL)
// removes what it may: no exec fails or loses its sandbox mid-run, and at the end no
// session has two sandboxes and nothing is left unrecorded.
func TestConcurrentExecsWithPrune(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", pruneConfig)
	p := e.at("2h").start("prune", "--watch", "20ms", "--json")
	const sessions, each = 5, 4
	type out struct {
		session string
		r       result
		err     error
	}
	results := make(chan out, sessions*each)
	var wg sync.WaitGroup
	for i := 0; i < sessions*each; i++ {
		s := fmt.Sprintf("tmp:%d", i%sessions)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.try(nil, 2*time.Minute, "exec", "-s", s, "--", "sh", "-c", `echo "$$" > "mine.$$"; sleep 0.2; cat "mine.$$"; test "$(cat "mine.$$")" = "$$"`)
			results <- out{s, r, err}
		}()
	}
	wg.Wait()
	close(results)
	for o := range results {
		if o.err != nil || o.r.code != 0 {
			t.Errorf("session %s: %v\n%v", o.session, o.err, o.r)
		}
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	if code := p.finish(t); code != 0 {
		t.Errorf("prune --watch: exit %d; stderr %q", code, p.stderr.String())
	}
	removed := 0
	for _, l := range p.all {
		var rep pruneReport
		if err := json.Unmarshal([]byte(l), &rep); err != nil {
			t.Fatalf("prune --watch line %q: %v", l, err)
		}
		for _, a := range rep.Actions {
			if a.Error != "" {
				t.Errorf("prune action failed: %+v", a)
			}
			if a.Action == "remove" && a.Done {
				removed++
			}
		}
	}
	t.Logf("prune removed %d idle sandboxes during the run", removed)
	rep := decodePrune(t, e.must("prune", "--dry-run", "--json"))
	seen := map[string]bool{}
	for _, a := range rep.Actions {
		if a.Sandbox == "" {
			continue
		}
		if a.Action != "keep" || a.Cause != "recorded" || len(a.Sessions) != 1 || seen[a.Sessions[0]] {
			t.Errorf("after the run: %+v", a)
		}
		seen[a.Sessions[0]] = true
	}
	if rows := e.sessions(); len(rows) != sessions {
		t.Errorf("%d sessions recorded, want %d: %+v", len(rows), sessions, rows)
	}
}

// TestClockOffsetLeavesNoFuture: BERTH_CLOCK_OFFSET looks ahead (an exec applies the
// session's retention as of then) but records nothing in the future: after an exec
// 96h ahead, the session's last use is not after the real clock and `sessions` says
// "ago", and the next exec without offset finds nothing due.
func TestClockOffsetLeavesNoFuture(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", pruneConfig)
	e.must("exec", "-s", "tmp:1", "--", "true")
	r := e.at("96h").must("exec", "-s", "tmp:1", "--", "true")
	if !strings.Contains(r.stderr, "removed by retention") {
		t.Errorf("exec 96h ahead of an idle_ttl: want the sandbox recreated\n%v", r)
	}
	row, ok := findSession(e.sessions(), "tmp:1")
	if !ok || row.LastUsed.After(time.Now()) {
		t.Errorf("after an exec 96h ahead: %+v, want a last use not after now", row)
	}
	if text := e.must("sessions"); regexp.MustCompile(` -[0-9]+h`).MatchString(text.stdout) || strings.Contains(text.stdout, "future") || !strings.Contains(text.stdout, " ago") {
		t.Errorf("sessions after an exec 96h ahead:\n%v", text)
	}
	if r := e.must("exec", "-s", "tmp:1", "--", "true"); r.stderr != "" {
		t.Errorf("exec without offset right after the look-ahead: want nothing due\n%v", r)
	}
}

// TestAgoFuture: a time after now is said to be in the future, not "-5s ago".
func TestAgoFuture(t *testing.T) {
	if got := ago(time.Now().Add(96 * time.Hour)); !strings.HasSuffix(got, " in the future") || strings.HasPrefix(got, "-") {
		t.Errorf("ago(96h ahead) = %q", got)
	}
	if got := ago(time.Now().Add(-time.Hour)); !strings.HasSuffix(got, " ago") {
		t.Errorf("ago(an hour back) = %q", got)
	}
}
