package cli

// These tests run the real berth binary (built once, static, by internal/testsupport/testbin) the way
// a user does. Every test has its own state dir and an empty XDG_CONFIG_HOME, so no user
// config leaks in, and removes its sessions when it ends; a test fails when a process
// that belongs to its state dir is still alive afterwards. Processes are found through
// /proc by a marker that the test puts in their environment (BERTH_T_MARK=...), or by
// the state dir's path (which holds a random token), never by a shared name.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testproc"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/server/apiv1"
)

var berthBin string

func TestMain(m *testing.M) { os.Exit(testbin.Main(m, &berthBin)) }

// ---- environment and running berth ----

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// markVar is the environment variable that marks a test's processes.
const markVar = "BERTH_T_MARK"

func newMark() string { return "m" + randHex(8) }

// markEnv is the -e argument that marks a command's processes with mark.
func markEnv(mark string) string { return markVar + "=" + mark }

// env is one test's berth installation: its state dir, an empty config home and
// optionally a config file. dir is scratch space that outlives the test's cleanup.
type env struct {
	t      *testing.T
	dir    string
	state  string
	xdg    string
	config string
	extra  []string // more KEY=VALUE for every berth run
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvAt(t, "")
}

// newEnvAt makes an env whose state dir is state ("" for a fresh one under a temp dir).
func newEnvAt(t *testing.T, state string) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir(), xdg: t.TempDir()}
	if state == "" {
		state = filepath.Join(t.TempDir(), "state-"+randHex(6))
	}
	e.state = state
	t.Cleanup(e.cleanup)
	return e
}

// with returns the env for a subtest: its helpers fail t, not the parent test.
func (e *env) with(t *testing.T) *env {
	c := *e
	c.t = t
	return &c
}

// writeFile writes a file into the env's scratch dir and returns its path.
func (e *env) writeFile(name, content string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) environ() []string {
	out := benchutil.CLIEnv(e.xdg, "BERTH_STATE_DIR="+e.state)
	if e.config != "" {
		out = append(out, "BERTH_CONFIG="+e.config)
	}
	return append(out, e.extra...)
}

type result struct {
	stdout, stderr string
	code           int
	dur            time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout: %q\nstderr: %q", r.code, r.dur.Round(time.Millisecond), clip(r.stdout), clip(r.stderr))
}

func clip(s string) string {
	if len(s) > 2000 {
		return s[:1000] + fmt.Sprintf("...(%d bytes)...", len(s)-2000) + s[len(s)-1000:]
	}
	return s
}

// command returns berth args as an exec.Cmd in the env.
func (e *env) command(args ...string) *exec.Cmd {
	cmd := exec.Command(berthBin, args...)
	cmd.Env = e.environ()
	// A process that keeps berth's stdout or stderr open after berth exits would make
	// Wait hang: bound it, and report it as a failure.
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// try runs berth with stdin (nil: /dev/null) and kills it after limit.
func (e *env) try(stdin io.Reader, limit time.Duration, args ...string) (result, error) {
	cmd := e.command(args...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	timer := time.AfterFunc(limit, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	expired := !timer.Stop()
	r := result{stdout: out.String(), stderr: errb.String(), dur: time.Since(start), code: cmd.ProcessState.ExitCode()}
	switch {
	case expired:
		return r, fmt.Errorf("berth %q did not finish within %v (killed)\n%v", args, limit, r)
	case errors.Is(err, exec.ErrWaitDelay):
		return r, fmt.Errorf("berth %q exited but something kept its output open\n%v", args, r)
	case err != nil && !isExitError(err):
		return r, fmt.Errorf("berth %q: %v", args, err)
	}
	return r, nil
}

func isExitError(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}

// run runs berth and fails the test when it cannot be run or hangs.
func (e *env) run(args ...string) result {
	e.t.Helper()
	r, err := e.try(nil, 2*time.Minute, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// runIn runs berth with stdin and a time limit.
func (e *env) runIn(stdin io.Reader, limit time.Duration, args ...string) result {
	e.t.Helper()
	r, err := e.try(stdin, limit, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// must runs berth and fails the test unless it exits 0.
func (e *env) must(args ...string) result {
	e.t.Helper()
	r := e.run(args...)
	if r.code != 0 {
		e.t.Fatalf("berth %q: want exit 0\n%v", args, r)
	}
	return r
}

// sessionRow is one row of `berth sessions --json`.
type sessionRow struct {
	Session  string    `json:"session"`
	Driver   string    `json:"driver"`
	Sandbox  string    `json:"sandbox"`
	Scope    string    `json:"scope"`
	State    string    `json:"state"`
	LastUsed time.Time `json:"last_used"`
	Drift    bool      `json:"drift"`
}

func (e *env) sessions() []sessionRow {
	e.t.Helper()
	r := e.must("sessions", "--json")
	var rows []sessionRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		e.t.Fatalf("sessions --json: %v\n%v", err, r)
	}
	return rows
}

func findSession(rows []sessionRow, name string) (sessionRow, bool) {
	for _, r := range rows {
		if r.Session == name {
			return r, true
		}
	}
	return sessionRow{}, false
}

// cleanup removes every session of the env and checks that no process of its state
// dir is left; leftovers fail the test and are killed by pid.
func (e *env) cleanup() {
	t := e.t
	if _, err := os.Stat(filepath.Join(e.state, "state.db")); err == nil {
		for round := 0; round < 3; round++ {
			r, err := e.try(nil, time.Minute, "sessions", "--json")
			var rows []sessionRow
			if err != nil || r.code != 0 || json.Unmarshal([]byte(r.stdout), &rows) != nil {
				t.Errorf("cleanup: berth sessions --json failed: %v\n%v", err, r)
				break
			}
			if len(rows) == 0 {
				break
			}
			for _, row := range rows {
				e.try(nil, time.Minute, "rm", row.Session) // a shared sandbox's second rm has nothing to do
			}
		}
	}
	var left []procInfo
	testwait.For(context.Background(), 0, func() bool {
		left = procsOf(e.state)
		return len(left) == 0
	})
	if len(left) > 0 {
		t.Errorf("processes of state dir %s still alive after removing its sessions:\n%s", e.state, describe(left))
		for _, p := range left {
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

// ---- processes ----

type procInfo struct {
	pid, ppid int
	state     byte
	cmdline   []string
	environ   []string
}

func (p procInfo) String() string {
	return fmt.Sprintf("pid %d ppid %d state %c: %q", p.pid, p.ppid, p.state, p.cmdline)
}

func describe(ps []procInfo) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "  %v\n", p)
	}
	return b.String()
}

// readProc reads one process; ok is false when it is gone.
func readProc(pid int) (procInfo, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return procInfo{}, false
	}
	p := procInfo{pid: pid, state: f[0][0]}
	p.ppid, _ = strconv.Atoi(f[1])
	split := func(b []byte) []string {
		b = bytes.TrimRight(b, "\x00")
		if len(b) == 0 {
			return nil
		}
		return strings.Split(string(b), "\x00")
	}
	if b, err := os.ReadFile(dir + "/cmdline"); err == nil {
		p.cmdline = split(b)
	}
	if b, err := os.ReadFile(dir + "/environ"); err == nil {
		p.environ = split(b)
	}
	return p, true
}

// liveProcs returns every process that is not a zombie and matches keep.
func liveProcs(keep func(procInfo) bool) []procInfo {
	var out []procInfo
	testproc.Find(func(pid int) bool {
		if p, ok := readProc(pid); ok && p.state != 'Z' && p.state != 'X' && keep(p) {
			out = append(out, p)
		}
		return false
	})
	return out
}

// marked returns the live processes whose environment carries BERTH_T_MARK=mark.
func marked(mark string) []procInfo {
	want := markEnv(mark)
	return liveProcs(func(p procInfo) bool { return slices.Contains(p.environ, want) })
}

// procsOf returns the live processes whose argv or environment names the state dir
// (the plugin, the agents and every process in their sandboxes, whose HOME is there).
func procsOf(state string) []procInfo {
	return liveProcs(func(p procInfo) bool {
		for _, s := range append(slices.Clone(p.cmdline), p.environ...) {
			if strings.Contains(s, state) {
				return true
			}
		}
		return false
	})
}

func pids(ps []procInfo) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.pid)
	}
	sort.Ints(out)
	return out
}

// ---- a running berth with its stdout read line by line ----

type running struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *testwait.Buffer
	all    []string
}

func (e *env) start(args ...string) *running {
	e.t.Helper()
	cmd := e.command(args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	r := &running{cmd: cmd, lines: make(chan string, 100), stderr: &testwait.Buffer{}}
	cmd.Stderr = r.stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		defer close(r.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
	}()
	e.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return r
}

// expect reads lines until want; it fails the test at EOF or after
// testwait.Limit (a safety net).
func (r *running) expect(t *testing.T, want string) {
	t.Helper()
	timeout := testwait.Limit
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatalf("berth's stdout ended before %q; lines %q; stderr %q", want, r.all, r.stderr.String())
			}
			r.all = append(r.all, l)
			if l == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %q on berth's stdout within %v; lines %q; stderr %q", want, timeout, r.all, r.stderr.String())
		}
	}
}

// finish reads the rest of stdout and waits for berth to exit, within
// testwait.Limit (a safety net); it returns the exit code.
func (r *running) finish(t *testing.T) int {
	t.Helper()
	timeout := testwait.Limit
	deadline := time.After(timeout)
	for open := true; open; {
		select {
		case l, ok := <-r.lines:
			if ok {
				r.all = append(r.all, l)
			}
			open = ok
		case <-deadline:
			t.Fatalf("berth did not exit within %v; lines %q; stderr %q", timeout, r.all, r.stderr.String())
		}
	}
	err := r.cmd.Wait()
	if err != nil && !isExitError(err) {
		t.Fatalf("waiting for berth: %v", err)
	}
	return r.cmd.ProcessState.ExitCode()
}

// ---- the tests ----

// Done when: `berth exec -- sh -c 'echo hello; exit 3'` prints hello and exits 3.
func TestExecHello(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run("exec", "--", "sh", "-c", "echo hello; exit 3")
	if r.code != 3 || r.stdout != "hello\n" || r.stderr != "" {
		t.Fatalf("want hello and exit 3, nothing on stderr\n%v", r)
	}
}

// Done when: `berth exec --timeout 1s -- sh -c 'sleep 300 & sleep 300'` exits 124
// within 3 s and no sleep survives.
func TestExecTimeoutKillsTree(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--", "true") // the sandbox exists: time only the timeout
	mark := newMark()
	r := e.run("exec", "-e", markEnv(mark), "--timeout", "1s", "--", "sh", "-c", "sleep 300 & sleep 300")
	if r.code != 124 || !strings.Contains(r.stderr, "berth: the command timed out after 1s (--timeout)") {
		t.Fatalf("want exit 124 and a note on stderr\n%v", r)
	}
	// Not before the timeout, and ended by it, not by the sleeps (300 s): how soon
	// after it depends on the machine's load and is not checked.
	if r.dur < time.Second || r.dur >= 300*time.Second {
		t.Errorf("berth exited after %v; want at least the 1 s timeout and less than the sleeps' 300 s", r.dur)
	}
	// The result is sent only after the tree is gone: nothing may be left right now.
	if left := marked(mark); len(left) > 0 {
		t.Fatalf("processes of the timed-out command survive:\n%s", describe(left))
	}
}

func TestExecExitCodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--", "true")
	noExec := e.writeFile("not-executable", "#!/bin/sh\necho should-not-run\n")
	for _, c := range []struct {
		name     string
		argv     []string
		code     int
		inStderr []string
	}{
		{"0", []string{"true"}, 0, nil},
		{"1", []string{"false"}, 1, nil},
		{"43", []string{"sh", "-c", "exit 43"}, 43, nil},
		{"127-not-found", []string{"berth-test-no-such-command"}, 127, []string{"berth-test-no-such-command", "not found"}},
		{"126-not-executable", []string{noExec}, 126, []string{noExec, "permission denied"}},
		{"137-sigkill", []string{"sh", "-c", "kill -KILL $$"}, 137, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := e.with(t)
			r := e.run(append([]string{"exec", "--"}, c.argv...)...)
			if r.code != c.code {
				t.Fatalf("want exit %d\n%v", c.code, r)
			}
			if r.stdout != "" {
				t.Errorf("want no stdout\n%v", r)
			}
			for _, s := range c.inStderr {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("stderr does not say %q\n%v", s, r)
				}
			}
			if c.inStderr == nil && r.stderr != "" {
				t.Errorf("want no stderr\n%v", r)
			}
		})
	}
}

// execJSONKeys are the keys of `berth exec --json`, and no others.
var execJSONKeys = []string{"driver", "duration_ms", "exit_code", "oom_killed", "pooled", "recreated", "sandbox", "session", "signal",
	"stderr", "stderr_truncated_bytes", "stdout", "stdout_truncated_bytes", "timed_out"}

var sandboxName = regexp.MustCompile(`^b-[0-9a-f]{8}-[0-9a-f]{16}$`)

// decodeOne decodes stdout as exactly one JSON object.
func decodeOne(t *testing.T, r result, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	if err := dec.Decode(v); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%v", err, r)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("stdout holds more than one JSON value\n%v", r)
	}
}

var markerRE = regexp.MustCompile(`\n\[\.\.\. (\d+) bytes truncated \.\.\.\]\n`)

// checkCapped checks a capped JSON stream: within cap bytes, a prefix of full, the
// marker with the right count, a suffix of full.
func checkCapped(t *testing.T, name, got string, truncated int64, full string, capBytes int) {
	t.Helper()
	if len(got) > capBytes {
		t.Errorf("%s is %d bytes, over the cap of %d", name, len(got), capBytes)
	}
	loc := markerRE.FindStringSubmatchIndex(got)
	if loc == nil {
		t.Fatalf("%s has no truncation marker: %q", name, clip(got))
	}
	n, _ := strconv.ParseInt(got[loc[2]:loc[3]], 10, 64)
	if n != truncated {
		t.Errorf("%s: marker says %d bytes truncated, %s_truncated_bytes says %d", name, n, name, truncated)
	}
	head, tail := got[:loc[0]], got[loc[1]:]
	if !strings.HasPrefix(full, head) || !strings.HasSuffix(full, tail) {
		t.Errorf("%s: head %q or tail %q is not the output's", name, clip(head), clip(tail))
	}
	if len(head) == 0 || len(tail) == 0 {
		t.Errorf("%s: want both head and tail, have %d and %d bytes", name, len(head), len(tail))
	}
	if kept := int64(len(head) + len(tail)); kept+truncated != int64(len(full)) {
		t.Errorf("%s: %d bytes kept + %d truncated != %d written", name, kept, truncated, len(full))
	}
	if capBytes-len(got) > 8 {
		t.Errorf("%s: %d bytes, far under the cap of %d", name, len(got), capBytes)
	}
}

func TestExecJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--", "true")

	t.Run("fields", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		r := e.run("exec", "--json", "--", "sh", "-c", `printf 'out\377\n'; printf 'err\n' >&2; exit 5`)
		if r.code != 5 {
			t.Fatalf("want exit 5 (the command's) with --json\n%v", r)
		}
		var m map[string]any
		decodeOne(t, r, &m)
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if !slices.Equal(keys, execJSONKeys) {
			t.Errorf("keys %v; want %v", keys, execJSONKeys)
		}
		want := map[string]any{
			"exit_code": 5.0, "signal": 0.0, "timed_out": false, "oom_killed": false, "session": "main",
			"driver": "local", "stdout": "out\uFFFD\n", "stderr": "err\n",
			"stdout_truncated_bytes": 0.0, "stderr_truncated_bytes": 0.0, "recreated": false,
		}
		for k, v := range want {
			if m[k] != v {
				t.Errorf("%s = %#v; want %#v", k, m[k], v)
			}
		}
		if d, ok := m["duration_ms"].(float64); !ok || d < 0 || d > 60000 {
			t.Errorf("duration_ms = %#v", m["duration_ms"])
		}
		if s, _ := m["sandbox"].(string); !sandboxName.MatchString(s) {
			t.Errorf("sandbox = %#v; want a b-OWNER8-HASH16 name", m["sandbox"])
		}
		if r.stderr != "" {
			t.Errorf("with --json the command's stderr belongs in the object, not on berth's stderr\n%v", r)
		}
	})

	t.Run("signal-and-timeout", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		var res apiv1.ExecResult
		r := e.run("exec", "--json", "--", "sh", "-c", "kill -KILL $$")
		decodeOne(t, r, &res)
		if r.code != 137 || res.ExitCode != 137 || res.Signal != 9 || res.TimedOut {
			t.Errorf("SIGKILL: want exit 137, signal 9\n%v", r)
		}
		res = apiv1.ExecResult{}
		r = e.run("exec", "--json", "--timeout", "300ms", "--", "sh", "-c", "echo before; sleep 300")
		decodeOne(t, r, &res)
		if r.code != 124 || !res.TimedOut || res.Stdout != "before\n" {
			t.Errorf("timeout: want exit 124, timed_out and the output so far\n%v", r)
		}
	})

	t.Run("max-output-1000", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		r := e.run("exec", "--json", "--max-output", "1000", "--", "sh", "-c",
			`echo HEAD; head -c 1048576 /dev/zero | tr '\0' x; echo TAIL; printf 'small' >&2`)
		var res apiv1.ExecResult
		decodeOne(t, r, &res)
		if r.code != 0 {
			t.Fatalf("want exit 0\n%v", r)
		}
		full := "HEAD\n" + strings.Repeat("x", 1<<20) + "TAIL\n"
		checkCapped(t, "stdout", res.Stdout, res.StdoutTruncatedBytes, full, 1000)
		if res.Stderr != "small" || res.StderrTruncatedBytes != 0 {
			t.Errorf("stderr %q, %d truncated; want it whole", res.Stderr, res.StderrTruncatedBytes)
		}
	})

	t.Run("default-cap-1MiB-per-stream", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		r := e.run("exec", "--json", "--", "sh", "-c",
			`head -c 2097152 /dev/zero | tr '\0' o; head -c 1572864 /dev/zero | tr '\0' e >&2`)
		var res apiv1.ExecResult
		decodeOne(t, r, &res)
		checkCapped(t, "stdout", res.Stdout, res.StdoutTruncatedBytes, strings.Repeat("o", 2<<20), 1<<20)
		checkCapped(t, "stderr", res.Stderr, res.StderrTruncatedBytes, strings.Repeat("e", 3<<19), 1<<20)
	})

	t.Run("invalid-utf8-within-cap", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		// 200 bytes: every other one invalid, each replaced by the 3-byte U+FFFD.
		r := e.run("exec", "--json", "--max-output", "100", "--", "sh", "-c",
			`i=0; while [ $i -lt 100 ]; do printf '\377a'; i=$((i+1)); done`)
		var res apiv1.ExecResult
		decodeOne(t, r, &res)
		if len(res.Stdout) > 100 {
			t.Errorf("stdout is %d bytes after replacing invalid UTF-8, over the cap of 100: %q", len(res.Stdout), res.Stdout)
		}
		loc := markerRE.FindStringSubmatchIndex(res.Stdout)
		if loc == nil || !strings.HasPrefix(res.Stdout, "\uFFFDa") || !strings.HasSuffix(res.Stdout, "\uFFFDa") {
			t.Fatalf("want head, marker and tail: %q", res.Stdout)
		}
		// Every raw byte shown is an a, or a \377 shown as U+FFFD.
		shown := res.Stdout[:loc[0]] + res.Stdout[loc[1]:]
		kept := int64(strings.Count(shown, "a") + strings.Count(shown, "\uFFFD"))
		if kept+res.StdoutTruncatedBytes != 200 {
			t.Errorf("%d bytes shown + %d truncated != 200 written: %q", kept, res.StdoutTruncatedBytes, res.Stdout)
		}
	})

	t.Run("utf8-not-split-at-cap", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		// 1000 two-byte characters; odd cap, so a byte cut would split one.
		r := e.run("exec", "--json", "--max-output", "101", "--", "sh", "-c",
			`i=0; while [ $i -lt 1000 ]; do printf 'é'; i=$((i+1)); done`)
		var res apiv1.ExecResult
		decodeOne(t, r, &res)
		if len(res.Stdout) > 101 || strings.Contains(res.Stdout, "\uFFFD") || markerRE.FindStringIndex(res.Stdout) == nil {
			t.Errorf("want at most 101 bytes of é and a marker, no replacement character: %q", res.Stdout)
		}
		if loc := markerRE.FindStringSubmatchIndex(res.Stdout); loc != nil {
			kept := int64(loc[0] + len(res.Stdout) - loc[1])
			if kept+res.StdoutTruncatedBytes != 2000 {
				t.Errorf("%d bytes shown + %d truncated != 2000 written", kept, res.StdoutTruncatedBytes)
			}
		}
	})

	t.Run("uncapped-without-json", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		r := e.run("exec", "--", "sh", "-c", `head -c 5242880 /dev/zero | tr '\0' z`)
		if r.code != 0 || len(r.stdout) != 5<<20 || strings.Trim(r.stdout, "z") != "" || r.stderr != "" {
			t.Fatalf("want 5 MiB of z streamed whole, got %d bytes\n%v", len(r.stdout), r)
		}
	})

	t.Run("max-output-without-json", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		r := e.run("exec", "--max-output", "1000", "--", "sh", "-c", `head -c 1048576 /dev/zero | tr '\0' y`)
		if r.code != 0 || r.stdout != strings.Repeat("y", 1000) {
			t.Fatalf("want exactly 1000 bytes of stdout, got %d\n%v", len(r.stdout), r)
		}
		if !strings.Contains(r.stderr, "--max-output") || !strings.Contains(r.stderr, strconv.Itoa(1<<20-1000)) {
			t.Errorf("stderr does not note the %d dropped bytes\n%v", 1<<20-1000, r)
		}
	})
}

// Done when: kill -9 of a `berth exec` running `sleep 300` leaves no plugin and no
// sleep behind, while a process started earlier with & in that session still runs.
// In a session whose sandbox runs, the exec goes to the agent directly: berth has no
// plugin child at all. In a new session the driver's plugin made the sandbox and is
// berth's child while the command runs; it goes with its host.
func TestExecKill9(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bg := newMark()
	e.must("exec", "-e", markEnv(bg), "--", "sh", "-c", "sleep 300 >/dev/null 2>&1 &")
	if len(marked(bg)) != 1 {
		t.Fatalf("the background sleep is not running: %v", marked(bg))
	}
	for _, c := range []struct {
		session    string
		wantPlugin bool
	}{{"main", false}, {"k9:new", true}} {
		fg := newMark()
		r := e.start("exec", "-s", c.session, "-e", markEnv(fg), "--", "sleep", "300")
		berthPid := r.cmd.Process.Pid
		if !testwait.For(context.Background(), 0, func() bool { return len(marked(fg)) > 0 }) {
			t.Fatalf("%s: the foreground sleep never started; stderr %q", c.session, r.stderr.String())
		}
		plugins := liveProcs(func(p procInfo) bool {
			return p.ppid == berthPid && slices.Contains(p.cmdline, "driver") && slices.Contains(p.cmdline, "serve")
		})
		if c.wantPlugin && len(plugins) == 0 {
			t.Fatalf("%s: berth (pid %d) has no `driver serve` child while it runs a command in a sandbox it made", c.session, berthPid)
		}
		if !c.wantPlugin && len(plugins) != 0 {
			t.Errorf("%s: berth (pid %d) started a plugin for an exec in a running sandbox:\n%s", c.session, berthPid, describe(plugins))
		}
		r.cmd.Process.Kill()
		r.cmd.Wait()
		pluginGone := func() bool {
			for _, pl := range plugins {
				if p, ok := readProc(pl.pid); ok && p.state != 'Z' && slices.Equal(p.cmdline, pl.cmdline) {
					return false
				}
			}
			return true
		}
		if !testwait.For(context.Background(), 0, pluginGone) {
			t.Errorf("%s: the plugin outlived its killed host:\n%s", c.session, describe(plugins))
		}
		if !testwait.For(context.Background(), 0, func() bool { return len(marked(fg)) == 0 }) {
			t.Errorf("%s: the foreground sleep outlived the killed berth:\n%s", c.session, describe(marked(fg)))
		}
	}
	if got := marked(bg); len(got) != 1 {
		t.Fatalf("the background sleep started earlier is gone after killing another exec: %v", got)
	}
	e.must("rm", "k9:new")
	e.must("rm", "main")
	if !testwait.For(context.Background(), 0, func() bool { return len(marked(bg)) == 0 }) {
		t.Errorf("berth rm main left the background sleep running:\n%s", describe(marked(bg)))
	}
}

// A process one exec leaves in the background is alive during the next exec, a
// different berth process.
func TestExecBackgroundSurvivesNextExec(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mark := newMark()
	r := e.must("exec", "-e", markEnv(mark), "--", "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!")
	pid := strings.TrimSpace(r.stdout)
	if _, err := strconv.Atoi(pid); err != nil {
		t.Fatalf("no pid printed\n%v", r)
	}
	r = e.run("exec", "--", "sh", "-c",
		fmt.Sprintf(`kill -0 %s && tr '\0' '\n' </proc/%s/environ | grep -x %s`, pid, pid, markEnv(mark)))
	if r.code != 0 || r.stdout != markEnv(mark)+"\n" {
		t.Fatalf("the background sleep (pid %s) is not alive inside the next exec\n%v", pid, r)
	}
}

func TestExecSignals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--", "true")

	t.Run("SIGTERM-forwarded", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		mark := newMark()
		r := e.start("exec", "-e", markEnv(mark), "--", "sh", "-c",
			`trap "echo got-term; exit 7" TERM; echo ready; while :; do sleep 0.1; done`)
		r.expect(t, "ready")
		r.cmd.Process.Signal(syscall.SIGTERM)
		r.expect(t, "got-term")
		if code := r.finish(t); code != 7 {
			t.Fatalf("want exit 7 from the command's trap, got %d; stderr %q", code, r.stderr.String())
		}
		if left := marked(mark); len(left) > 0 {
			t.Errorf("processes left:\n%s", describe(left))
		}
	})

	t.Run("second-SIGINT-kills", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		mark := newMark()
		r := e.start("exec", "-e", markEnv(mark), "--", "sh", "-c",
			`trap "echo got-int" INT; echo ready; while :; do sleep 0.1; done`)
		r.expect(t, "ready")
		r.cmd.Process.Signal(syscall.SIGINT)
		r.expect(t, "got-int") // the first is forwarded: the trap runs
		if len(marked(mark)) == 0 {
			t.Fatal("the first SIGINT ended the command")
		}
		r.cmd.Process.Signal(syscall.SIGINT)
		code := r.finish(t)
		if code != 130 && code != 137 && code != 143 {
			t.Errorf("want 130, 137 or 143 after the second SIGINT, got %d; stderr %q", code, r.stderr.String())
		}
		if left := marked(mark); len(left) > 0 {
			t.Errorf("the second SIGINT left processes of the tree:\n%s", describe(left))
		}
	})
}

func TestExecStdin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--", "true")

	t.Run("-i", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		r := e.runIn(strings.NewReader("abc"), time.Minute, "exec", "-i", "--", "cat")
		if r.code != 0 || r.stdout != "abc" {
			t.Fatalf("want abc\n%v", r)
		}
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
		r = e.runIn(bytes.NewReader(big), time.Minute, "exec", "-i", "--", "sha256sum")
		sum := sha256.Sum256(big)
		if r.code != 0 || !strings.HasPrefix(r.stdout, hex.EncodeToString(sum[:])+" ") {
			t.Fatalf("1 MiB of stdin did not arrive whole\n%v", r)
		}
	})

	t.Run("no-i-is-EOF", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		// berth's stdin is a pipe that never ends: without -i, cat must not see it.
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pw.Close()
		defer pr.Close()
		pw.Write([]byte("not for cat"))
		r := e.runIn(pr, testwait.Limit, "exec", "--", "cat")
		if r.code != 0 || r.stdout != "" {
			t.Fatalf("want cat to get EOF at once and print nothing\n%v", r)
		}
	})
}

func TestExecEnvAndWorkdir(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.must("exec", "-e", "BERTH_T_A=one", "-e", "BERTH_T_B=a b=c", "--", "sh", "-c", `printf '%s|%s' "$BERTH_T_A" "$BERTH_T_B"`)
	if r.stdout != "one|a b=c" {
		t.Errorf("-e values not seen by the command\n%v", r)
	}
	r = e.must("exec", "--", "sh", "-c", `test -z "$BERTH_T_A" && test "$(pwd)" = "$HOME" && echo ok`)
	if r.stdout != "ok\n" {
		t.Errorf("-e leaked into the next exec, or the default cwd is not the sandbox home\n%v", r)
	}
	r = e.must("exec", "-w", e.dir, "--", "pwd")
	if strings.TrimSpace(r.stdout) != e.dir {
		t.Errorf("-w %s: pwd says %q", e.dir, r.stdout)
	}
	missing := filepath.Join(e.dir, "no-such-dir")
	r = e.run("exec", "-w", missing, "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, missing) {
		t.Errorf("-w %s: want exit 125 naming the dir\n%v", missing, r)
	}
	r = e.run("exec", "-e", "NOEQUALS", "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, "NOEQUALS") {
		t.Errorf("-e NOEQUALS: want exit 125 naming it\n%v", r)
	}
}

// Usage mistakes are named, with the fix, before anything runs: a session name left
// out after -s (pflag takes the "--" as it), a command's missing argument.
func TestUsageMistakes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"exec", "-s", "--", "touch", filepath.Join(e.dir, "ran")}, `the session name is missing (-s took the "--" after it)`},
		{[]string{"exec", "-s", "--", "--shell", "touch " + filepath.Join(e.dir, "ran")}, `the session name is missing`},
		{[]string{"exec", "-s", "--"}, `the session name is missing`},
		{[]string{"job", "start", "-s", "--", "touch", filepath.Join(e.dir, "ran")}, `the session name is missing`},
		{[]string{"cp", "-s", "--", e.dir, ":/tmp/x"}, `the session name is missing`},
		{[]string{"shell", "-s", "--"}, `the session name is missing`},
		{[]string{"stop"}, "stop: want 1 argument, got none (usage: berth stop SESSION"},
		{[]string{"rm", "a", "b"}, `rm: want 1 argument, got 2 (["a" "b"])`},
		{[]string{"config", "explain"}, "config explain: want 1 argument, got none (usage: berth config explain SESSION"},
		{[]string{"cp", "x"}, "cp: want 2 arguments, got 1"},
	} {
		if r := e.run(c.args...); r.code != 125 || !strings.Contains(r.stderr, c.says) {
			t.Errorf("berth %q: want exit 125 saying %q\n%v", c.args, c.says, r)
		}
	}
	if _, err := os.Stat(filepath.Join(e.dir, "ran")); err == nil {
		t.Error("a command ran")
	}
	if r := e.must("exec", "--help"); strings.Contains(r.stdout, "(default -1)") {
		t.Errorf("exec --help shows --max-output's internal default\n%v", r)
	}
}

const scopesConfig = `# test config
scope "chat:*" {
  driver    = "local"
  isolation = "session"
}

scope "gone:*" {
  driver = "local"
  retention {
    on_close = "remove"
  }
}

scope "stop:*" {
  driver = "local"
  retention {
    on_close = "stop"
  }
}

scope "*" {
  driver = "local"
}
`

func TestConfigScopes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", scopesConfig)

	r := e.must("config", "check")
	if !strings.Contains(r.stdout, "ok, 4 scope rules") {
		t.Errorf("config check of a good file\n%v", r)
	}
	r = e.must("config", "explain", "chat:7")
	for _, s := range []string{`scope "chat:*"`, e.config + ":2:1", "driver:    local", "isolation: session"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("config explain chat:7 does not say %q\n%v", s, r)
		}
	}
	var ex struct {
		Session   string `json:"session"`
		Rule      string `json:"rule"`
		RuleIndex int    `json:"rule_index"`
		Position  string `json:"position"`
		Driver    string `json:"driver"`
		Isolation string `json:"isolation"`
		Sandbox   string `json:"sandbox"`
		Retention struct {
			OnClose string `json:"on_close"`
		} `json:"retention"`
	}
	r = e.must("config", "explain", "--json", "chat:7")
	decodeOne(t, r, &ex)
	if ex.Session != "chat:7" || ex.Rule != "chat:*" || ex.RuleIndex != 0 || ex.Position != e.config+":2:1" ||
		ex.Driver != "local" || ex.Isolation != "session" || !sandboxName.MatchString(ex.Sandbox) || ex.Retention.OnClose != "keep" {
		t.Errorf("config explain --json chat:7: %+v", ex)
	}
	r = e.must("config", "explain", "--json", "other")
	decodeOne(t, r, &ex)
	if ex.Rule != "*" || ex.RuleIndex != 3 {
		t.Errorf("config explain --json other: %+v", ex)
	}

	// Files written in chat:1 are not in chat:2's home.
	e.must("exec", "-s", "chat:1", "--", "touch", "f1")
	home1 := strings.TrimSpace(e.must("exec", "-s", "chat:1", "--", "sh", "-c", "test -f f1 && pwd").stdout)
	r = e.must("exec", "-s", "chat:2", "--", "sh", "-c", "pwd; ls -A")
	home2 := strings.TrimSpace(r.stdout)
	if home1 == "" || home1 == home2 || strings.Contains(home2, "\n") {
		t.Fatalf("chat:1's home %q, chat:2's pwd and files %q: want an empty home of its own", home1, r.stdout)
	}
	if _, err := os.Stat(filepath.Join(home1, "f1")); err != nil {
		t.Errorf("f1 is not in chat:1's home: %v", err)
	}

	rows := e.sessions()
	if len(rows) != 2 {
		t.Fatalf("sessions: want chat:1 and chat:2, got %+v", rows)
	}
	s1, ok1 := findSession(rows, "chat:1")
	s2, ok2 := findSession(rows, "chat:2")
	if !ok1 || !ok2 || s1.Driver != "local" || s2.Driver != "local" || s1.State != "running" || s2.State != "running" ||
		s1.Sandbox == s2.Sandbox || s1.Scope != "chat:*" || s1.LastUsed.IsZero() || s1.Drift {
		t.Errorf("sessions: %+v", rows)
	}
	var raw []map[string]any
	if err := json.Unmarshal([]byte(e.must("sessions", "--json").stdout), &raw); err != nil || len(raw) == 0 {
		t.Fatalf("sessions --json: %v, %v", raw, err)
	}
	for _, k := range []string{"session", "driver", "sandbox", "state", "last_used", "drift"} {
		if _, ok := raw[0][k]; !ok {
			t.Errorf("sessions --json has no key %q: %v", k, raw[0])
		}
	}

	// on_close default keep: close leaves the sandbox and its files.
	e.must("close", "chat:1")
	if s, ok := findSession(e.sessions(), "chat:1"); !ok || s.State != "running" {
		t.Errorf("after close of a keep session: %+v, %v", s, ok)
	}
	if _, err := os.Stat(filepath.Join(home1, "f1")); err != nil {
		t.Errorf("close with on_close keep lost f1: %v", err)
	}

	// on_close = "remove": the session is forgotten and its files deleted.
	homeGone := strings.TrimSpace(e.must("exec", "-s", "gone:1", "--", "sh", "-c", "touch g; pwd").stdout)
	sGone, _ := findSession(e.sessions(), "gone:1")
	e.must("close", "gone:1")
	if s, ok := findSession(e.sessions(), "gone:1"); ok {
		t.Errorf("gone:1 is still listed after close with on_close remove: %+v", s)
	}
	for _, p := range []string{homeGone, filepath.Join(e.state, "sandboxes", "local", sGone.Sandbox)} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still exists after close with on_close remove (%v)", p, err)
		}
	}

	// on_close = "stop": the sandbox stops with its processes; the next exec starts it.
	mark := newMark()
	e.must("exec", "-s", "stop:1", "-e", markEnv(mark), "--", "sh", "-c", "sleep 300 >/dev/null 2>&1 &")
	e.must("close", "stop:1")
	if s, ok := findSession(e.sessions(), "stop:1"); !ok || s.State != "stopped" {
		t.Errorf("after close with on_close stop: %+v, listed %v", s, ok)
	}
	if left := marked(mark); len(left) > 0 {
		t.Errorf("processes of a stopped sandbox still run:\n%s", describe(left))
	}
	if r := e.must("exec", "-s", "stop:1", "--", "echo", "again"); r.stdout != "again\n" {
		t.Errorf("exec in a stopped session\n%v", r)
	}

	// rm removes whatever on_close says.
	e.must("rm", "chat:1")
	if _, ok := findSession(e.sessions(), "chat:1"); ok {
		t.Error("chat:1 still listed after rm")
	}
	if _, err := os.Stat(home1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("chat:1's home still exists after rm (%v)", err)
	}
	// rm and close of a session with nothing to do succeed, as stop does.
	for _, args := range [][]string{{"rm", "chat:1"}, {"close", "chat:1"}, {"close", "never:ran"}, {"rm", "never:ran"}, {"close", "gone:1"}} {
		if r := e.run(args...); r.code != 0 || r.stderr != "" {
			t.Errorf("%v of a session with nothing to do: want exit 0, silent\n%v", args, r)
		}
	}
	if r := e.run("close", "a//b"); r.code != 125 || !strings.Contains(r.stderr, "empty path component") {
		t.Errorf("close of a bad name: want 125\n%v", r)
	}
}

// snapshot lists a directory tree with each entry's type and each regular file's
// content hash (size, inode and mtime for files over 1 MiB).
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == root {
			return filepath.SkipAll
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := info.Mode().Type().String()
		switch {
		case info.Mode().IsRegular() && info.Size() > 1<<20:
			// The agent binary (content-addressed, 20+ MiB): hashing it would dominate.
			st := info.Sys().(*syscall.Stat_t)
			desc += fmt.Sprintf(" %d ino %d mtime %v", info.Size(), st.Ino, info.ModTime().UnixNano())
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			desc += fmt.Sprintf(" %d %x", len(b), sum[:8])
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffSnapshots(a, b map[string]string) string {
	var d []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			d = append(d, "- "+k+" "+v)
		} else if w != v {
			d = append(d, "~ "+k+" "+v+" -> "+w)
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			d = append(d, "+ "+k+" "+v)
		}
	}
	sort.Strings(d)
	return strings.Join(d, "\n")
}

// Bad input: each exits 125 with one message on stderr that names the input (with
// file:line:col for config), changes nothing in the state dir and starts nothing that
// stays.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--", "true") // a state dir with a store, a session and its agent

	cfgs := map[string]string{
		"unknown-driver":  "scope \"*\" {\n  driver = \"nosuch\"\n}\n",
		"bad-glob":        "scope \"chat:[\" {\n  driver = \"local\"\n}\n",
		"bad-duration":    "scope \"*\" {\n  driver = \"local\"\n  retention {\n    idle_ttl = \"7x\"\n  }\n}\n",
		"unknown-key":     "scope \"*\" {\n  driver = \"local\"\n  colour = \"red\"\n}\n",
		"driver-setting":  "driver \"local\" {\n  bogus = 1\n}\n",
		"driver-value":    "driver \"containerd\" {\n  seccomp = \"strict\"\n}\n",
		"docker-spec":     "scope \"main\" {\n  driver = \"local\"\n}\nscope \"d:*\" {\n  driver  = \"docker\"\n  image   = \"busybox\"\n  network = \"weird\"\n}\n",
		"containerd-spec": "scope \"c:*\" {\n  driver  = \"containerd\"\n  image   = \"busybox\"\n  network = \"bridge\"\n}\n",
		"local-spec":      "scope \"l:*\" {\n  driver = \"local\"\n  resources { memory = \"1g\" }\n}\n",
	}
	path := map[string]string{}
	for name, src := range cfgs {
		path[name] = e.writeFile(name+".hcl", src)
	}
	regular := e.writeFile("a-regular-file", "not a directory\n")
	missingDir := filepath.Join(e.dir, "no-such-workdir")
	long := strings.Repeat("s", 300)

	type badCase struct {
		name string
		args []string
		want []string // in the message
	}
	var cases []badCase
	for _, c := range []struct{ name, pos, input string }{
		{"unknown-driver", ":2:12", `"nosuch"`},
		{"bad-glob", ":1:7", `"chat:["`},
		{"bad-duration", ":4:16", `"7x"`},
		{"unknown-key", ":3:3", `"colour"`},
		{"driver-setting", ":2:3", `"bogus"`},
	} {
		want := []string{path[c.name] + c.pos, c.input}
		// A new session: a driver block is checked when its driver starts, which a
		// session whose sandbox's agent answers does not need (config check finds it
		// without that).
		cases = append(cases,
			badCase{"exec-" + c.name, []string{"--config", path[c.name], "exec", "-s", "fresh:1", "--", "true"}, want},
			badCase{"check-" + c.name, []string{"config", "check", path[c.name]}, want},
		)
	}
	// A value the driver refuses: config check applies the block to the driver (exec
	// only starts drivers that a rule selects).
	cases = append(cases, badCase{"check-driver-value", []string{"config", "check", path["driver-value"]}, []string{path["driver-value"] + ":1:1", `seccomp "strict"`}})
	// A rule's spec that its driver refuses (Validate through the driver's plugin,
	// no daemon asked): at the rule's position.
	cases = append(cases,
		badCase{"check-docker-spec", []string{"config", "check", path["docker-spec"]}, []string{path["docker-spec"] + ":4:1", `scope "d:*"`, `network "weird"`}},
		badCase{"check-containerd-spec", []string{"config", "check", path["containerd-spec"]}, []string{path["containerd-spec"] + ":1:1", `scope "c:*"`, `network "bridge"`}},
		badCase{"check-local-spec", []string{"config", "check", path["local-spec"]}, []string{path["local-spec"] + ":1:1", `scope "l:*"`, "resource limits are not supported by the local driver"}},
	)
	cases = append(cases,
		badCase{"conformance-run-matches-nothing", []string{"conformance", "--driver", "local", "--run", "^zzz$"}, []string{`"^zzz$"`}},
		badCase{"conformance-junit-unwritable", []string{"conformance", "--driver", "local", "--run", "^exec/exit-code-0$", "--junit", filepath.Join(regular, "r.xml")}, []string{"--junit"}},
		badCase{"session-dotdot", []string{"exec", "-s", "..", "--", "true"}, []string{`".."`}},
		badCase{"session-abs", []string{"exec", "-s", "/abs", "--", "true"}, []string{`"/abs"`}},
		badCase{"session-300", []string{"exec", "-s", long, "--", "true"}, []string{long[:40], "300 characters"}},
		badCase{"workdir-missing", []string{"exec", "-s", "wd:1", "-w", missingDir, "--", "true"}, []string{missingDir}},
		badCase{"state-dir-unwritable", []string{"--state-dir", filepath.Join(regular, "state"), "exec", "--", "true"}, []string{regular}},
		badCase{"rm-bad-session", []string{"rm", ".."}, []string{`".."`}},
		badCase{"max-output-negative", []string{"exec", "--max-output", "-5", "--", "true"}, []string{"--max-output -5"}},
		badCase{"timeout-unit", []string{"exec", "--timeout", "5x", "--", "true"}, []string{`"5x"`, "--timeout"}},
	)

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := e.with(t)
			// Not parallel: each case compares the state dir before and after.
			mark := newMark()
			args := c.args
			if i := slices.Index(args, "exec"); i >= 0 {
				args = slices.Insert(slices.Clone(args), i+1, "-e", markEnv(mark))
			}
			before := snapshot(t, e.state)
			beforeProcs := pids(procsOf(e.state))
			r := e.run(args...)
			if r.code != 125 {
				t.Errorf("want exit 125\n%v", r)
			}
			lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "berth: ") {
				t.Errorf("want one line \"berth: ...\" on stderr\n%v", r)
			}
			for _, w := range c.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("the message does not name %q\n%v", w, r)
				}
			}
			if r.stdout != "" {
				t.Errorf("want nothing on stdout\n%v", r)
			}
			if d := diffSnapshots(before, snapshot(t, e.state)); d != "" {
				t.Errorf("the state dir changed:\n%s", d)
			}
			var extra []int
			if !testwait.For(context.Background(), 0, func() bool {
				extra = nil
				for _, p := range pids(procsOf(e.state)) {
					if !slices.Contains(beforeProcs, p) {
						extra = append(extra, p)
					}
				}
				return len(extra) == 0 && len(marked(mark)) == 0
			}) {
				t.Errorf("new processes stay: pids %v, marked %v", extra, marked(mark))
			}
		})
	}
	if b, err := os.ReadFile(regular); err != nil || string(b) != "not a directory\n" {
		t.Errorf("the regular file under the bad state dir changed: %q, %v", b, err)
	}
	if rows := e.sessions(); len(rows) != 1 || rows[0].Session != "main" {
		t.Errorf("sessions after bad input: %+v", rows)
	}
}

func TestDrivers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.must("drivers")
	var row []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "local" {
			row = f
		}
	}
	// NAME VERSION PROTOCOL SERVED HEALTH CAPABILITIES
	if len(row) < 5 || row[1] == "" || row[2] != "2" || row[3] != "plugin" || row[4] != "ok" {
		t.Errorf("drivers: no healthy local row served through the plugin at protocol 2\n%v", r)
	}

	var list []apiv1.Driver
	r = e.must("drivers", "--json")
	decodeOne(t, r, &list)
	i := slices.IndexFunc(list, func(d apiv1.Driver) bool { return d.Name == "local" })
	if i < 0 || list[i].Version == "" || list[i].Protocol != 2 || list[i].Served != "plugin" || list[i].Health != "ok" ||
		!slices.Equal(list[i].ProtocolVersions, []int{2}) {
		t.Errorf("drivers --json: want local, healthy, served through the plugin at protocol 2: %+v", list)
	}
}

// A driver that fails is "failed [N]" in the table, its message follows the table;
// a relative BERTH_PLUGIN_PATH entry is noted on stderr, not skipped silently.
func TestDriversFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", "driver \"local\" {\n  bogus = 1\n}\nscope \"*\" {\n}\n")
	e.extra = []string{"BERTH_PLUGIN_PATH=rel/dir:" + e.dir}
	r := e.must("drivers")
	row := regexp.MustCompile(`(?m)^local .* plugin +failed \[(\d)\] `).FindStringSubmatch(r.stdout)
	note := regexp.MustCompile(`(?m)^\[(\d)\] local: .*bogus`).FindStringSubmatch(r.stdout)
	if row == nil || note == nil || row[1] != note[1] {
		t.Errorf("drivers: want local's row saying failed [N] and its message after the table as [N] local: ...\n%v", r)
	}
	if !strings.Contains(r.stderr, `BERTH_PLUGIN_PATH entries ["rel/dir"] are skipped: plugin directories must be absolute paths`) {
		t.Errorf("drivers: want a note on the relative BERTH_PLUGIN_PATH entry\n%v", r)
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	t.Run("json-and-junit", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		junit := filepath.Join(e.dir, "report.xml")
		r := e.run("conformance", "--driver", "local", "--run", "^exec/exit-code", "--json", "--junit", junit)
		if r.code != 0 {
			t.Fatalf("want exit 0\n%v", r)
		}
		var rep struct {
			Driver  string `json:"driver"`
			Passed  int    `json:"passed"`
			Failed  int    `json:"failed"`
			Skipped int    `json:"skipped"`
			Cases   []struct {
				Name       string `json:"name"`
				Group      string `json:"group"`
				Status     string `json:"status"`
				DurationMS *int64 `json:"duration_ms"`
			} `json:"cases"`
		}
		decodeOne(t, r, &rep)
		if rep.Driver != "local" || rep.Passed < 3 || rep.Failed != 0 || len(rep.Cases) != rep.Passed+rep.Failed+rep.Skipped {
			t.Errorf("report: %+v", rep)
		}
		for _, c := range rep.Cases {
			if c.Group != "exec" || !strings.HasPrefix(c.Name, "exit-code") || c.Status != "pass" || c.DurationMS == nil {
				t.Errorf("case %+v", c)
			}
		}
		b, err := os.ReadFile(junit)
		if err != nil {
			t.Fatalf("--junit wrote nothing: %v", err)
		}
		var x struct {
			XMLName  xml.Name `xml:"testsuites"`
			Tests    int      `xml:"tests,attr"`
			Failures int      `xml:"failures,attr"`
			Suites   []struct {
				Cases []struct {
					Name string `xml:"name,attr"`
				} `xml:"testcase"`
			} `xml:"testsuite"`
		}
		if err := xml.Unmarshal(b, &x); err != nil {
			t.Fatalf("--junit is not XML: %v\n%s", err, b)
		}
		n := 0
		for _, s := range x.Suites {
			n += len(s.Cases)
		}
		if x.Tests != rep.Passed || x.Failures != 0 || n != len(rep.Cases) {
			t.Errorf("junit: %d tests, %d failures, %d testcases; want %d, 0, %d\n%s", x.Tests, x.Failures, n, rep.Passed, len(rep.Cases), b)
		}
	})

	t.Run("list", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		r := e.must("conformance", "--list")
		for _, c := range []string{"exec/exit-code-0", "exec/timeout-kills-tree", "isolation/sessions-isolated", "lifecycle/long-state-dir"} {
			if !strings.Contains(r.stdout, c) {
				t.Errorf("--list does not list %s\n%v", c, r)
			}
		}
		r = e.must("conformance", "--list", "--run", "^exec/exit-code")
		if n := strings.Count(r.stdout, "exec/exit-code-"); n != 3 || strings.Contains(r.stdout, "lifecycle/") {
			t.Errorf("--list --run ^exec/exit-code: %d exit-code cases\n%v", n, r)
		}
	})

	t.Run("bad-usage", func(t *testing.T) {
		t.Parallel()
		e := e.with(t)
		r := e.run("conformance", "--driver", "local", "--run", "(")
		if r.code != 125 || !strings.Contains(r.stderr, "--run") {
			t.Errorf("--run '(': want 125 naming --run\n%v", r)
		}
		r = e.run("conformance")
		if r.code != 125 || !strings.Contains(r.stderr, "--driver") {
			t.Errorf("no --driver: want 125 naming --driver\n%v", r)
		}
		r = e.run("conformance", "--driver", "nosuch")
		if r.code != 125 || !strings.Contains(r.stderr, "nosuch") {
			t.Errorf("--driver nosuch: want 125 naming it\n%v", r)
		}
	})
}

func TestVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.must("version")
	if !regexp.MustCompile(`^berth \S+ \(driver protocol 2\)\n$`).MatchString(r.stdout) || !strings.Contains(r.stdout, version) {
		t.Errorf("version\n%v", r)
	}
	if _, err := os.Stat(e.state); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("berth version touched the state dir (%v)", err)
	}
}

// Plugin logs go to STATE/berth.log, never into the command's output.
func TestLogs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.must("--log-level", "debug", "exec", "--", "true")
	if r.stdout != "" || r.stderr != "" {
		t.Fatalf("berth exec -- true with debug logs: want no output\n%v", r)
	}
	b, err := os.ReadFile(filepath.Join(e.state, "berth.log"))
	if err != nil {
		t.Fatalf("no log file: %v", err)
	}
	log := string(b)
	// Lines of berth itself, and lines the plugin process wrote on its stderr.
	for _, s := range []string{"[DEBUG]", "driver plugin started", "@module=driver"} {
		if !strings.Contains(log, s) {
			t.Errorf("berth.log has no %q:\n%s", s, log)
		}
	}
	r = e.run("--log-level", "debug", "exec", "--", "sh", "-c", "echo out; echo err >&2")
	if r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("logs leaked into the command's output\n%v", r)
	}
}

// A state dir whose path is 150 bytes long works.
func TestLongStateDir(t *testing.T) {
	t.Parallel()
	base := filepath.Join(t.TempDir(), "s"+randHex(6))
	state := base + "/" + strings.Repeat("d", 150-len(base)-1)
	if len(state) != 150 {
		t.Fatalf("state dir path is %d bytes", len(state))
	}
	e := newEnvAt(t, state)
	mark := newMark()
	e.must("exec", "-e", markEnv(mark), "--", "sh", "-c", "sleep 300 >/dev/null 2>&1 &")
	r := e.must("exec", "--", "sh", "-c", `echo "$HOME"`)
	if !strings.HasPrefix(r.stdout, state+"/") {
		t.Errorf("home %q is not under the state dir", r.stdout)
	}
	if len(marked(mark)) != 1 {
		t.Error("the background process did not survive to the next exec")
	}
	if rows := e.sessions(); len(rows) != 1 || rows[0].State != "running" {
		t.Errorf("sessions: %+v", rows)
	}
	e.must("rm", "main")
	if !testwait.For(context.Background(), 0, func() bool { return len(marked(mark)) == 0 }) {
		t.Error("rm left the background process running")
	}
}

// 20 concurrent berth processes over 5 sessions all succeed, and make 5 sandboxes.
func TestConcurrentExecs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const sessions, each = 5, 4
	type out struct {
		session string
		r       result
		err     error
	}
	results := make(chan out, sessions*each)
	var wg sync.WaitGroup
	for i := 0; i < sessions*each; i++ {
		s := fmt.Sprintf("par:%d", i%sessions)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.try(nil, 2*time.Minute, "exec", "-s", s, "--", "sh", "-c", `echo "$HOME"`)
			results <- out{s, r, err}
		}()
	}
	wg.Wait()
	close(results)
	homes := map[string]map[string]bool{}
	for o := range results {
		if o.err != nil || o.r.code != 0 {
			t.Errorf("session %s: %v\n%v", o.session, o.err, o.r)
			continue
		}
		if homes[o.session] == nil {
			homes[o.session] = map[string]bool{}
		}
		homes[o.session][strings.TrimSpace(o.r.stdout)] = true
	}
	all := map[string]bool{}
	for s, h := range homes {
		if len(h) != 1 {
			t.Errorf("session %s ran in %d sandboxes: %v", s, len(h), h)
		}
		for k := range h {
			all[k] = true
		}
	}
	if len(all) != sessions {
		t.Errorf("%d distinct homes; want %d", len(all), sessions)
	}
	rows := e.sessions()
	sandboxes := map[string]bool{}
	for _, r := range rows {
		if r.State != "running" || r.Driver != "local" {
			t.Errorf("session %+v", r)
		}
		sandboxes[r.Sandbox] = true
	}
	if len(rows) != sessions || len(sandboxes) != sessions {
		t.Errorf("sessions: %d rows over %d sandboxes; want %d and %d: %+v", len(rows), len(sandboxes), sessions, sessions, rows)
	}
	// The driver itself holds exactly one sandbox per session, each recorded (no
	// sandbox that a lost record left unrecorded), and no exec is still marked in
	// flight.
	rep := decodePrune(t, e.must("prune", "--dry-run", "--json"))
	if len(rep.Drivers) != 1 || rep.Drivers[0].Sandboxes != sessions {
		t.Errorf("prune lists %+v, want %d sandboxes on local", rep.Drivers, sessions)
	}
	for _, a := range rep.Actions {
		if a.Sandbox != "" && (a.Action != "keep" || a.Cause != "recorded" || len(a.Sessions) != 1 || !sandboxes[a.Sandbox]) {
			t.Errorf("after concurrent execs, prune says: %+v", a)
		}
	}
	busy, _ := filepath.Glob(filepath.Join(e.state, "locks", "*.busy"))
	if len(busy) != sessions {
		t.Errorf("busy markers %v, want one per sandbox", busy)
	}
	for _, p := range busy {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Errorf("busy marker %s is still held after every berth exec ended: %v", p, err)
		}
		f.Close()
	}
}

// TestConformanceInterrupt: SIGINT during `berth conformance` stops the run after the
// running case's cleanups: no sandbox, agent or temporary directory of the run stays.
func TestConformanceInterrupt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tmp := filepath.Join(e.dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := e.command("conformance", "--driver", "local", "--run", "^exec/")
	cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(errPipe)
	var seen []string
	for sc.Scan() { // interrupt once the first case has passed: the suite is mid-run
		seen = append(seen, sc.Text())
		if strings.HasPrefix(sc.Text(), "pass ") {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, errPipe)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(testwait.Limit):
		cmd.Process.Kill()
		t.Fatalf("berth conformance did not stop within %v of SIGINT; stderr so far %q", testwait.Limit, seen)
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("an interrupted run exited %d, want 130", code)
	}
	// The per-user base of plugin sockets stays (other berths may use it); nothing
	// may be left in it.
	base := filepath.Join(tmp, fmt.Sprintf("berth-%d", os.Getuid()))
	if ents, _ := os.ReadDir(base); len(ents) != 0 {
		t.Errorf("the run left plugin socket dirs in %s: %v", base, ents)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) > 1 || len(ents) == 1 && ents[0].Name() != filepath.Base(base) {
		t.Errorf("the run left %d entries in its temporary directory: %v", len(ents), ents)
	}
	var left []procInfo
	if !testwait.For(context.Background(), 0, func() bool { left = procsOf(tmp); return len(left) == 0 }) {
		t.Errorf("processes of the interrupted run stay: %s", describe(left))
	}
	sandboxes, _ := os.ReadDir(filepath.Join(e.state, "drivers", "local", "sandboxes"))
	for _, s := range sandboxes {
		if strings.HasPrefix(s.Name(), "bconf-") {
			t.Errorf("sandbox %s of the interrupted run stays", s.Name())
		}
	}
}

// TestExecOutputWriteFails: when berth cannot write the command's output (a full
// disk), it stops the command and exits 125 saying so; output is never lost silently.
func TestExecOutputWriteFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	defer full.Close()
	mark := newMark()
	cmd := e.command("exec", "-e", markEnv(mark), "--", "sh", "-c", "while :; do echo data; done")
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = full, &errb
	if err := cmd.Run(); err != nil && !isExitError(err) {
		t.Fatal(err)
	}
	if code := cmd.ProcessState.ExitCode(); code != 125 {
		t.Errorf("exit %d, want 125; stderr %q", code, errb.String())
	}
	if !strings.Contains(errb.String(), "writing the command's stdout") || !strings.Contains(errb.String(), "no space left") {
		t.Errorf("stderr %q does not say that stdout could not be written", errb.String())
	}
	var left []procInfo
	if !testwait.For(context.Background(), 0, func() bool { left = marked(mark); return len(left) == 0 }) {
		t.Errorf("the command still runs: %s", describe(left))
	}
}

// TestExecShellMode: `berth exec --shell` keeps cd and export between calls of a
// session, survives a call that exits, caps output with a marker and a full-output
// file in the state dir, and sets the defaults that keep commands from waiting.
func TestExecShellMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	e.must("exec", "-s", "sh:1", "--shell", "cd "+dir+" && export A=1")
	if r := e.must("exec", "-s", "sh:1", "--shell", `pwd; echo "$A"`); r.stdout != dir+"\n1\n" {
		t.Errorf("state not kept\n%v", r)
	}
	if r := e.run("exec", "-s", "sh:1", "--shell", "exit 7"); r.code != 7 {
		t.Errorf("exit 7: want exit code 7\n%v", r)
	}
	if r := e.run("exec", "-s", "sh:1", "--timeout", "1s", "--shell", "sleep 300"); r.code != 124 || !strings.Contains(r.stderr, "berth: the command timed out after 1s (--timeout)") {
		t.Errorf("--shell with --timeout: want exit 124 and a note\n%v", r)
	}
	if r := e.must("exec", "-s", "sh:2", "--shell", `echo "[$A]" "$PAGER" "$GIT_TERMINAL_PROMPT"`); r.stdout != "[] cat 0\n" {
		t.Errorf("another session, or defaults: want \"[] cat 0\"\n%v", r)
	}
	r := e.run("exec", "-s", "sh:1", "--json", "--max-output", "1000", "--shell", "seq 1 100000")
	var out struct {
		ExitCode             int    `json:"exit_code"`
		Stdout               string `json:"stdout"`
		StdoutTruncatedBytes int64  `json:"stdout_truncated_bytes"`
		StdoutFile           string `json:"stdout_file"`
		StderrFile           string `json:"stderr_file"`
		Cwd                  string `json:"cwd"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
		t.Fatalf("--json --shell\n%v", r)
	}
	var want strings.Builder
	for i := 1; i <= 100000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	full, err := os.ReadFile(out.StdoutFile)
	if len(out.Stdout) > 1000 || out.StdoutTruncatedBytes == 0 || !markerRE.MatchString(out.Stdout) || out.Cwd != dir ||
		err != nil || string(full) != want.String() || !strings.HasPrefix(out.StdoutFile, e.state+"/output/") || out.StderrFile != "" {
		t.Errorf("capped JSON result %+v (file: %d bytes, %v)", out, len(full), err)
	}
	if r := e.run("exec", "-s", "sh:1", "--max-output", "100", "--shell", "seq 1 1000"); r.code != 0 ||
		!markerRE.MatchString(r.stdout) || !strings.Contains(r.stderr, "bytes left out in the middle; the whole stream is in "+e.state) {
		t.Errorf("capped plain output: want the marker and a line naming the full file\n%v", r)
	}
	if r := e.run("exec", "-s", "sh:1", "--shell", "true", "--", "extra"); r.code != 125 || !strings.Contains(r.stderr, "--shell takes the whole command") {
		t.Errorf("--shell with arguments: want 125\n%v", r)
	}
	e.must("rm", "sh:1")
	if _, err := os.Stat(filepath.Dir(out.StdoutFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("berth rm left the session's full-output files: %v", err)
	}
}

// TestJobs: berth job start/ls/logs/kill on the local driver; a job outlives the call
// that started it, its log grows, kill ends it, and removing the session ends any job.
func TestJobs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mark := newMark()
	r := e.must("job", "start", "-s", "jobs:1", "-e", markEnv(mark), "--", "sh", "-c", "while :; do echo tick; sleep 0.1; done")
	id := strings.TrimSpace(r.stdout)
	if id == "" {
		t.Fatalf("job start printed no id\n%v", r)
	}
	if r := e.must("job", "ls", "-s", "jobs:1"); !regexp.MustCompile(`(?m)^`+id+` +running `).MatchString(r.stdout) || !strings.Contains(r.stdout, "while :") {
		t.Errorf("job ls: want job %s running\n%v", id, r)
	}
	if !testwait.For(context.Background(), 0, func() bool {
		return strings.Count(e.must("job", "logs", "-s", "jobs:1", id).stdout, "tick\n") >= 3
	}) {
		t.Fatal("the job's log did not grow to 3 lines")
	}
	if r := e.run("job", "logs", "-s", "jobs:2", id); r.code != 125 || !strings.Contains(r.stderr, "no sandbox") {
		t.Errorf("logs in a session without sandbox: want 125\n%v", r)
	}
	e.must("job", "kill", "-s", "jobs:1", id)
	var rows []struct {
		ID      string `json:"id"`
		Running bool   `json:"running"`
		Signal  int    `json:"signal"`
	}
	r = e.must("job", "ls", "-s", "jobs:1", "--json")
	if json.Unmarshal([]byte(r.stdout), &rows) != nil || len(rows) != 1 || rows[0].Running || rows[0].Signal == 0 {
		t.Errorf("job ls --json after kill: want the job ended by a signal\n%v", r)
	}
	if len(marked(mark)) != 0 {
		t.Errorf("the killed job's processes are alive: %s", describe(marked(mark)))
	}
	// A job that exits: logs --follow ends with its exit code.
	r = e.must("job", "start", "-s", "jobs:1", "--", "sh", "-c", "echo done; exit 5")
	if r := e.run("job", "logs", "-s", "jobs:1", "--follow", strings.TrimSpace(r.stdout)); r.code != 5 || r.stdout != "done\n" {
		t.Errorf("logs --follow of a job that exits 5\n%v", r)
	}
	// Jobs die with the sandbox.
	e.must("job", "start", "-s", "jobs:1", "-e", markEnv(mark), "--", "sleep", "3600")
	if len(marked(mark)) == 0 {
		t.Fatal("the second job is not running")
	}
	e.must("rm", "jobs:1")
	if !testwait.For(context.Background(), 0, func() bool { return len(marked(mark)) == 0 }) {
		t.Errorf("a job outlived its removed session: %s", describe(marked(mark)))
	}
}

// TestCp: berth cp uploads and downloads trees with modes, mtimes and symlinks kept,
// renames by DEST, copies into a DEST ending in "/", and never extracts through a link
// out of the destination.
func TestCp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	src := filepath.Join(t.TempDir(), "tree")
	os.MkdirAll(filepath.Join(src, "sub"), 0o750)
	os.WriteFile(filepath.Join(src, "sub", "f.txt"), []byte("hello\n"), 0o640)
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	os.Chtimes(filepath.Join(src, "sub", "f.txt"), mtime, mtime)

	e.must("exec", "-s", "cp:1", "--", "mkdir", "-p", "in")
	e.must("cp", "-s", "cp:1", src, ":in/copy")
	if r := e.must("exec", "-s", "cp:1", "--", "sh", "-c", "cat in/copy/sub/f.txt; readlink in/copy/link; stat -c '%a %Y' in/copy/sub/f.txt in/copy/sub"); r.stdout != fmt.Sprintf("hello\n/etc/passwd\n640 %d\n750 ", mtime.Unix()) && !strings.HasPrefix(r.stdout, fmt.Sprintf("hello\n/etc/passwd\n640 %d\n750 ", mtime.Unix())) {
		t.Errorf("uploaded tree: want content, link, mode and mtime kept\n%v", r)
	}
	e.must("cp", "-s", "cp:1", filepath.Join(src, "sub", "f.txt"), ":in/")
	if r := e.must("exec", "-s", "cp:1", "--", "cat", "in/f.txt"); r.stdout != "hello\n" {
		t.Errorf("upload into a dir ending in /\n%v", r)
	}

	out := t.TempDir()
	// A download keeps only links that stay inside the copy: on the host an absolute
	// link names a host file.
	if r := e.run("cp", "-s", "cp:1", ":in/copy", filepath.Join(out, "back")); r.code != 125 || !strings.Contains(r.stderr, "copy/link: refused: a symlink to /etc/passwd") || !strings.Contains(r.stderr, "nothing was written to "+out) {
		t.Errorf("download of an absolute link: want 125 naming it\n%v", r)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("a refused download left %v", ents)
	}
	e.must("exec", "-s", "cp:1", "--", "ln", "-sfn", "sub/f.txt", "in/copy/link")
	e.must("cp", "-s", "cp:1", ":in/copy", filepath.Join(out, "back"))
	if b, err := os.ReadFile(filepath.Join(out, "back", "sub", "f.txt")); err != nil || string(b) != "hello\n" {
		t.Errorf("downloaded file: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(out, "back", "link")); err != nil || l != "sub/f.txt" {
		t.Errorf("downloaded link: %q %v, want the symlink kept", l, err)
	}
	if fi, err := os.Stat(filepath.Join(out, "back", "sub", "f.txt")); err != nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mtime) {
		t.Errorf("downloaded file mode/mtime: %v", fi)
	}
	e.must("cp", "-s", "cp:1", ":in/copy", out+"/")
	if _, err := os.Stat(filepath.Join(out, "copy", "sub", "f.txt")); err != nil {
		t.Errorf("download into an existing dir: %v", err)
	}

	// A destination that holds a link out of it: extraction replaces the link and
	// never writes through it.
	outside := t.TempDir()
	dst := t.TempDir()
	os.Symlink(outside, filepath.Join(dst, "copy"))
	e.must("cp", "-s", "cp:1", ":in/copy", dst+"/")
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("extraction wrote outside the destination: %v", ents)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "copy", "sub", "f.txt")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the planted link was not replaced by the copied tree: %v", err)
	}

	if r := e.run("cp", "-s", "cp:1", "a", "b"); r.code != 125 || !strings.Contains(r.stderr, "leading colon") {
		t.Errorf("no side marked: want 125\n%v", r)
	}
	if r := e.run("cp", "-s", "cp:none", ":x", out+"/"); r.code != 125 || !strings.Contains(r.stderr, "no sandbox") {
		t.Errorf("download from a session without sandbox: want 125\n%v", r)
	}
}

// TestShellModeRecreated: a --shell call whose session's sandbox retention removed
// says so (a line on stderr; recreated in --json), as plain exec does.
func TestShellModeRecreated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", "scope \"ret:*\" {\n  retention {\n    idle_ttl    = \"1h\"\n    idle_action = \"remove\"\n  }\n}\n")
	e.must("exec", "-s", "ret:1", "--shell", "cd /tmp; echo x > $HOME/f")
	r := e.at("2h").run("exec", "-s", "ret:1", "--shell", "ls $HOME")
	if r.code != 0 || !strings.Contains(r.stderr, "berth: session ret:1: its previous sandbox was removed by retention") || strings.Contains(r.stdout, "f") {
		t.Errorf("--shell after retention removed the sandbox: want the recreated line and an empty home\n%v", r)
	}
	e.must("exec", "-s", "ret:2", "--shell", "true")
	r = e.at("2h").run("exec", "-s", "ret:2", "--json", "--shell", "true")
	var out struct {
		Recreated       bool   `json:"recreated"`
		RecreatedReason string `json:"recreated_reason"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || !out.Recreated || out.RecreatedReason == "" {
		t.Errorf("--json --shell after retention: want recreated true with a reason\n%v", r)
	}
	if r := e.run("exec", "--", "printf", "a\xffb"); r.code != 125 || !strings.Contains(r.stderr, "argument 1") || !strings.Contains(r.stderr, "UTF-8") {
		t.Errorf("an argument that is not UTF-8: want 125 naming it\n%v", r)
	}
}

// TestRecreate: `--recreate` is the remedy for drift. After the rule's env changes,
// the session's sandbox keeps its old settings and `berth sessions` says drift; `exec
// --recreate` (plain and --shell) removes it and runs in a new one from the current
// rule: the new env, no files or shell state of the old one, recreated in --json, no
// drift. On a session without a sandbox it just runs.
func TestRecreate(t *testing.T) {
	e := newEnv(t)
	rule := "scope \"*\" {\n  env = { FLAVOUR = \"%s\" }\n}\n"
	e.config = e.writeFile("config.hcl", fmt.Sprintf(rule, "old"))
	home := strings.TrimSpace(e.must("exec", "-s", "r:1", "--", "sh", "-c", "touch kept; pwd").stdout)
	e.must("exec", "-s", "r:1", "--shell", "cd /; export SHELLVAR=1")
	e.writeFile("config.hcl", fmt.Sprintf(rule, "new"))
	if s, ok := findSession(e.sessions(), "r:1"); !ok || !s.Drift {
		t.Fatalf("after the rule changed: %+v (listed %v), want drift", s, ok)
	}
	if got := e.must("exec", "-s", "r:1", "--", "sh", "-c", "echo $FLAVOUR").stdout; got != "old\n" {
		t.Fatalf("a drifted sandbox keeps its settings until recreated: FLAVOUR %q, want old", got)
	}

	var out struct {
		ExitCode        int    `json:"exit_code"`
		Stdout          string `json:"stdout"`
		Recreated       bool   `json:"recreated"`
		RecreatedReason string `json:"recreated_reason"`
		Cwd             string `json:"cwd"`
	}
	r := e.must("exec", "-s", "r:1", "--recreate", "--json", "--", "sh", "-c", "echo $FLAVOUR; ls -A")
	decodeOne(t, r, &out)
	if out.Stdout != "new\n" || !out.Recreated || !strings.Contains(out.RecreatedReason, "--recreate") {
		t.Errorf("exec --recreate --json: %+v, want FLAVOUR new, no old files, recreated because of --recreate", out)
	}
	if _, err := os.Stat(filepath.Join(home, "kept")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the old sandbox's file is still there (%v)", err)
	}
	if s, ok := findSession(e.sessions(), "r:1"); !ok || s.Drift || s.State != "running" {
		t.Errorf("after --recreate: %+v (listed %v), want running without drift", s, ok)
	}

	// Shell mode: the exported variable of the old sandbox's shell state is gone.
	e.must("exec", "-s", "r:1", "--shell", "export SHELLVAR=2")
	r = e.must("exec", "-s", "r:1", "--recreate", "--json", "--shell", "echo ${SHELLVAR:-unset}")
	decodeOne(t, r, &out)
	if out.Stdout != "unset\n" || !out.Recreated {
		t.Errorf("exec --recreate --shell: %+v, want SHELLVAR unset and recreated", out)
	}
	// Without --json nothing extra is printed: the user asked for it.
	r = e.must("exec", "-s", "r:1", "--recreate", "--", "echo", "x")
	if r.stdout != "x\n" || r.stderr != "" {
		t.Errorf("exec --recreate: %v, want x and an empty stderr", r)
	}
	// A session without a sandbox: nothing to remove, not recreated.
	r = e.must("exec", "-s", "fresh:1", "--recreate", "--json", "--", "true")
	decodeOne(t, r, &out)
	if out.Recreated {
		t.Errorf("exec --recreate of a new session: %+v, want not recreated", out)
	}
}

// TestInterruptDuringCreate: SIGINT while exec is still getting its sandbox (here a
// containerd "daemon" that accepts the connection and never answers) ends berth at
// once with 130 and says the command did not run; the interrupt is not swallowed
// until the create gives up.
func TestInterruptDuringCreate(t *testing.T) {
	e := newEnv(t)
	sock := filepath.Join(e.dir, "silent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	e.config = e.writeFile("config.hcl", fmt.Sprintf("driver \"containerd\" {\n  address = %q\n}\nscope \"*\" {\n  driver = \"containerd\"\n  image  = \"busybox:1\"\n}\n", sock))
	cmd := e.command("exec", "--", "true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-accepted: // berth's driver is waiting for the daemon now
		defer c.Close()
	case <-time.After(testwait.Limit):
		cmd.Process.Kill()
		t.Fatal("berth never connected to the socket")
	}
	cmd.Process.Signal(syscall.SIGINT)
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 || !strings.Contains(stderr.String(), "interrupted before the command ran") {
		t.Errorf("SIGINT during create: exit %d, stderr %q; want 130 and \"interrupted before the command ran\"", code, stderr.String())
	}
}

// TestJobsOfStoppedSandbox: jobs end with their sandbox, and asking about them does not
// start it again: job ls of a stopped sandbox lists nothing and leaves it stopped; job
// logs says the sandbox is not running.
func TestJobsOfStoppedSandbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", "scope \"*\" {\n  retention {\n    on_close = \"stop\"\n  }\n}\n")
	id := strings.TrimSpace(e.must("job", "start", "-s", "js:1", "--", "sleep", "3600").stdout)
	e.must("close", "js:1")
	if r := e.must("job", "ls", "-s", "js:1"); strings.Contains(r.stdout, id) {
		t.Errorf("job ls of a stopped sandbox lists job %s\n%v", id, r)
	}
	if s, ok := findSession(e.sessions(), "js:1"); !ok || s.State != "stopped" {
		t.Errorf("after job ls: %+v (listed %v), want the sandbox still stopped", s, ok)
	}
	if r := e.run("job", "logs", "-s", "js:1", id); r.code != 125 || !strings.Contains(r.stderr, "not running") {
		t.Errorf("job logs in a stopped sandbox: want 125 saying it is not running\n%v", r)
	}
}

// TestTimeoutUnits: --timeout takes the config's duration units, d included.
func TestTimeoutUnits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var out struct {
		ExitCode int  `json:"exit_code"`
		TimedOut bool `json:"timed_out"`
	}
	decodeOne(t, e.must("exec", "--json", "--timeout", "1d", "--", "true"), &out)
	if out.ExitCode != 0 || out.TimedOut {
		t.Errorf("--timeout 1d: %+v", out)
	}
}

// TestUnicodeSession: a session name of printable Unicode works from the command line,
// and its NFD spelling is the same session: `sessions` lists it once, in NFC, and rm
// of either spelling removes it. A format character is refused (125), named.
func TestUnicodeSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const nfc, nfd = "chat:g\u00e9n\u00e9ral", "chat:ge\u0301ne\u0301ral"
	e.must("exec", "-s", nfc, "--", "sh", "-c", "echo kept > f")
	var out struct {
		Session string `json:"session"`
		Stdout  string `json:"stdout"`
	}
	decodeOne(t, e.must("exec", "-s", nfd, "--json", "--", "cat", "f"), &out)
	if out.Session != nfc || out.Stdout != "kept\n" {
		t.Errorf("exec in the NFD spelling: %+v, want session %q and the NFC session's file", out, nfc)
	}
	if rows := e.sessions(); len(rows) != 1 || rows[0].Session != nfc {
		t.Errorf("sessions: %+v, want one row named %q", rows, nfc)
	}
	if r := e.run("exec", "-s", "chat:\u200b1", "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "U+200B") {
		t.Errorf("a zero-width space in the name: want 125 naming U+200B\n%v", r)
	}
	e.must("rm", nfd)
	if rows := e.sessions(); len(rows) != 0 {
		t.Errorf("sessions after rm of the NFD spelling: %+v", rows)
	}
}

// openFIFO makes a FIFO at path and opens its other end in the background: for
// writing (the test feeds berth) or reading (berth's command tells the test). The
// open returns once the other side has opened it, which orders the test after that
// point of berth's run; the file comes on the channel. A berth that ends first fails
// the test (done is closed when it has).
func openFIFO(t *testing.T, path string, flag int) <-chan *os.File {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *os.File, 1)
	go func() {
		f, err := os.OpenFile(path, flag, 0)
		if err != nil {
			t.Error(err)
			close(ch)
			return
		}
		ch <- f
	}()
	return ch
}

// signalPending reports whether sig is pending, not yet handled, for any thread of
// process pid (from /proc: each thread's SigPnd and the process's ShdPnd).
func signalPending(pid int, sig syscall.Signal) bool {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			if k != "SigPnd" && k != "ShdPnd" {
				continue
			}
			if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&(1<<(sig-1)) != 0 {
				return true
			}
		}
	}
	return false
}

// TestInterruptAtStart: SIGINT, SIGTERM or SIGHUP that reach berth exec, shell mode
// or berth shell before it has started anything (here while it waits to read its
// config file, a FIFO that the test writes only after the signal) never kill berth:
// it exits 128+N saying "interrupted before the command ran", and the command never
// ran. A command that does not forward signals (sessions) still dies by them. The
// events are ordered, not timed: the signal is sent once berth has opened the config
// FIFO (the test's open of the other end returns then), and the config is written
// once the kernel has handed the signal to one of berth's threads (the kernel may
// pick an idle thread, which runs later than the one reading: a fast command such as
// sessions could otherwise exit before its signal is handled), so berth can start
// nothing before it has the signal.
func TestInterruptAtStart(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		sig  syscall.Signal
		args []string
		code int    // 0: killed by sig
		says string // on stderr
	}{
		{"exec-SIGINT", syscall.SIGINT, []string{"exec", "--", "sh", "-c", "touch MARK; exec sleep 300"}, 130, "interrupted before the command ran"},
		{"exec-SIGTERM", syscall.SIGTERM, []string{"exec", "--", "sh", "-c", "touch MARK; exec sleep 300"}, 143, "interrupted before the command ran"},
		{"exec-json-SIGHUP", syscall.SIGHUP, []string{"exec", "--json", "--", "sh", "-c", "touch MARK; exec sleep 300"}, 129, "interrupted before the command ran"},
		{"shell-mode-SIGINT", syscall.SIGINT, []string{"exec", "--shell", "touch MARK; sleep 300"}, 130, "interrupted before the command ran"},
		{"job-logs-SIGINT", syscall.SIGINT, []string{"job", "logs", "--follow", "j1"}, 130, ""},
		{"sessions-SIGTERM", syscall.SIGTERM, []string{"sessions"}, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			mark := filepath.Join(e.dir, "ran")
			for i, a := range c.args {
				c.args[i] = strings.ReplaceAll(a, "MARK", mark)
			}
			fifo := filepath.Join(e.dir, "config.fifo")
			opened := openFIFO(t, fifo, os.O_WRONLY)
			e.config = fifo
			cmd := e.command(c.args...)
			e.config = e.writeFile("config.hcl", "scope \"*\" {\n}\n") // for the cleanup
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			var w *os.File
			select {
			case w = <-opened:
			case err := <-exited:
				t.Fatalf("berth ended before it opened its config: %v; stderr %q", err, stderr.String())
			}
			if w == nil {
				cmd.Process.Kill()
				t.FailNow()
			}
			cmd.Process.Signal(c.sig)
			for signalPending(cmd.Process.Pid, c.sig) {
				time.Sleep(time.Millisecond) // polls the kernel's state; berth needs the CPU
			}
			w.WriteString("scope \"*\" {\n}\n") // fails (EPIPE) when berth is gone: fine
			w.Close()
			<-exited
			ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
			_, statErr := os.Stat(mark)
			ran := statErr == nil
			switch {
			case c.code == 0:
				if !ws.Signaled() || ws.Signal() != c.sig {
					t.Errorf("berth %v after %v: %v, want killed by it; stderr %q", c.args, c.sig, ws, stderr.String())
				}
			case ws.Signaled():
				t.Errorf("berth %v was killed by %v (a caller sees -%d); want exit %d", c.args, ws.Signal(), ws.Signal(), c.code)
			case ws.ExitStatus() != c.code || ran || !strings.Contains(stderr.String(), c.says):
				t.Errorf("berth %v after %v: exit %d, stderr %q, the command ran: %v; want %d, %q and no command", c.args, c.sig, ws.ExitStatus(), stderr.String(), ran, c.code, c.says)
			}
		})
	}
}

// TestShellModeInterruptJSON: SIGINT during a shell-mode call ends it; berth exits 130
// and its --json result says the same: exit_code 130, signal 2 (not the SIGTERM the
// agent ended the tree with), and the tree is gone.
func TestShellModeInterruptJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--shell", "true")
	for _, c := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGHUP, 129}} {
		mark := newMark()
		fifo := filepath.Join(e.dir, fmt.Sprintf("started-%d.fifo", c.sig))
		opened := openFIFO(t, fifo, os.O_RDONLY)
		r := e.start("exec", "--json", "-e", markEnv(mark), "--shell", fmt.Sprintf("echo started > %s; sleep 300", fifo))
		f := <-opened // the call runs: its shell has opened the FIFO
		if f == nil {
			t.FailNow()
		}
		io.ReadAll(f)
		f.Close()
		r.cmd.Process.Signal(c.sig)
		code := r.finish(t)
		var out struct {
			ExitCode int `json:"exit_code"`
			Signal   int `json:"signal"`
		}
		if err := json.Unmarshal([]byte(strings.Join(r.all, "\n")), &out); err != nil {
			t.Fatalf("--json output after %v: %v; lines %q; stderr %q", c.sig, err, r.all, r.stderr.String())
		}
		if code != c.code || out.ExitCode != c.code || out.Signal != int(c.sig) {
			t.Errorf("shell mode --json after %v: berth exits %d, JSON exit_code %d signal %d; want %d, %d and %d", c.sig, code, out.ExitCode, out.Signal, c.code, c.code, c.sig)
		}
		if left := marked(mark); len(left) > 0 {
			t.Errorf("the interrupted call left processes:\n%s", describe(left))
		}
	}
}

// agentOf returns the agent process of the env's sandbox (the local driver's detached
// berth-agent, found by its argv naming the env's state dir and sandbox).
func (e *env) agentOf(sandbox string) (procInfo, bool) {
	ps := liveProcs(func(p procInfo) bool {
		return len(p.cmdline) > 2 && p.cmdline[0] == "berth-agent" && p.cmdline[1] == "serve" &&
			slices.ContainsFunc(p.cmdline, func(a string) bool { return strings.HasPrefix(a, e.state+"/") && strings.Contains(a, sandbox) })
	})
	if len(ps) != 1 {
		return procInfo{}, false
	}
	return ps[0], true
}

// TestAgentDiesMidExec: when a sandbox's agent dies during an exec (killed here, as
// when a container dies), berth exits 125 with an error that names the session, the
// sandbox, its driver and what happened (the connection to its agent was lost while
// the command ran), not a bare "error reading from server: EOF".
func TestAgentDiesMidExec(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.lostAgent(t, func(sandbox string) {
		ag, ok := e.agentOf(sandbox)
		if !ok {
			t.Fatalf("no agent process found for sandbox %s", sandbox)
		}
		syscall.Kill(ag.pid, syscall.SIGKILL)
	})
}

// lostAgent runs a long exec in session die:1 of e, calls kill with its sandbox once
// the command runs, and checks that berth exits 125 with an error that names the
// session, the sandbox, the driver and the lost connection, and that the next exec
// works.
func (e *env) lostAgent(t *testing.T, kill func(sandbox string)) {
	t.Helper()
	e.must("exec", "-s", "die:1", "--", "true")
	row, _ := findSession(e.sessions(), "die:1")
	r := e.start("exec", "-s", "die:1", "--", "sh", "-c", "echo ready; exec sleep 300")
	r.expect(t, "ready")
	kill(row.Sandbox)
	code := r.finish(t)
	msg := r.stderr.String()
	for _, want := range []string{`session "die:1"`, "sandbox " + row.Sandbox, "driver " + row.Driver, "lost the connection to the sandbox's agent while the command ran", "the next call starts"} {
		if !strings.Contains(msg, want) {
			t.Errorf("exec whose agent went away: stderr %q does not say %q", msg, want)
		}
	}
	if code != 125 {
		t.Errorf("exec whose agent went away: exit %d, want 125; stderr %q", code, msg)
	}
	if r := e.run("exec", "-s", "die:1", "--", "echo", "back"); r.code != 0 || r.stdout != "back\n" {
		t.Errorf("exec after the agent went away\n%v", r)
	}
}

// TestDriversRuntimeDown: `berth drivers` does not call a driver healthy whose
// runtime does not answer: docker and containerd pointed at sockets where nothing
// listens are listed with an error naming the socket; local stays ok; exit 0.
func TestDriversRuntimeDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dsock, csock := filepath.Join(e.dir, "no-docker.sock"), filepath.Join(e.dir, "no-containerd.sock")
	e.config = e.writeFile("config.hcl", fmt.Sprintf("driver \"docker\" {\n  host = \"unix://%s\"\n}\ndriver \"containerd\" {\n  address = %q\n}\n", dsock, csock))
	var rows []struct {
		Name   string `json:"name"`
		Health string `json:"health"`
	}
	decodeOne(t, e.must("drivers", "--json"), &rows)
	want := map[string]string{"docker": dsock, "containerd": csock, "local": ""}
	for _, r := range rows {
		sock, ok := want[r.Name]
		switch {
		case !ok:
		case sock == "" && r.Health != "ok":
			t.Errorf("%s: health %q, want ok", r.Name, r.Health)
		case sock != "" && (r.Health == "ok" || !strings.Contains(r.Health, sock) || !strings.Contains(r.Health, "does not answer")):
			t.Errorf("%s: health %q, want that its runtime at %s does not answer", r.Name, r.Health, sock)
		}
		delete(want, r.Name)
	}
	if len(want) > 0 {
		t.Errorf("drivers --json lacks %v: %+v", want, rows)
	}
}
