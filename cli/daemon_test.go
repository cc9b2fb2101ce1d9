package cli

// These tests run berth's CLI against a real `berth serve` and embedded (--no-daemon)
// and compare what a user sees: stdout, stderr and exit codes.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/server/apiv1"
)

// volatile are the parts of an output that differ between two runs of the same
// command: durations, ages, times, full-output file names, job ids and pids.
var volatile = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`"duration_ms":\s*\d+`), `"duration_ms":N`},
	{regexp.MustCompile(`\d+s ago`), `Ns ago`},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT[0-9:.]+Z`), `TIME`},
	{regexp.MustCompile(`/output/[0-9a-f]+/[^"\s]+\.(stdout|stderr)`), `/output/FILE`},
	{regexp.MustCompile(`"(id|pid)":\s*"?\d+"?`), `"$1":N`},
	// A table's padding follows its widest cell: "9s ago" on one side and "10s ago"
	// on the other pad every row differently.
	{regexp.MustCompile(` {2,}`), `  `},
}

func normalize(s string) string {
	for _, v := range volatile {
		s = v.re.ReplaceAllString(s, v.with)
	}
	return s
}

// daemonCase is one command run both ways.
type daemonCase struct {
	name  string
	args  []string
	stdin string
}

// runMode runs c's command embedded (--no-daemon) or with the daemon d running
// (d's log must have at least a status call at "debug"); through the daemon it
// waits until the daemon has logged the command's call beyond its status call
// (unless local: a command that runs embedded even with the daemon).
func runMode(t *testing.T, e *env, d *daemon, c daemonCase, viaDaemon, local bool) result {
	t.Helper()
	args := c.args
	if !viaDaemon {
		args = append([]string{"--no-daemon"}, args...)
	}
	before := len(d.logs("request"))
	r := e.with(t).runIn(strings.NewReader(c.stdin), 2*time.Minute, args...)
	// The daemon logs a request once its answer is written, which may be after
	// the CLI has read it: wait for the command's call beyond its status call.
	// (That --no-daemon makes no call at all: TestDaemonStatus.)
	if viaDaemon && !local {
		testwait.Until(t, c.name+": the daemon to log the command's call", func() bool {
			for _, l := range d.logs("request")[before:] {
				if l["path"] != "/v1/status" {
					return true
				}
			}
			return false
		})
	}
	return r
}

// compareModes runs c both ways (local: see runMode) and wants the same stdout,
// stderr and exit code (up to normalize); it returns the embedded run's result.
func compareModes(t *testing.T, e *env, d *daemon, c daemonCase, local bool) result {
	t.Helper()
	emb := runMode(t, e, d, c, false, local)
	dae := runMode(t, e, d, c, true, local)
	if emb.code != dae.code || normalize(emb.stdout) != normalize(dae.stdout) || normalize(emb.stderr) != normalize(dae.stderr) {
		t.Errorf("%s (berth %q) differs:\nembedded: %v\ndaemon:   %v", c.name, c.args, emb, dae)
	}
	return emb
}

// TestDaemonParity runs each command embedded (--no-daemon) and through berth serve
// on the same sessions, and wants the same stdout, stderr and exit code (up to
// durations, times and file names); each run through the daemon must have made
// API requests, and each embedded one none.
func TestDaemonParity(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve("--log-level", "debug")
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	heredoc := "cat <<'EOF' | wc -c\n" + strings.Repeat("x", 200<<10) + "\nEOF\necho done"
	cases := []daemonCase{
		{"plain", []string{"exec", "-s", "p:1", "--", "sh", "-c", "echo out; echo err >&2; exit 3"}, ""},
		{"json", []string{"exec", "-s", "p:1", "--json", "--", "sh", "-c", "echo out; echo err >&2; printf '\\377'; exit 3"}, ""},
		{"stdin", []string{"exec", "-s", "p:1", "-i", "--", "sha256sum"}, big},
		{"no-stdin-is-EOF", []string{"exec", "-s", "p:1", "--", "cat"}, "not for cat"},
		{"env-cwd", []string{"exec", "-s", "p:1", "-e", "A=b c", "-w", "/tmp", "--", "sh", "-c", `echo "$A"; pwd`}, ""},
		{"max-output", []string{"exec", "-s", "p:1", "--max-output", "5", "--", "seq", "1", "100"}, ""},
		{"json-max-output", []string{"exec", "-s", "p:1", "--json", "--max-output", "40", "--", "seq", "1", "1000"}, ""},
		{"timeout", []string{"exec", "-s", "p:1", "--timeout", "1s", "--", "sleep", "60"}, ""},
		{"not-found", []string{"exec", "-s", "p:1", "--", "no-such-command-here"}, ""},
		{"bad-cwd", []string{"exec", "-s", "p:1", "-w", "/nonexistent-dir", "--", "true"}, ""},
		{"bad-session", []string{"exec", "-s", "bad name", "--", "true"}, ""},
		{"signal-exit", []string{"exec", "-s", "p:1", "--", "sh", "-c", "kill -TERM $$"}, ""},
		{"p2", []string{"exec", "-s", "p:2", "--", "true"}, ""},
		{"recreate", []string{"exec", "-s", "p:2", "--recreate", "--json", "--", "true"}, ""},
		{"shell-state", []string{"exec", "-s", "p:1", "--shell", "cd /tmp && export A=1"}, ""},
		{"shell-read", []string{"exec", "-s", "p:1", "--shell", `echo "$A"; pwd`}, ""},
		{"shell-exit", []string{"exec", "-s", "p:1", "--shell", "echo x; exit 7"}, ""},
		{"shell-stdin", []string{"exec", "-s", "p:1", "-i", "--shell", "wc -c"}, big},
		{"shell-heredoc", []string{"exec", "-s", "p:1", "--shell", "-"}, heredoc},
		{"shell-capped", []string{"exec", "-s", "p:1", "--max-output", "100", "--shell", "seq 1 1000"}, ""},
		{"shell-json", []string{"exec", "-s", "p:1", "--json", "--max-output", "100", "--shell", "seq 1 1000"}, ""},
		{"sessions", []string{"sessions"}, ""},
		{"sessions-json", []string{"sessions", "--json"}, ""},
		{"job-ls-none", []string{"job", "ls", "-s", "p:9"}, ""},
		{"job-logs-no-sandbox", []string{"job", "logs", "-s", "p:9", "1"}, ""},
		{"prune", []string{"prune", "--dry-run"}, ""},
		{"prune-json", []string{"prune", "--dry-run", "--json"}, ""},
		{"stop", []string{"stop", "p:2"}, ""},
		{"close", []string{"close", "p:2"}, ""},
		{"rm", []string{"rm", "p:2"}, ""},
		{"rm-again", []string{"rm", "p:2"}, ""},
	}
	for _, c := range cases {
		compareModes(t, e, d, c, false)
	}

	// Jobs: the ids differ, the rest does not.
	jobRun := func(viaDaemon bool) []result {
		pre := []string{}
		if !viaDaemon {
			pre = []string{"--no-daemon"}
		}
		r := e.must(append(pre, "job", "start", "-s", "j:1", "--", "sh", "-c", "echo one; echo two; exit 4")...)
		id := strings.TrimSpace(r.stdout)
		out := []result{
			e.run(append(pre, "job", "logs", "-s", "j:1", "--follow", id)...),
			e.run(append(pre, "job", "logs", "-s", "j:1", "--offset", "4", id)...),
			e.run(append(pre, "job", "ls", "-s", "j:1", "--json")...),
			e.run(append(pre, "job", "start", "-s", "j:1", "--json", "--shell", "sleep 300")...),
			e.run(append(pre, "job", "kill", "-s", "j:1", "nosuchjob")...),
		}
		var j apiv1.Job
		if err := json.Unmarshal([]byte(out[3].stdout), &j); err != nil || !j.Running || j.Argv[0] != "/bin/sh" {
			t.Errorf("job start --json --shell: %v %+v\n%v", err, j, out[3])
		}
		out = append(out, e.run(append(pre, "job", "kill", "-s", "j:1", j.ID)...))
		e.must(append(pre, "rm", "j:1")...)
		return out
	}
	emb, dae := jobRun(false), jobRun(true)
	for i := range emb {
		if emb[i].code != dae[i].code || normalize(emb[i].stdout) != normalize(dae[i].stdout) || normalize(emb[i].stderr) != normalize(dae[i].stderr) {
			t.Errorf("job call %d differs:\nembedded: %v\ndaemon:   %v", i, emb[i], dae[i])
		}
	}
	if emb[0].code != 4 || emb[0].stdout != "one\ntwo\n" || emb[1].stdout != "two\n" {
		t.Errorf("job logs --follow / --offset 4: %v\n%v", emb[0], emb[1])
	}
}

// The 200 KB heredoc of issue 14 in shell mode, both ways: --shell - reads it from
// stdin, and the agent does not put it on a command line.
func TestShellModeLongCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := strings.Repeat("y", 200<<10)
	script := "cat > long.txt <<'EOF'\n" + body + "\nEOF\nwc -c < long.txt"
	if r := e.runIn(strings.NewReader(script), 2*time.Minute, "--no-daemon", "exec", "--shell", "-"); r.code != 0 || strings.TrimSpace(r.stdout) != strconv.Itoa(len(body)+1) {
		t.Errorf("embedded: a 200 KB shell-mode command\n%v", r)
	}
	e.serve()
	if r := e.runIn(strings.NewReader(script), 2*time.Minute, "exec", "--shell", "-"); r.code != 0 || strings.TrimSpace(r.stdout) != strconv.Itoa(len(body)+1) {
		t.Errorf("through the daemon: a 200 KB shell-mode command\n%v", r)
	}
	if r := e.runIn(strings.NewReader("x"), time.Minute, "exec", "-i", "--shell", "-"); r.code != 125 || !strings.Contains(r.stderr, "--shell - reads the command from stdin") {
		t.Errorf("--shell - with -i: want 125\n%v", r)
	}
}

// berth status says which mode and where; --no-daemon and BERTH_NO_DAEMON force
// embedded.
func TestDaemonStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var st statusJSON
	decode := func(r result) statusJSON {
		t.Helper()
		var s statusJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &s) != nil {
			t.Fatalf("status --json\n%v", r)
		}
		return s
	}
	if st = decode(e.run("status", "--json")); st.Mode != "embedded" || !strings.Contains(st.Reason, "no berth serve answers on "+e.state+"/berth.sock") || st.StateDir != e.state {
		t.Errorf("without a daemon: %+v", st)
	}
	d := e.serve()
	st = decode(e.run("status", "--json"))
	if st.Mode != "daemon" || st.Daemon == nil || st.Daemon.PID != d.cmd.Process.Pid || st.Daemon.Address != "unix://"+d.sock || st.Daemon.StateDir != e.state || st.Daemon.Version != version {
		t.Errorf("with a daemon: %+v %+v", st, st.Daemon)
	}
	if r := e.run("status"); r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("daemon:    unix://%s (pid %d", d.sock, d.cmd.Process.Pid)) {
		t.Errorf("status text\n%v", r)
	}
	if st = decode(e.run("--no-daemon", "status", "--json")); st.Mode != "embedded" || st.Reason != "--no-daemon asks for it" {
		t.Errorf("--no-daemon: %+v", st)
	}
	noD := *e
	noD.extra = append(noD.extra, "BERTH_NO_DAEMON=1")
	if st = decode(noD.run("status", "--json")); st.Mode != "embedded" {
		t.Errorf("BERTH_NO_DAEMON=1: %+v", st)
	}
}

// A CLI whose config, state dir or clock offset differs from the daemon's refuses
// to use it, naming both and the fix; --no-daemon runs it embedded.
func TestDaemonRefusesMismatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	other := *e
	other.config = e.writeFile("other.hcl", "scope \"*\" {\n  driver = \"local\"\n}\n")
	r := other.run("exec", "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, "config (none: the built-in default) (this command: "+other.config) ||
		!strings.Contains(r.stderr, "--no-daemon") || !strings.Contains(r.stderr, fmt.Sprintf("pid %d", d.cmd.Process.Pid)) {
		t.Errorf("another config: want a refusal naming both\n%v", r)
	}
	if r := other.run("status"); r.code != 125 || !strings.Contains(r.stderr, "refusing to mix") {
		t.Errorf("status with another config\n%v", r)
	}
	if r := other.run("--no-daemon", "exec", "--", "echo", "embedded"); r.code != 0 || r.stdout != "embedded\n" {
		t.Errorf("--no-daemon with another config\n%v", r)
	}
	if r := e.at("2h").run("sessions"); r.code != 125 || !strings.Contains(r.stderr, "clock offset 0s (this command: 2h0m0s") {
		t.Errorf("another clock offset\n%v", r)
	}
	// BERTH_HOST names the daemon; a state dir that the command sets and the
	// daemon does not have is refused.
	elsewhere := newEnv(t)
	elsewhere.extra = []string{"BERTH_HOST=unix://" + d.sock}
	if r := elsewhere.run("exec", "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "state dir "+e.state+" (this command: "+elsewhere.state) {
		t.Errorf("BERTH_HOST with another state dir\n%v", r)
	}
}

// BERTH_HOST over TCP with BERTH_TOKEN_FILE; a missing or wrong token is an error
// that says so, never a fallback to embedded.
func TestDaemonHostTCP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tok, _ := e.tokenFile()
	d := e.serve("--listen", "tcp://127.0.0.1:0", "--token-file", tok)
	host := "BERTH_HOST=http://" + strings.TrimPrefix(d.listen, "tcp://")
	c := *e
	c.extra = []string{host, "BERTH_TOKEN_FILE=" + tok}
	if r := c.run("exec", "--", "sh", "-c", "echo tcp; exit 2"); r.code != 2 || r.stdout != "tcp\n" {
		t.Errorf("exec over TCP\n%v", r)
	}
	if r := c.run("status", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"address": "http://127.0.0.1:`) {
		t.Errorf("status over TCP\n%v", r)
	}
	c.extra = []string{host}
	if r := c.run("exec", "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "BERTH_TOKEN_FILE") {
		t.Errorf("no token\n%v", r)
	}
	bad := filepath.Join(e.dir, "bad")
	os.WriteFile(bad, []byte("wrongwrongwrongwrong\n"), 0o600)
	c.extra = []string{host, "BERTH_TOKEN_FILE=" + bad}
	if r := c.run("exec", "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "Authorization: Bearer") || !strings.Contains(r.stderr, "refused the token of BERTH_TOKEN_FILE="+bad+" (401 unauthorized") {
		t.Errorf("wrong token\n%v", r)
	}
	c.extra = []string{"BERTH_HOST=" + d.listen, "BERTH_TOKEN_FILE=" + tok}
	if r := c.run("exec", "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "a client names the address as http://"+strings.TrimPrefix(d.listen, "tcp://")) {
		t.Errorf("BERTH_HOST in --listen's tcp:// form: want the http:// form named\n%v", r)
	}
	c.extra = []string{"BERTH_HOST=tcp://0.0.0.0:8080", "BERTH_TOKEN_FILE=" + tok}
	if r := c.run("exec", "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "a client names the address as http://127.0.0.1:8080") {
		t.Errorf("BERTH_HOST=tcp://0.0.0.0:8080: want a loopback address named\n%v", r)
	}
	c.extra = []string{"BERTH_HOST=http://10.1.2.3:80", "BERTH_TOKEN_FILE=" + tok}
	if r := c.run("exec", "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "plain http only to a loopback IP") {
		t.Errorf("http off loopback\n%v", r)
	}
	// A port where nothing listens: no connection, said so (not "went away").
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	c.extra = []string{"BERTH_HOST=" + closed, "BERTH_TOKEN_FILE=" + tok}
	if r := c.run("exec", "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "berth serve at "+closed+" does not answer its status call: it takes no connection (") ||
		strings.Contains(r.stderr, "went away") || strings.Count(r.stderr, closed) != 1 {
		t.Errorf("BERTH_HOST where nothing listens\n%v", r)
	}
}

// A daemon that goes away: one killed mid-exec ends berth exec with a clear error
// (125), at once; one that answers the status call and then drops the exec call
// gives the same; a socket left behind by a dead daemon makes the CLI run
// embedded.
func TestDaemonGone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	mark := newMark()
	run := e.start("exec", "-e", markEnv(mark), "--", "sh", "-c", "echo started; sleep 300")
	run.expect(t, "started")
	d.cmd.Process.Kill()
	d.wait()
	if code := run.finish(t); code != 125 || !strings.Contains(run.stderr.String(), "berth serve at unix://"+d.sock+" went away during the call") {
		t.Errorf("exec whose daemon was killed: exit %d, stderr %q", code, run.stderr.String())
	}
	testwait.Until(t, "the exec's tree to die with its daemon", func() bool { return len(marked(mark)) == 0 })
	// The dead daemon's socket is still there: nobody listens on it.
	if _, err := os.Lstat(d.sock); err != nil {
		t.Fatalf("the killed daemon's socket: %v", err)
	}
	if r := e.run("exec", "--", "echo", "embedded"); r.code != 0 || r.stdout != "embedded\n" {
		t.Errorf("a stale socket: want embedded\n%v", r)
	}

	// A daemon that answers its status and then drops the call.
	os.Remove(d.sock)
	ln, err := net.Listen("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	status, _ := json.Marshal(apiv1.Status{API: "v1", Version: version, PID: 1, StateDir: e.state})
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/status" {
			w.Write(status)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	for _, args := range [][]string{{"exec", "--", "true"}, {"exec", "--shell", "true"}, {"sessions"}, {"job", "ls"}} {
		if r := e.run(args...); r.code != 125 || !strings.Contains(r.stderr, "went away during the call") {
			t.Errorf("berth %q with a daemon that drops the call\n%v", args, r)
		}
	}
}

// Ctrl-C through the daemon: the first SIGINT goes to the command's process group,
// the second kills the tree (exit 130), as embedded; in shell mode SIGINT ends the
// call with 130 and --json says so.
func TestDaemonSignals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.serve()
	run := e.start("exec", "--", "sh", "-c", `trap 'echo got INT' INT; echo ready; while :; do sleep 0.1; done`)
	run.expect(t, "ready")
	run.cmd.Process.Signal(syscall.SIGINT)
	run.expect(t, "got INT")
	run.cmd.Process.Signal(syscall.SIGINT)
	if code := run.finish(t); code != 130 && code != 137 && code != 143 { // as embedded (TestExecSignals)
		t.Errorf("second SIGINT through the daemon: exit %d, want 130, 137 or 143; stderr %q", code, run.stderr.String())
	}
	mark := newMark()
	sh := e.start("exec", "--json", "-e", markEnv(mark), "--shell", "sleep 300")
	testwait.Until(t, "the shell-mode call to run", func() bool { return len(marked(mark)) > 0 })
	sh.cmd.Process.Signal(syscall.SIGINT)
	code := sh.finish(t)
	var res apiv1.ExecResult
	if code != 130 || json.Unmarshal([]byte(strings.Join(sh.all, "\n")), &res) != nil || res.ExitCode != 130 || !res.Canceled {
		t.Errorf("SIGINT in shell mode through the daemon: exit %d, %q, stderr %q", code, sh.all, sh.stderr.String())
	}
}

// 50 MB of stdin with 50 MB of output through the API, from a client that sends its
// whole request before it reads a byte of the answer (as a standard-library client
// does): no deadlock, every byte through, and the daemon's peak memory does not grow
// by the output's size.
func TestServeLargeStdin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	d.exec("main", `{"argv":["true"]}`) // the sandbox exists: measure only the call
	before := vmHWM(t, d.cmd.Process.Pid)
	const total = 50 << 20
	chunk := bytes.Repeat([]byte("berth stdin 0123456789abcdef\n"), 1024) // 29 KiB
	var body bytes.Buffer
	body.WriteString(`{"argv":["cat"]}` + "\n")
	sum := sha256.New()
	for sent := 0; sent < total; {
		k := min(len(chunk), total-sent)
		sum.Write(chunk[:k])
		b, _ := json.Marshal(apiv1.Event{Event: apiv1.InputStdin, Data: chunk[:k]})
		body.Write(append(b, '\n'))
		sent += k
	}
	want := hex.EncodeToString(sum.Sum(nil))
	conn, err := dialUnix(context.Background(), d.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The whole request first, then the answer: a half-duplex client.
	fmt.Fprintf(conn, "POST /v1/sessions/main/exec HTTP/1.1\r\nHost: berth\r\nContent-Type: application/x-ndjson\r\nAccept: application/x-ndjson\r\nContent-Length: %d\r\n\r\n", body.Len())
	if _, err := conn.Write(body.Bytes()); err != nil {
		t.Fatalf("sending the %d-byte request (a deadlock would hang here): %v", body.Len(), err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("answer: %v %v", err, resp)
	}
	got := sha256.New()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var last apiv1.Event
	for sc.Scan() {
		var ev apiv1.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		if ev.Event == "stdout" {
			got.Write(ev.Data)
			n += len(ev.Data)
		}
		last = ev
	}
	if n != total || hex.EncodeToString(got.Sum(nil)) != want || last.Event != "result" || last.Result.ExitCode != 0 {
		t.Errorf("got %d bytes of %d back (sha256 match %v); last event %+v", n, total, hex.EncodeToString(got.Sum(nil)) == want, last)
	}
	grew := vmHWM(t, d.cmd.Process.Pid) - before
	t.Logf("the daemon's peak RSS grew by %d KiB for %d MiB in and %d MiB out", grew>>10, total>>20, total>>20)
	if grew > 32<<20 {
		t.Errorf("the daemon's peak memory grew by %d MiB with 50 MiB of stdin and output", grew>>20)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.state, "tmp")); len(ents) != 0 {
		t.Errorf("stdin spool files left in STATE/tmp: %v", ents)
	}
}

// Streamed request edge cases: stdin inline in a streamed request, a bad input
// event, a cancel event (the answer still comes, canceled), a signal event, and a
// body that ends without eof (the stdin ends with it).
func TestServeStreamedRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	post := func(lines ...string) (int, []apiv1.Event, []byte) {
		t.Helper()
		status, b := d.call("POST", "/v1/sessions/main/exec", strings.Join(lines, "\n")+"\n", "Content-Type", apiv1.NDJSON, "Accept", apiv1.NDJSON)
		if status != http.StatusOK {
			return status, nil, b
		}
		return status, readEvents(t, bytes.NewReader(b)), b
	}
	stdin := func(s string) string {
		return fmt.Sprintf(`{"event":"stdin","data":%q}`, base64.StdEncoding.EncodeToString([]byte(s)))
	}
	status, evs, b := post(`{"argv":["cat"]}`, stdin("one "), stdin("two"))
	if status != 200 || streamed(evs, "stdout") != "one two" || evs[0].Event != "started" || evs[0].Started.Driver != "local" {
		t.Errorf("stdin events, body end as EOF: %d %s", status, b)
	}
	status, _, b = post(`{"argv":["cat"],"stdin":"x"}`)
	wantError(t, "inline stdin in a streamed request", status, b, 400, "invalid", "stdin events")
	// A bad event before the command started is an error answer (after, it would be
	// an error event).
	status, _, b = post(`{"argv":["sleep","300"]}`, `{"event":"bogus"}`)
	wantError(t, "a bad input event", status, b, 400, "invalid", `unknown event "bogus"`)
	// A cancel once the command runs: the answer still comes, canceled. A client
	// that reads while it writes (full duplex) sends it after the started event.
	pr, pw := io.Pipe()
	go pw.Write([]byte(`{"argv":["sleep","300"]}` + "\n"))
	req, _ := http.NewRequest("POST", d.base+"/v1/sessions/main/exec", pr)
	req.Header.Set("Content-Type", apiv1.NDJSON)
	req.Header.Set("Accept", apiv1.NDJSON)
	resp, err := d.client.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("full-duplex exec: %v %v", err, resp)
	}
	br := bufio.NewReader(resp.Body)
	if l, _ := br.ReadString('\n'); !strings.Contains(l, `"event":"started"`) {
		t.Fatalf("first event %q, want started", l)
	}
	pw.Write([]byte(`{"event":"cancel"}` + "\n"))
	evs = readEvents(t, br)
	resp.Body.Close()
	pw.Close()
	if len(evs) == 0 || evs[len(evs)-1].Event != "result" || !evs[len(evs)-1].Result.Canceled || evs[len(evs)-1].Result.ExitCode == 0 {
		t.Errorf("cancel after the start: %+v", evs)
	}
	status, evs, b = post(`{"argv":["sleep","300"]}`, `{"event":"signal","signal":15}`)
	if r := evs[len(evs)-1].Result; status != 200 || r == nil || r.ExitCode != 143 || r.Signal != 15 || r.Canceled {
		t.Errorf("signal event: %d %s", status, b)
	}
	status, evs, b = post(`{"command":"cat; echo \"[$X]\"","env":{"X":"y"}}`, stdin("shell "))
	if status != 200 || streamed(evs, "stdout") != "shell [y]\n" || evs[len(evs)-1].Result.Stdout != "shell [y]\n" {
		t.Errorf("shell mode with stdin events: %d %s", status, b)
	}
}

// Jobs through the API: start (argv and command), list, logs from an offset as
// NDJSON with offsets, follow until the end, kill.
func TestServeJobs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.serve()
	status, b := d.call("POST", "/v1/sessions/jobs:1/jobs", `{"command":"printf 'abc\ndef\n'; exit 3","env":{"A":"1"}}`)
	var j apiv1.Job
	if status != http.StatusCreated || json.Unmarshal(b, &j) != nil || j.ID == "" || j.Argv[0] != "/bin/sh" {
		t.Fatalf("job start: %d %s", status, b)
	}
	status, b = d.call("GET", "/v1/sessions/jobs:1/jobs/"+j.ID+"/logs?follow=true", "")
	var evs []apiv1.LogEvent
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev apiv1.LogEvent
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		evs = append(evs, ev)
	}
	var out strings.Builder
	for _, ev := range evs {
		if ev.Event == "output" {
			out.Write(ev.Data)
		}
	}
	end := evs[len(evs)-1]
	if status != 200 || out.String() != "abc\ndef\n" || end.Event != "end" || !end.Ended || end.ExitCode != 3 || end.Offset != 8 {
		t.Errorf("logs --follow: %d %s", status, b)
	}
	status, b = d.call("GET", "/v1/sessions/jobs:1/jobs/"+j.ID+"/logs?offset=4", "")
	if status != 200 || !strings.Contains(string(b), `{"event":"output","offset":4,"data":"`+base64.StdEncoding.EncodeToString([]byte("def\n"))+`"}`) {
		t.Errorf("logs from offset 4: %d %s", status, b)
	}
	status, b = d.call("GET", "/v1/sessions/jobs:1/jobs/"+j.ID+"/logs?offset=-1", "")
	wantError(t, "a negative offset", status, b, 400, "invalid", "offset")
	if status, b = d.call("POST", "/v1/sessions/jobs:1/jobs", `{"argv":["sleep","300"]}`); status != http.StatusCreated || json.Unmarshal(b, &j) != nil {
		t.Fatalf("second job: %d %s", status, b)
	}
	status, b = d.call("GET", "/v1/sessions/jobs:1/jobs", "")
	var jobs []apiv1.Job
	if status != 200 || json.Unmarshal(b, &jobs) != nil || len(jobs) != 2 || !jobs[1].Running {
		t.Errorf("job list: %d %s", status, b)
	}
	if status, b := d.call("POST", "/v1/sessions/jobs:1/jobs/"+j.ID+"/kill", ""); status != http.StatusNoContent {
		t.Errorf("kill: %d %s", status, b)
	}
	status, b = d.call("POST", "/v1/sessions/jobs:1/jobs/nosuch/kill", "")
	wantError(t, "kill of an unknown job", status, b, 404, "not_found")
	status, b = d.call("POST", "/v1/sessions/jobs:1/jobs", `{"argv":["true"],"command":"true"}`)
	wantError(t, "argv and command", status, b, 400, "invalid", "not both")
}

// One docker session run embedded and through the daemon: the same output and exit
// codes, plain, --json and shell mode (skipped without an engine, except under CI).
func TestDaemonParityDocker(t *testing.T) {
	testimage.RequireEngine(t)
	t.Parallel()
	e := newDockerEnv(t)
	d := e.serve()
	for _, args := range [][]string{
		{"exec", "-s", "d:1", "--", "sh", "-c", "echo out; echo err >&2; exit 3"},
		{"exec", "-s", "d:1", "--json", "--", "sh", "-c", "echo out; exit 4"},
		{"exec", "-s", "d:1", "-i", "--", "wc", "-c"},
		{"exec", "-s", "d:1", "--shell", "cd /tmp && echo $PWD"},
		{"sessions"},
	} {
		emb := e.runIn(strings.NewReader("12345"), 2*time.Minute, append([]string{"--no-daemon"}, args...)...)
		n := len(d.logs("exec"))
		dae := e.runIn(strings.NewReader("12345"), 2*time.Minute, args...)
		if emb.code != dae.code || normalize(emb.stdout) != normalize(dae.stdout) || emb.stderr != dae.stderr {
			t.Errorf("berth %q differs:\nembedded: %v\ndaemon:   %v", args, emb, dae)
		}
		if args[0] == "exec" { // the daemon logs the call once its answer has ended
			testwait.Until(t, fmt.Sprintf("the daemon to log berth %q", args), func() bool { return len(d.logs("exec")) > n })
		}
	}
}

// newDockerEnv is an env whose every session runs on docker, with the test image
// imported.
func newDockerEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	importImage(t, e, "docker")
	e.config = e.writeFile("config.hcl", fmt.Sprintf("scope \"*\" {\n  driver = \"docker\"\n  image  = %q\n}\n", testimage.Ref))
	return e
}
