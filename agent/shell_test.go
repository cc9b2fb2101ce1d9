package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// shellPaths returns PATH values under which the agent picks each shell of this host:
// bash (the default PATH), and dash and busybox ash as the only "sh" of a directory
// (no bash there, so the agent falls back to sh).
func shellPaths(t *testing.T) map[string]string {
	paths := map[string]string{}
	if _, err := os.Stat("/bin/bash"); err == nil {
		paths["bash"] = ""
	}
	for name, bin := range map[string]string{"dash": "/bin/dash", "busybox": "/bin/busybox"} {
		if _, err := os.Stat(bin); err != nil {
			continue
		}
		dir := t.TempDir()
		if err := os.Symlink(bin, filepath.Join(dir, "sh")); err != nil {
			t.Fatal(err)
		}
		if name == "busybox" {
			for _, app := range []string{"cat", "sleep", "seq", "touch", "printf", "true"} {
				os.Symlink(bin, filepath.Join(dir, app))
			}
		} else {
			for _, app := range []string{"cat", "sleep", "seq", "touch", "true"} {
				for _, d := range []string{"/usr/bin", "/bin"} {
					if _, err := os.Stat(filepath.Join(d, app)); err == nil {
						os.Symlink(filepath.Join(d, app), filepath.Join(dir, app))
						break
					}
				}
			}
		}
		paths[name] = dir
	}
	if len(paths) == 0 {
		t.Skip("no bash, dash or busybox on this host")
	}
	return paths
}

// shellDo runs cmd in shell mode under key with PATH path ("" = the agent's).
func shellDo(t *testing.T, c *Client, key, path, cmd string, env ...string) (stdout, stderr string, res backend.ExecResult) {
	t.Helper()
	if path != "" {
		env = append([]string{"PATH=" + path}, env...)
	}
	return shellRun(t, c, ShellRequest{Command: cmd, Session: key, Env: env})
}

// shellRun runs req (Client.Shell) and returns its output and result.
func shellRun(t *testing.T, c *Client, req ShellRequest) (stdout, stderr string, res backend.ExecResult) {
	t.Helper()
	var out, errb bytes.Buffer
	req.Stdout, req.Stderr = &out, &errb
	p, err := c.Shell(testCtx(t), req)
	if err != nil {
		t.Fatalf("Shell %q: %v", req.Command, err)
	}
	if res, err = p.Wait(); err != nil {
		t.Fatalf("Wait %q: %v", req.Command, err)
	}
	return out.String(), errb.String(), res
}

func TestShellMode(t *testing.T) {
	for name, path := range shellPaths(t) {
		t.Run(name, func(t *testing.T) {
			a := startAgent(t)
			c := a.c
			tmp := t.TempDir()
			call := func(cmd string, env ...string) (string, string, backend.ExecResult) {
				t.Helper()
				return shellDo(t, c, "s1", path, cmd, env...)
			}
			if _, _, res := call("cd " + tmp + " && export A=1 B='two words'"); res.ExitCode != 0 || res.Cwd != tmp {
				t.Fatalf("cd+export: %+v, want exit 0 and cwd %s", res, tmp)
			}
			if out, _, res := call(`pwd; echo "$A|$B"`); out != tmp+"\n1|two words\n" || res.Cwd != tmp {
				t.Fatalf("next call: %q %+v, want the directory and variables kept", out, res)
			}
			// Calls that end the shell early still leave a working session.
			for _, c := range []struct {
				cmd  string
				code int
			}{
				{"set -e; false; echo not-here", 1},
				{"exit 7", 7},
				{"if then fi (", 2},
				{"cat <<EOF\nunterminated", -1},
				{"exec true", 0},
			} {
				out, _, res := call(c.cmd)
				if c.code >= 0 && res.ExitCode != c.code || strings.Contains(out, "not-here") {
					t.Errorf("%q: exit %d out %q, want exit %d", c.cmd, res.ExitCode, out, c.code)
				}
				if out, _, res := call(`echo "ok $A $(pwd)"`); out != "ok 1 "+tmp+"\n" || res.ExitCode != 0 {
					t.Errorf("after %q: %q %+v, want the last recorded state", c.cmd, out, res)
				}
			}
			// exit after a cd still records the cd.
			sub := filepath.Join(tmp, "sub")
			os.Mkdir(sub, 0o755)
			if _, _, res := call("cd sub; exit 3"); res.ExitCode != 3 || res.Cwd != sub {
				t.Errorf("cd then exit 3: %+v, want 3 and cwd %s", res, sub)
			}
			// A per-call variable wins over the recorded one.
			if out, _, _ := call(`echo "$A"`, "A=per-call"); out != "per-call\n" {
				t.Errorf("per-call env: %q, want per-call", out)
			}
			// Keys are separate.
			if out, _, res := shellDo(t, c, "s2", path, `echo "[$A]"; pwd`); strings.Contains(out, "[1]") || strings.Contains(out, tmp) || res.Cwd == sub {
				t.Errorf("another key sees %q (cwd %s), want none of s1's state", out, res.Cwd)
			}
			// A directory that was removed falls back to the default one.
			os.Remove(sub)
			if _, _, res := call("true"); res.ExitCode != 0 || res.Cwd == sub {
				t.Errorf("after the cwd was removed: %+v", res)
			}
		})
	}
}

// TestShellModeReportFile: the wrapper reports the state by appending to a second,
// empty file of the call's, never by writing over the restore script it sourced (on
// ext4, a file truncated to zero and written again is flushed at close).
func TestShellModeReportFile(t *testing.T) {
	a := startAgent(t)
	out, _, res := shellDo(t, a.c, "k", "", `test -f "$__berth_report" && test ! -s "$__berth_report" && echo empty; echo "$__berth_report"`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if res.ExitCode != 0 || len(lines) != 2 || lines[0] != "empty" || !strings.HasSuffix(lines[1], ".report") {
		t.Fatalf("during the call: %q (exit %d), want an empty report file named *.report", out, res.ExitCode)
	}
	if _, err := os.Lstat(lines[1]); !os.IsNotExist(err) {
		t.Errorf("report file %s left after the call: %v", lines[1], err)
	}
}

// Without a state dir the calls' state files live in a directory that the agent
// makes with a random name (not one that another user could have made first at a
// name they guessed, such as one after the agent's pid), mode 0711, and removes
// when it shuts down.
func TestShellModeTempRunDir(t *testing.T) {
	a := startAgent(t)
	out, _, res := shellDo(t, a.c, "k", "", `echo "$__berth_report"`)
	dir := filepath.Dir(strings.TrimSpace(out))
	parent := filepath.Clean(os.TempDir())
	if shmIsTmpfs() {
		parent = shmDir
	}
	if res.ExitCode != 0 || !strings.HasPrefix(filepath.Base(dir), "berth-agent-shell-") || filepath.Dir(dir) != parent {
		t.Fatalf("the call's state file is %q (exit %d), want one in %s/berth-agent-shell-RANDOM", out, res.ExitCode, parent)
	}
	if strings.Contains(filepath.Base(dir), strconv.Itoa(a.pid)) {
		t.Errorf("run dir %s is named after the agent's pid", dir)
	}
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o711 {
		t.Fatalf("run dir %s: %v, mode %v, want 0711", dir, err, st.Mode().Perm())
	}
	if err := a.c.Shutdown(testCtx(t), 500*time.Millisecond); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case <-a.exited:
	case <-time.After(testwait.Limit):
		t.Fatal("agent did not exit after Shutdown")
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir %s left behind after Shutdown: %v", dir, err)
	}
}

func TestShellModeBadRequests(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	for _, req := range []ShellRequest{
		{Command: "true"},
		{Session: "k"},
	} {
		if _, err := a.c.Shell(ctx, req); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("Shell(%+v): %v, want ErrInvalid", req, err)
		}
	}
}

// TestShellModeTimeoutKeepsState: a shell call killed at its timeout records nothing,
// and the next call has the state from before.
func TestShellModeTimeoutKeepsState(t *testing.T) {
	a := startAgent(t)
	tmp := t.TempDir()
	shellDo(t, a.c, "k", "", "cd "+tmp)
	// The timeout must pass after the call's cd: one that a slow machine's shell
	// outlasts (no marker) is tried again with twice the time.
	marker := filepath.Join(t.TempDir(), "cd-done")
	for timeout := 200 * time.Millisecond; ; timeout *= 2 {
		_, _, res := shellRun(t, a.c, ShellRequest{Command: "cd /; touch " + marker + "; sleep 300", Session: "k", Timeout: timeout})
		if !res.TimedOut || res.Cwd != tmp {
			t.Fatalf("timed-out call: %+v, want TimedOut and the previous cwd %s", res, tmp)
		}
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if timeout >= testwait.Limit {
			t.Fatalf("the call never ran its cd within its %v timeout", timeout)
		}
	}
	if out, _, _ := shellDo(t, a.c, "k", "", "pwd"); out != tmp+"\n" {
		t.Errorf("after a timed-out call: pwd %q, want %s", out, tmp)
	}
}

// shmIsTmpfs reports whether the agent puts its calls' files in shmDir here.
func shmIsTmpfs() bool {
	var st unix.Statfs_t
	return unix.Statfs(shmDir, &st) == nil && st.Type == unix.TMPFS_MAGIC
}

// startStateAgent starts an agent with the state dir state and connects to it.
func startStateAgent(t *testing.T, state string) (*testAgent, *Client) {
	t.Helper()
	a := &testAgent{sockDir: deepDir(t), logPath: filepath.Join(t.TempDir(), "agent.log"), exited: make(chan struct{}), stateDir: state}
	a.start(t)
	c, err := NewClient(testCtx(t), DialSocketDir(a.sockDir))
	if err != nil {
		t.Fatal(err)
	}
	return a, c
}

// TestShellModeTmpfsRunDirOfKilledAgent: the run dir on the tmpfs that an agent
// killed with SIGKILL (no cleanup) left is removed by the next agent of its state
// dir, and a name planted in the record that is not such a dir of the agent's is
// left alone.
func TestShellModeTmpfsRunDirOfKilledAgent(t *testing.T) {
	if !shmIsTmpfs() {
		t.Skip(shmDir + " is not a tmpfs here: the run dir is in the state dir")
	}
	state := t.TempDir()
	a, c := startStateAgent(t, state)
	out, _, _ := shellDo(t, c, "k", "", `echo "$__berth_report"`)
	c.Close()
	first := filepath.Dir(strings.TrimSpace(out))
	if filepath.Dir(first) != shmDir {
		t.Fatalf("run dir %s, want one in %s", first, shmDir)
	}
	syscall.Kill(a.pid, syscall.SIGKILL)
	<-a.exited
	if _, err := os.Stat(first); err != nil {
		t.Fatalf("the killed agent's run dir is gone already (%v): the test shows nothing", err)
	}
	b := &testAgent{sockDir: a.sockDir, logPath: a.logPath, exited: make(chan struct{}), stateDir: state}
	b.start(t)
	c2, err := NewClient(testCtx(t), DialSocketDir(b.sockDir))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	out, _, _ = shellDo(t, c2, "k", "", `echo "$__berth_report"`)
	if second := filepath.Dir(strings.TrimSpace(out)); second == first || filepath.Dir(second) != shmDir {
		t.Fatalf("second agent's run dir %s (the first's %s)", second, first)
	}
	if _, err := os.Lstat(first); !os.IsNotExist(err) {
		t.Errorf("the killed agent's run dir %s is still there: %v", first, err)
	}
	// A record naming something else: left alone.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, shellRunFile), []byte(other+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	removeOwnRunDir(filepath.Join(state, shellRunFile))
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a directory outside %s named in the record was removed: %v", shmDir, err)
	}
}

// TestShellModeTmpfsRunDirGone: when the tmpfs run dir disappears under the agent
// (a user's clean-up of /dev/shm, systemd-logind's RemoveIPC), shell calls go on in
// the state dir's run dir, state kept.
func TestShellModeTmpfsRunDirGone(t *testing.T) {
	if !shmIsTmpfs() {
		t.Skip(shmDir + " is not a tmpfs here")
	}
	state := t.TempDir()
	_, c := startStateAgent(t, state)
	defer c.Close()
	tmp := t.TempDir()
	out, _, _ := shellDo(t, c, "k", "", "cd "+tmp+`; echo "$__berth_report"`)
	shm := filepath.Dir(strings.TrimSpace(out))
	if filepath.Dir(shm) != shmDir {
		t.Fatalf("run dir %s, want one in %s", shm, shmDir)
	}
	if err := os.RemoveAll(shm); err != nil {
		t.Fatal(err)
	}
	out, _, res := shellDo(t, c, "k", "", `echo "$(pwd) $__berth_report"`)
	where, report, _ := strings.Cut(strings.TrimSpace(out), " ")
	if res.ExitCode != 0 || where != tmp || filepath.Dir(report) != filepath.Join(state, "run") {
		t.Errorf("after the tmpfs run dir went: %q (exit %d), want %s and a report in %s/run", out, res.ExitCode, tmp, state)
	}
}

// TestShellModeStateOutlivesAgent: with a state dir, a new agent (the sandbox was
// stopped and started) continues where the old one left.
func TestShellModeStateOutlivesAgent(t *testing.T) {
	state := t.TempDir()
	tmp := t.TempDir()
	a := startAgent(t)
	a.c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit)
	defer cancel()
	// Restart with a state dir: a fresh agent.
	c0, _ := NewClient(ctx, DialSocketDir(a.sockDir))
	c0.Shutdown(ctx, 100*time.Millisecond)
	c0.Close()
	<-a.exited

	b := &testAgent{sockDir: a.sockDir, logPath: a.logPath, exited: make(chan struct{}), stateDir: state}
	b.start(t)
	c1, err := NewClient(ctx, DialSocketDir(b.sockDir))
	if err != nil {
		t.Fatal(err)
	}
	shellDo(t, c1, "chat:1", "", "cd "+tmp+"; export KEEP=yes")
	c1.Shutdown(ctx, 100*time.Millisecond)
	c1.Close()
	<-b.exited

	d := &testAgent{sockDir: a.sockDir, logPath: a.logPath, exited: make(chan struct{}), stateDir: state}
	d.start(t)
	c2, err := NewClient(ctx, DialSocketDir(d.sockDir))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if out, _, _ := shellDo(t, c2, "chat:1", "", `echo "$(pwd) $KEEP"`); out != tmp+" yes\n" {
		t.Errorf("after an agent restart: %q, want %q", out, tmp+" yes")
	}
	ents, _ := os.ReadDir(state)
	for _, e := range ents {
		want := os.FileMode(0o600)
		if e.Name() == "run" {
			want = 0o711 | os.ModeDir // per-call files, reachable by name only
		}
		if fi, err := e.Info(); err != nil || fi.Mode() != want {
			t.Errorf("state file %s: mode %v, want %v", e.Name(), fi.Mode(), want)
		}
	}
	if left, _ := os.ReadDir(filepath.Join(state, "run")); len(left) != 0 {
		t.Errorf("per-call state files left behind: %v", left)
	}
}

// TestShellModeSideBySide: shell calls of one key run side by side, none waiting for
// another (hermes runs read-only tools in parallel, and sub-agents share a session);
// each starts from the state recorded when it started, and the call that ends last
// records the state the next call starts from. Plain execs and other keys are not
// held back either.
func TestShellModeSideBySide(t *testing.T) {
	a := startAgent(t)
	dir := t.TempDir()
	logf := filepath.Join(dir, "log")
	ctx := testCtx(t)
	shellDo(t, a.c, "k", "", "export BASE=1")
	first, err := a.c.Shell(ctx, ShellRequest{Session: "k", Command: "export A=first; cd " + dir + "; touch started; while [ ! -e go ]; do sleep 0.01; done; echo first-end >> " + logf})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "the first call to run", func() bool { _, err := os.Stat(filepath.Join(dir, "started")); return err == nil })
	// The second call runs to its end while the first still runs, from the state
	// recorded before the first started.
	out, _, res := shellDo(t, a.c, "k", "", `echo "second-start $BASE ${A-}" >> `+logf+`; export B=second; pwd`)
	if res.ExitCode != 0 || res.TimedOut || strings.TrimSpace(out) == dir {
		t.Fatalf("the second call while the first runs: %+v %q", res, out)
	}
	if out, _, _ := shellDo(t, a.c, "k", "", `echo "${B-}"`); out != "second\n" {
		t.Errorf("a call after the second ended, while the first runs: %q, want the second's export", out)
	}
	if out, _, _ := run(t, a.c, sh("echo plain")); out != "plain\n" {
		t.Fatalf("plain exec while a shell call runs: %q", out)
	}
	if out, _, _ := shellDo(t, a.c, "other", "", "echo other"); out != "other\n" {
		t.Fatalf("another key while k runs: %q", out)
	}
	os.WriteFile(filepath.Join(dir, "go"), nil, 0o644)
	if res, err := first.Wait(); err != nil || res.ExitCode != 0 || res.Cwd != dir {
		t.Fatalf("the first call: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(logf); string(b) != "second-start 1 \nfirst-end\n" {
		t.Errorf("log %q, want the second call's line (without the first's export) before the first's end", b)
	}
	// The first ended last: its state wins (its cd and export; not the second's B,
	// which it did not start from).
	if out, _, res := shellDo(t, a.c, "k", "", `echo "$BASE ${A-} ${B-}"`); out != "1 first \n" || res.Cwd != dir {
		t.Errorf("after both: %q in %q, want the last call's state", out, res.Cwd)
	}
}

// TestShellModeLoginProfile: a session's first shell call reads the login profile
// (~/.profile here; output discarded), as a login shell and hermes-agent's snapshot
// do, and records what it set; the call's own variables win over it, the call stays
// in its directory whatever the profile does, and later calls restore the recorded
// state instead of reading the profile again.
func TestShellModeLoginProfile(t *testing.T) {
	for name, path := range shellPaths(t) {
		t.Run(name, func(t *testing.T) {
			a := startAgent(t)
			home, work := t.TempDir(), t.TempDir()
			profile := filepath.Join(home, ".profile")
			if err := os.WriteFile(profile, []byte("export FROM_PROFILE=yes CALL_WINS=profile\necho profile-noise\ncd /\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			env := []string{"HOME=" + home, "CALL_WINS=call"}
			if path != "" {
				env = append(env, "PATH="+path)
			}
			out, errOut, res := shellRun(t, a.c, ShellRequest{Session: "p", Command: `echo "$FROM_PROFILE $CALL_WINS"; pwd`, Env: env, Dir: work})
			if out != "yes call\n"+work+"\n" || strings.Contains(errOut, "noise") || res.ExitCode != 0 {
				t.Fatalf("the first call: %q %q %+v, want the profile's variable, the call's over it, in %s, no profile output", out, errOut, res, work)
			}
			if err := os.WriteFile(profile, []byte("export FROM_PROFILE=again\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			var pathEnv []string
			if path != "" {
				pathEnv = []string{"PATH=" + path}
			}
			if out, _, _ := shellRun(t, a.c, ShellRequest{Session: "p", Command: `echo "$FROM_PROFILE"`, Env: pathEnv}); out != "yes\n" {
				t.Errorf("the second call: %q, want the recorded yes (the profile is read once)", out)
			}
		})
	}
}

// TestShellModeFunctionsAndAliases: with bash, shell functions and aliases carry over
// to the session's next call, as exports do.
func TestShellModeFunctionsAndAliases(t *testing.T) {
	if _, ok := shellPaths(t)["bash"]; !ok {
		t.Skip("no /bin/bash on this host: functions and aliases are kept with bash only")
	}
	a := startAgent(t)
	if _, _, res := shellDo(t, a.c, "f", "", `greet() { echo "hi $1"; }; alias ll='echo listing'`); res.ExitCode != 0 {
		t.Fatalf("defining: %+v", res)
	}
	if out, errOut, res := shellDo(t, a.c, "f", "", `greet there; ll`); out != "hi there\nlisting\n" || res.ExitCode != 0 {
		t.Errorf("the next call: %q %q %+v, want the function and the alias", out, errOut, res)
	}
	// A command's own IFS does not split the function names differently.
	if _, _, res := shellDo(t, a.c, "f", "", `IFS=,; other() { echo other; }`); res.ExitCode != 0 {
		t.Fatalf("defining with IFS=,: %+v", res)
	}
	if out, _, _ := shellDo(t, a.c, "f", "", `other; greet x`); out != "other\nhi x\n" {
		t.Errorf("after a call that set IFS=,: %q, want both functions", out)
	}
	if out, _, _ := shellDo(t, a.c, "f", "", `unset -f greet; unalias ll; type greet ll >/dev/null 2>&1 || echo gone`); out != "gone\n" {
		t.Errorf("unset -f and unalias: %q", out)
	}
	if out, _, _ := shellDo(t, a.c, "f", "", `type greet ll >/dev/null 2>&1 || echo still-gone`); out != "still-gone\n" {
		t.Errorf("after unset -f and unalias: %q, want them gone for good", out)
	}
}

// TestShellModeBigAndSecretState: a recorded variable larger than the kernel's limit
// for one argument leaves the session working (a real shell's external commands fail
// with such a variable exported, as they would anywhere, but berth's own wrapper does
// not, so unset works), recorded values are not on any command line, and a command
// that takes descriptor 9 for itself (the flock idiom) neither loses the state nor
// gets it written into its file.
func TestShellModeBigAndSecretState(t *testing.T) {
	a := startAgent(t)
	dir := t.TempDir()
	if _, _, res := shellDo(t, a.c, "s", "", `export BIG=$(head -c 300000 /dev/zero | tr '\0' x)`); res.ExitCode != 0 {
		t.Fatalf("export of a 300 kB variable: %+v", res)
	}
	if out, _, res := shellDo(t, a.c, "s", "", `echo ${#BIG}; unset BIG`); out != "300000\n" || res.ExitCode != 0 {
		t.Fatalf("the call after the big export: %q %+v, want it to run", out, res)
	}
	if out, _, _ := shellDo(t, a.c, "s", "", `echo "[${BIG-}]"`); out != "[]\n" {
		t.Fatalf("unset was not recorded: %q", out)
	}

	shellDo(t, a.c, "s", "", "export TOKEN=sk-secret-42")
	var seen string
	p, err := a.c.Shell(testCtx(t), ShellRequest{Session: "s", Command: `touch ` + dir + `/running; while [ ! -e ` + dir + `/go ]; do sleep 0.01; done; echo "$TOKEN"`, Stdout: writerFunc(func(b []byte) { seen += string(b) })})
	if err != nil {
		t.Fatal(err)
	}
	if !testwait.For(t.Context(), 0, func() bool { _, err := os.Stat(dir + "/running"); return err == nil }) {
		res, err := p.Wait()
		t.Fatalf("the call did not run: %+v %v %q", res, err, seen)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(b), "sk-secret-42") {
			t.Errorf("process %s shows the recorded secret on its command line", e.Name())
		}
	}
	os.WriteFile(dir+"/go", nil, 0o644)
	if res, err := p.Wait(); err != nil || res.ExitCode != 0 || seen != "sk-secret-42\n" {
		t.Fatalf("the call: %+v %v %q", res, err, seen)
	}

	lock := dir + "/lock"
	if _, _, res := shellDo(t, a.c, "s", "", "cd "+dir+"; exec 9>"+lock+"; export AFTER=1"); res.ExitCode != 0 || res.Cwd != dir {
		t.Errorf("a call that takes fd 9: %+v, want its cd recorded", res)
	}
	if b, _ := os.ReadFile(lock); len(b) != 0 {
		t.Errorf("the state was written into the command's own fd-9 file: %q", b[:min(len(b), 60)])
	}
	if out, _, _ := shellDo(t, a.c, "s", "", `echo "$AFTER $TOKEN"`); out != "1 sk-secret-42\n" {
		t.Errorf("after the fd-9 call: %q", out)
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

// A command longer than one argument may be (128 KiB) runs, with every shell, and
// keeps the session's state; it is not on the shell's command line.
func TestShellModeLongCommand(t *testing.T) {
	for name, path := range shellPaths(t) {
		t.Run(name, func(t *testing.T) {
			a := startAgent(t)
			if _, _, res := shellDo(t, a.c, "k", path, "export KEPT=yes"); res.ExitCode != 0 {
				t.Fatalf("export: %+v", res)
			}
			body := strings.Repeat("z", 200<<10)
			cmd := "x='" + body + "'\necho ${#x} \"$KEPT\"; export AFTER=1; l=$(cat /proc/$$/cmdline 2>/dev/null); echo ${#l}"
			out, errOut, res := shellDo(t, a.c, "k", path, cmd)
			var n, cmdline int
			if _, err := fmt.Sscanf(out, "%d yes\n%d\n", &n, &cmdline); err != nil || res.ExitCode != 0 || n != len(body) || cmdline > maxArgCommand {
				t.Fatalf("a %d-byte command: exit %d, stdout %q, stderr %q (want its length, and a command line of at most %d bytes)", len(cmd), res.ExitCode, out, errOut, maxArgCommand)
			}
			if out, _, _ := shellDo(t, a.c, "k", path, `echo "$AFTER"`); out != "1\n" {
				t.Errorf("the long command's export was not recorded: %q", out)
			}
		})
	}
}
