package cli

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

// berth drivers, config explain, config check and prune --owner through berth serve
// print what they print embedded, and exit as they do, bad input included.
func TestDaemonParityInfo(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", "scope \"chat:*\" {\n  driver = \"local\"\n  retention {\n    idle_ttl    = \"1h\"\n    idle_action = \"stop\"\n  }\n}\nscope \"*\" {\n  driver = \"local\"\n}\n")
	other := e.writeFile("other.hcl", "scope \"*\" {\n  driver = \"local\"\n}\n")
	d := e.serve("--log-level", "debug")
	e.must("exec", "-s", "chat:1", "--", "true")
	foreign := "0123456789abcdef0123456789abcdef"
	for _, c := range []daemonCase{
		{name: "drivers", args: []string{"drivers"}},
		{name: "drivers-json", args: []string{"drivers", "--json"}},
		{name: "explain", args: []string{"config", "explain", "chat:4711/2"}},
		{name: "explain-json", args: []string{"config", "explain", "--json", "chat:4711/2"}},
		{name: "explain-bad-name", args: []string{"config", "explain", "a/../b"}},
		{name: "check", args: []string{"config", "check"}},
		{name: "check-file", args: []string{"config", "check", e.config}},
		{name: "prune-owner", args: []string{"prune", "--owner", foreign, "--dry-run"}},
		{name: "prune-owner-json", args: []string{"prune", "--owner", foreign, "--json"}},
		{name: "prune-owner-bad", args: []string{"prune", "--owner", "not/an/id"}},
	} {
		r := compareModes(t, e, d, c, false)
		if c.name == "check" && (r.code != 0 || !strings.Contains(r.stdout, ": ok, 2 scope rules")) {
			t.Errorf("config check: %v", r)
		}
		if c.name == "prune-owner-json" {
			var rep registry.PruneReport
			if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep.Owner != foreign {
				t.Errorf("prune --owner --json: %v %+v", err, rep)
			}
		}
		if c.name == "prune-owner-bad" && (r.code != 125 || !strings.Contains(r.stderr, "owner id")) {
			t.Errorf("prune --owner not/an/id: %v", r)
		}
	}
	for _, path := range []string{"/v1/drivers", "/v1/config/explain", "/v1/config/check", "/v1/prune"} {
		seen := false
		for _, l := range d.logs("request") {
			seen = seen || l["path"] == path
		}
		if !seen {
			t.Errorf("no call of %s reached berth serve", path)
		}
	}
	// Another file than the daemon's is checked here, as embedded.
	compareModes(t, e, d, daemonCase{name: "check-other", args: []string{"config", "check", other}}, true)
}

// berth prune --watch with berth serve running says that the daemon prunes on its
// own, makes its rounds through the daemon, and goes on embedded when the daemon
// stops; SIGINT ends it (exit 0).
func TestPruneWatchDaemon(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve("--log-level", "debug", "--prune-interval", "1h")
	cmd := e.command("prune", "--watch", "1s", "--dry-run", "--json")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testwait.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var mu sync.Mutex
	var rounds []registry.PruneReport
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var rep registry.PruneReport
			if json.Unmarshal(sc.Bytes(), &rep) == nil {
				mu.Lock()
				rounds = append(rounds, rep)
				mu.Unlock()
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(rounds) }
	pruneCalls := func() int {
		n := 0
		for _, l := range d.logs("request") {
			if l["path"] == "/v1/prune" {
				n++
			}
		}
		return n
	}
	testwait.Until(t, "two rounds of prune --watch through the daemon", func() bool { return count() >= 2 && pruneCalls() >= 2 })
	if s := stderr.String(); !strings.Contains(s, "already prunes every 1h0m0s on its own") || !strings.Contains(s, "adds a round through it every 1s") {
		t.Errorf("prune --watch did not say that the daemon prunes: %q", s)
	}
	d.stop()
	n := count()
	testwait.Until(t, "prune --watch to go on embedded", func() bool {
		return strings.Contains(stderr.String(), "the rounds go on embedded") && count() >= n+1
	})
	cmd.Process.Signal(syscall.SIGINT)
	err = cmd.Wait()
	<-read
	if err != nil {
		t.Errorf("prune --watch after SIGINT: %v\n%s", err, stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, rep := range rounds {
		if !rep.DryRun || rep.Owner == "" {
			t.Errorf("a round: %+v", rep)
		}
	}
}

// A driver plugin killed (kill -9) during an exec that runs through it (the tdial
// driver's agents are reached only through its plugin, as Kubernetes' are): the call
// gets the typed driver_crashed error (not retried: the command may have run), the
// command's tree dies with its connection, supervision starts the plugin again, the
// next call works on the same sandbox, and only the new plugin is left.
func TestServePluginKilledMidExec(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir, path := testPlugin(t, "tdial")
	e.config = e.writeFile("config.hcl", "plugin_dirs = [\""+dir+"\"]\nscope \"*\" {\n  driver = \"tdial\"\n}\n")
	d := e.serve()
	first := d.exec("k:1", `{"argv":["true"]}`)
	if first.Driver != "tdial" || first.ExitCode != 0 {
		t.Fatalf("first exec: %+v", first)
	}
	plugins := func() []procInfo {
		return liveProcs(func(p procInfo) bool {
			return len(p.cmdline) > 0 && p.cmdline[0] == path && p.ppid == d.cmd.Process.Pid
		})
	}
	ps := plugins()
	if len(ps) != 1 {
		t.Fatalf("want the daemon's one tdial plugin, found %v", ps)
	}
	mark := newMark()
	type answer struct {
		status int
		body   []byte
	}
	done := make(chan answer, 1)
	go func() {
		status, b := d.call("POST", "/v1/sessions/k:1/exec", `{"argv":["sh","-c","sleep 300 & sleep 300"],"env":{"`+markVar+`":"`+mark+`"}}`)
		done <- answer{status, b}
	}()
	testwait.Until(t, "both sleeps of the exec", func() bool { return len(marked(mark)) >= 2 })
	syscall.Kill(ps[0].pid, syscall.SIGKILL)
	a := <-done
	info := wantError(t, "exec whose plugin was killed", a.status, a.body, 503, apiv1.KindDriverCrashed, "driver tdial crashed")
	if strings.Contains(info.Message, "was stopped") {
		t.Errorf("the error says berth stopped the plugin: %s", info.Message)
	}
	if info.Retried == nil || *info.Retried {
		t.Errorf("retried = %v, want false (an exec is not made again)", info.Retried)
	}
	testwait.Until(t, "the exec's tree to die with its connection", func() bool { return len(marked(mark)) == 0 })
	d.waitLog("driver plugin restarted", 1)
	if res := d.exec("k:1", `{"argv":["sh","-c","echo again"]}`); res.Stdout != "again\n" || res.Sandbox != first.Sandbox || res.Recreated {
		t.Errorf("exec after the plugin was killed: %+v (first %+v)", res, first)
	}
	if now := plugins(); len(now) != 1 || now[0].pid == ps[0].pid {
		t.Errorf("want one new tdial plugin, found %v", now)
	}
	if status, b := d.call("GET", "/v1/health", ""); status != 200 {
		t.Errorf("health after: %d %s", status, b)
	}
}
