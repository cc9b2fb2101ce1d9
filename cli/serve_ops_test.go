package cli

// berth serve's operations, tested against a real daemon: Prometheus metrics, the
// audit log, plugin supervision, drivers and config explain.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/cli/internal/execrun"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/server/apiv1"
)

// metricsText returns GET /metrics's body: through the whole curl command of the
// done-when line when curl is installed (it is in CI), else through d's client.
func (d *daemon) metricsText() string {
	d.t.Helper()
	if curl, err := exec.LookPath("curl"); err == nil && d.sock != "" && len(d.sock) <= 107 {
		out, err := exec.Command(curl, "-sS", "--fail-with-body", "--unix-socket", d.sock, "http://berth/metrics").CombinedOutput()
		if err != nil {
			d.t.Fatalf("curl /metrics: %v: %s", err, out)
		}
		return string(out)
	}
	status, b := d.call("GET", "/metrics", "")
	if status != http.StatusOK {
		d.t.Fatalf("GET /metrics: %d %s", status, b)
	}
	return string(b)
}

// sample returns the value of the series line `series` (name and labels exactly as
// the text exposition prints them, labels sorted) in text, or "" when absent.
func sample(text, series string) string {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	return ""
}

// /metrics shows berth's series: execs by driver and mode with their latency,
// sessions by driver and state, sandbox creates and removes by cause, calls in
// flight (the scrape itself), beside the Go runtime's.
func TestServeMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	d.exec("m:1", `{"argv":["true"]}`)
	d.exec("m:1", `{"argv":["sh","-c","exit 4"]}`)
	if status, b := d.call("POST", "/v1/sessions/m:1/exec", `{"command":"echo hi"}`, "Accept", apiv1.NDJSON); status != http.StatusOK {
		t.Fatalf("streamed shell exec: %d %s", status, b)
	}
	if status, b := d.call("DELETE", "/v1/sessions/m:1", ""); status != http.StatusNoContent {
		t.Fatalf("rm: %d %s", status, b)
	}
	d.exec("m:2", `{"argv":["true"]}`)
	text := d.metricsText()
	for series, want := range map[string]string{
		`berth_execs_total{driver="local",mode="plain",outcome="exited",stream="false"}`: "3",
		`berth_execs_total{driver="local",mode="shell",outcome="exited",stream="true"}`:  "1",
		`berth_exec_duration_seconds_count{driver="local",mode="plain",stream="false"}`:  "3",
		`berth_sessions{driver="local",state="running"}`:                                 "1",
		`berth_sandbox_creates_total{cause="new",driver="local"}`:                        "2",
		`berth_sandbox_removes_total{cause="rm",driver="local"}`:                         "1",
		`berth_calls_in_flight`: "1",
	} {
		if got := sample(text, series); got != want {
			t.Errorf("%s = %q, want %q", series, got, want)
		}
	}
	for _, name := range []string{"berth_exec_duration_seconds_bucket", "go_goroutines", "process_resident_memory_bytes"} {
		if !strings.Contains(text, "\n"+name) {
			t.Errorf("no %s series in /metrics", name)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}
}

// auditLines returns the audit log's entries.
func auditLines(t *testing.T, path string) []apiv1.AuditEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return jsonLines[apiv1.AuditEntry](t, f)
}

// The audit log records each call (not /metrics) with its caller's credentials,
// route, session, the command's length and hash (never its text, stdin or env),
// exit code, status and duration, in STATE/audit.log of mode 0600.
func TestServeAudit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	path := filepath.Join(e.state, apiv1.AuditFile)
	d.exec("chat:7", `{"argv":["sh","-c","echo secret-words; exit 3"],"env":{"API_KEY":"hunter2-value"},"stdin":"stdin-text"}`)
	status, _ := d.call("POST", "/v1/sessions/chat:7/exec", `{"argv":["true"],"nope":1}`)
	d.metricsText()
	testwait.Until(t, "the audit log's two lines", func() bool { return len(auditLines(t, path)) >= 2 })
	lines := auditLines(t, path)
	if len(lines) != 2 {
		t.Fatalf("want 2 audit lines (no /metrics), got %+v", lines)
	}
	ex, bad := lines[0], lines[1]
	cmd := "sh\x00-c\x00echo secret-words; exit 3"
	sum := sha256.Sum256([]byte(cmd))
	uid, pid := uint32(os.Getuid()), int32(os.Getpid())
	switch {
	case ex.Method != "POST" || ex.Route != "/v1/sessions/{name}/exec" || ex.Session != "chat:7" || ex.Status != 200:
		t.Errorf("exec line: %+v", ex)
	case ex.CommandBytes == nil || *ex.CommandBytes != len(cmd) || ex.CommandSHA256 != hex.EncodeToString(sum[:]):
		t.Errorf("exec line's command: %v %s", ex.CommandBytes, ex.CommandSHA256)
	case ex.ExitCode == nil || *ex.ExitCode != 3:
		t.Errorf("exec line's exit code: %v", ex.ExitCode)
	case ex.Caller.UID == nil || *ex.Caller.UID != uid || ex.Caller.PID == nil || *ex.Caller.PID != pid:
		t.Errorf("exec line's caller %+v, want uid %d pid %d", ex.Caller, uid, pid)
	case ex.DurationMS <= 0 || ex.Time.IsZero():
		t.Errorf("exec line's time and duration: %+v", ex)
	}
	if bad.Status != status || bad.Status != 400 || bad.ErrorKind != "invalid" || bad.ExitCode != nil {
		t.Errorf("bad call's line: %+v", bad)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"secret-words", "hunter2-value", "API_KEY", "stdin-text"} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("the audit log holds %q: %s", secret, raw)
		}
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode: %v %v", st.Mode(), err)
	}
	// Bad flags are refused before anything is served.
	for _, args := range [][]string{{"--audit-max-size", "10k"}, {"--audit-keep", "0"}} {
		r := e.run(append([]string{"serve"}, args...)...)
		if r.code != execrun.ExitInternal || !strings.Contains(r.stderr, args[0]) {
			t.Errorf("serve %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}

// A driver plugin killed (kill -9) under the daemon is restarted by its
// supervision at once, without waiting for a call: the restart is logged and
// counted in /metrics, and the next calls work on the new plugin.
func TestServePluginKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	d.exec("p:1", `{"argv":["true"]}`) // creates the sandbox: launches the local plugin
	plugin := func() []procInfo {
		return liveProcs(func(p procInfo) bool {
			return strings.Join(p.cmdline, " ") == testbin.CLI(berthBin)+" driver serve local" && p.ppid == d.cmd.Process.Pid
		})
	}
	ps := plugin()
	if len(ps) != 1 {
		t.Fatalf("want the daemon's one local plugin, found %v", ps)
	}
	syscall.Kill(ps[0].pid, syscall.SIGKILL)
	crash := d.waitLog("driver plugin crashed; restarting it", 1)
	if crash["driver"] != "local" {
		t.Errorf("crash log line: %v", crash)
	}
	d.waitLog("driver plugin restarted", 1)
	if now := plugin(); len(now) != 1 || now[0].pid == ps[0].pid {
		t.Errorf("want one new local plugin after the restart, found %v", now)
	}
	if status, b := d.call("POST", "/v1/sessions/p:1/stop", ""); status != http.StatusNoContent {
		t.Errorf("stop after the restart: %d %s", status, b)
	}
	if res := d.exec("p:1", `{"argv":["sh","-c","echo again"]}`); res.Stdout != "again\n" || res.Recreated {
		t.Errorf("exec after the plugin was killed: %+v", res)
	}
	if got := sample(d.metricsText(), `berth_plugin_restarts_total{driver="local",result="ok"}`); got != "1" {
		t.Errorf("berth_plugin_restarts_total{driver=local,result=ok} = %q, want 1", got)
	}
}

// GET /v1/drivers lists the drivers as berth drivers --json does; GET
// /v1/config/explain?session=NAME explains as berth config explain --json does.
func TestServeDriversExplain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", "scope \"chat:*\" {\n  driver = \"local\"\n  retention {\n    idle_ttl    = \"1h\"\n    idle_action = \"stop\"\n  }\n}\n")
	d := e.serve()
	status, b := d.call("GET", "/v1/drivers", "")
	var drivers []apiv1.Driver
	if status != http.StatusOK || json.Unmarshal(b, &drivers) != nil {
		t.Fatalf("drivers: %d %s", status, b)
	}
	i := -1
	for j, dr := range drivers {
		if dr.Name == "local" {
			i = j
		}
	}
	if i < 0 || drivers[i].Health != "ok" || drivers[i].Served != "plugin" || drivers[i].Path != testbin.CLI(berthBin) || drivers[i].Protocol == 0 {
		t.Errorf("drivers: %s", b)
	}

	name := "chat:4711/2"
	status, b = d.call("GET", "/v1/config/explain?session="+url.QueryEscape(name), "")
	var got, want apiv1.Explanation
	if status != http.StatusOK || json.Unmarshal(b, &got) != nil {
		t.Fatalf("explain: %d %s", status, b)
	}
	if err := json.Unmarshal([]byte(e.must("config", "explain", "--json", name).stdout), &want); err != nil {
		t.Fatal(err)
	}
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) || got.Session != name || got.Retention.IdleAction != "stop" {
		t.Errorf("explain through the daemon:\n%s\nberth config explain --json:\n%s", gotJSON, wantJSON)
	}
	for _, c := range []struct{ query, msg string }{
		{"", "?session=NAME"},
		{"?session=", "?session=NAME"},
		{"?session=" + url.QueryEscape("a/../b"), "a/../b"},
		{"?session=main", "matches no scope rule"},
	} {
		status, b := d.call("GET", "/v1/config/explain"+c.query, "")
		wantError(t, "explain"+c.query, status, b, http.StatusBadRequest, "invalid", c.msg)
	}
}

// On TCP the audit log's caller is the remote address; a request without the token
// is audited too (401), and the token itself is never written.
func TestServeAuditTCP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tokenFile, token := e.tokenFile()
	d := e.serve("--listen", "tcp://127.0.0.1:0", "--token-file", tokenFile)
	if status, b := d.call("GET", "/v1/health", ""); status != http.StatusUnauthorized {
		t.Fatalf("health without the token: %d %s", status, b)
	}
	d.token = token
	d.exec("tcp:1", `{"command":"echo hi"}`)
	path := filepath.Join(e.state, apiv1.AuditFile)
	testwait.Until(t, "the audit log's two lines", func() bool { return len(auditLines(t, path)) >= 2 })
	lines := auditLines(t, path)
	host := strings.TrimPrefix(d.listen, "tcp://")
	for _, l := range lines {
		if l.Caller.UID != nil || !strings.HasPrefix(l.Caller.Addr, "127.0.0.1:") || l.Caller.Addr == host {
			t.Errorf("TCP caller %+v (the daemon listens on %s)", l.Caller, host)
		}
	}
	sum := sha256.Sum256([]byte("echo hi"))
	if lines[0].Status != 401 || lines[0].ErrorKind != "unauthorized" || lines[1].CommandSHA256 != hex.EncodeToString(sum[:]) || *lines[1].CommandBytes != 7 {
		t.Errorf("audit lines: %+v", lines)
	}
	if raw, _ := os.ReadFile(path); strings.Contains(string(raw), token) {
		t.Errorf("the audit log holds the token")
	}
}

// tokenFile writes a new bearer token to an owner-only file in e's scratch dir and
// returns the file and the token.
func (e *env) tokenFile() (path, token string) {
	e.t.Helper()
	path, token = filepath.Join(e.dir, "token"), randHex(16)
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return path, token
}
