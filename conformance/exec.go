package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sh/berth/backend"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

func execCases() []Case {
	g := "exec"
	return []Case{
		{Group: g, Name: "exit-code-0", Run: exitCodeCase(0)},
		{Group: g, Name: "exit-code-1", Run: exitCodeCase(1)},
		{Group: g, Name: "exit-code-43", Run: exitCodeCase(43)},
		{Group: g, Name: "command-not-found-127", Run: caseCommandNotFound},
		{Group: g, Name: "not-executable-126", Run: caseNotExecutable},
		{Group: g, Name: "sigkill-137", Run: caseSigkill},
		{Group: g, Name: "signal-term-143", Run: caseSignalTerm},
		{Group: g, Name: "no-ignored-signals", Run: caseNoIgnoredSignals},
		{Group: g, Name: "stdout-stderr-apart", Run: caseStdoutStderrApart},
		{Group: g, Name: "output-20mib", Run: caseOutput20MiB},
		{Group: g, Name: "non-utf8-bytes", Run: caseNonUTF8},
		{Group: g, Name: "utf8-split-write", Run: caseUTF8Split},
		{Group: g, Name: "stdin-absent-eof", Serial: true, Run: caseStdinAbsent},
		{Group: g, Name: "stdin-stream-1mib", Run: caseStdinStream},
		{Group: g, Name: "timeout-kills-tree", Serial: true, Run: caseTimeoutKillsTree},
		{Group: g, Name: "cancel-kills-tree", Serial: true, Run: caseCancelKillsTree},
		{Group: g, Name: "cancel-kills-setsid", Serial: true, Run: caseCancelKillsSetsid},
		{Group: g, Name: "no-zombies", Run: caseNoZombies},
		{Group: g, Name: "background-survives", Serial: true, Run: caseBackgroundSurvives},
		{Group: g, Name: "background-no-sigpipe", Run: caseBackgroundNoSigpipe},
		{Group: g, Name: "background-gone-after-remove", Run: caseBackgroundGoneAfterRemove},
		{Group: g, Name: "env-no-leak", Run: caseEnvNoLeak},
		{Group: g, Name: "env-overrides-spec", Run: caseEnvOverridesSpec},
		{Group: g, Name: "host-env-hidden", Serial: true, Run: caseHostEnvHidden},
		{Group: g, Name: "workdir-missing-invalid", Run: caseWorkdirMissing},
		{Group: g, Name: "empty-argv-invalid", Run: caseEmptyArgv},
	}
}

func exitCodeCase(code int) func(T, *Harness) {
	return func(t T, h *Harness) {
		sb := h.NewSandbox(t)
		out := h.run(t, sb, "sh", "-c", fmt.Sprintf("exit %d", code))
		if out.ExitCode != code || out.Signal != 0 || out.TimedOut || out.Canceled {
			t.Errorf("sh -c 'exit %d': %s", code, out.describe())
		}
	}
}

// A command that is not in PATH gives 127 and says why on stderr.
func caseCommandNotFound(t T, h *Harness) {
	sb := h.NewSandbox(t)
	cmd := "berth-conf-no-such-command-" + randHex(4)
	out := h.run(t, sb, cmd, "arg")
	if out.ExitCode != 127 {
		t.Errorf("running %s: %s, want exit 127", cmd, out.describe())
	}
	if !strings.Contains(out.Stderr, cmd) {
		t.Errorf("stderr %q does not name the command %s", out.Stderr, cmd)
	}
}

// A file without execute permission gives 126 and says why on stderr.
func caseNotExecutable(t T, h *Harness) {
	sb := h.NewSandbox(t)
	file := "berth-conf-noexec-" + randHex(4)
	out := h.sh(t, sb, `printf '#!/bin/sh\necho ran\n' > "$1" && chmod 644 "$1" && pwd`, file)
	path := strings.TrimRight(out.Stdout, "\n")
	if path == "/" {
		path = ""
	}
	path += "/" + file
	out = h.run(t, sb, path)
	if out.ExitCode != 126 {
		t.Errorf("running non-executable %s: %s, want exit 126", path, out.describe())
	}
	if !strings.Contains(out.Stderr, file) {
		t.Errorf("stderr %q does not name the file %s", out.Stderr, path)
	}
	if strings.Contains(out.Stdout, "ran") {
		t.Errorf("the non-executable file ran: stdout %q", out.Stdout)
	}
}

// A process killed by SIGKILL gives 137 and signal 9.
func caseSigkill(t T, h *Harness) {
	sb := h.NewSandbox(t)
	out := h.run(t, sb, "sh", "-c", "kill -KILL $$")
	if out.ExitCode != 137 || out.Signal != 9 {
		t.Errorf("sh -c 'kill -KILL $$': %s, want exit 137 signal 9", out.describe())
	}
}

// Process.Signal(SIGTERM) on sleep gives 143 and signal 15.
func caseSignalTerm(t T, h *Harness) {
	sb := h.NewSandbox(t)
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	stdout := newNotifyWriter("ready\n")
	p, err := h.Exec(ctx, sb, backend.ExecRequest{Argv: []string{"sh", "-c", "echo ready; exec sleep 300"}, Stdout: stdout})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	select {
	case <-stdout.seen:
	case <-time.After(testwait.Limit):
		cancel()
		_, _ = p.Wait()
		t.Fatalf("no \"ready\" within %v (stdout %q)", testwait.Limit, stdout.String())
	}
	if err := p.Signal(15); err != nil {
		t.Errorf("Signal(SIGTERM): %v", err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	// 143 and signal 15 say the signal ended it, not the sleep's 300 s.
	if res.ExitCode != 143 || res.Signal != 15 {
		t.Errorf("sleep after SIGTERM: exit %d signal %d, want 143 15", res.ExitCode, res.Signal)
	}
}

// The exec's process starts with no signal ignored (the agent's own ignored signals
// must not be inherited: an ignored SIGPIPE breaks pipelines). The mask is read from
// /proc/self/status; a kernel whose status has no SigIgn line (gVisor's) is probed
// instead, signal by signal (probeIgnoredSignals).
func caseNoIgnoredSignals(t T, h *Harness) {
	sb := h.NewSandbox(t)
	out := h.run(t, sb, "grep", "-c", "^SigIgn:", "/proc/self/status")
	if out.ExitCode == 1 && strings.TrimSpace(out.Stdout) == "0" {
		probeIgnoredSignals(t, h, sb)
		return
	}
	out = h.run(t, sb, "grep", "^SigIgn:", "/proc/self/status")
	if out.ExitCode != 0 {
		t.Fatalf("grep SigIgn /proc/self/status: %s", out.describe())
	}
	f := strings.Fields(out.Stdout)
	if len(f) != 2 {
		t.Fatalf("unexpected /proc/self/status line %q", out.Stdout)
	}
	mask, err := strconv.ParseUint(f[1], 16, 64)
	if err != nil {
		t.Fatalf("parsing %q: %v", out.Stdout, err)
	}
	if mask != 0 {
		var sigs []int
		for i := range 64 {
			if mask&(1<<i) != 0 {
				sigs = append(sigs, i+1)
			}
		}
		t.Errorf("the exec starts with signals %v ignored (SigIgn %s), want none", sigs, f[1])
	}
}

// probedSignals are the signals probeIgnoredSignals sends, by name and number: those
// whose default action ends the process, but SIGQUIT, which a shell (busybox's ash)
// may catch itself.
var probedSignals = []struct {
	name string
	num  int
}{{"HUP", 1}, {"INT", 2}, {"USR1", 10}, {"USR2", 12}, {"PIPE", 13}, {"ALRM", 14}, {"TERM", 15}}

// probeIgnoredSignals checks, without /proc's SigIgn, that an exec's process has
// none of probedSignals ignored: a shell the exec starts sends each to itself, and it
// must die of it (128+N). A shell cannot undo a disposition it inherited as ignored
// (POSIX, "Signals and Error Handling"), so an ignored one shows as the shell living
// on to exit 0.
func probeIgnoredSignals(t T, h *Harness, sb string) {
	var script strings.Builder
	for _, s := range probedSignals {
		fmt.Fprintf(&script, "sh -c 'kill -%s $$; exit 0'; echo %s $?\n", s.name, s.name)
	}
	out := h.run(t, sb, "sh", "-c", script.String())
	if out.ExitCode != 0 {
		t.Fatalf("probing ignored signals: %s", out.describe())
	}
	var ignored []string
	for _, s := range probedSignals {
		if !strings.Contains("\n"+out.Stdout, fmt.Sprintf("\n%s %d\n", s.name, 128+s.num)) {
			ignored = append(ignored, s.name)
		}
	}
	if len(ignored) > 0 {
		t.Errorf("/proc/self/status has no SigIgn line, and a shell started by the exec survives these signals it sends itself, so it started with them ignored: %v (output %q)", ignored, out.Stdout)
	}
}

// stdout and stderr arrive on their own streams, in order.
func caseStdoutStderrApart(t T, h *Harness) {
	sb := h.NewSandbox(t)
	out := h.run(t, sb, "sh", "-c", "echo out1; echo err1 >&2; echo out2; echo err2 >&2")
	if out.ExitCode != 0 || out.Stdout != "out1\nout2\n" || out.Stderr != "err1\nerr2\n" {
		t.Errorf("%s, want stdout \"out1\\nout2\\n\" and stderr \"err1\\nerr2\\n\"", out.describe())
	}
}

// outputSize is the size of the large-output case's stream.
const outputSize = 20 << 20

// 20 MiB of stdout arrive complete and in order; the case checks it as it arrives and
// keeps none of it.
func caseOutput20MiB(t T, h *Harness) {
	sb := h.NewSandbox(t)
	v := newVerifier(newSeqGen())
	stderr := &testwait.Buffer{}
	out, err := h.exec(t, sb, backend.ExecRequest{
		Argv:   []string{"sh", "-c", fmt.Sprintf("seq 1 4000000 | head -c %d", outputSize)},
		Stdout: v, Stderr: stderr,
	})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	n, mismatch, sum := v.result()
	if out.ExitCode != 0 {
		t.Errorf("exit %d, stderr %q", out.ExitCode, clip(stderr.String()))
	}
	if n != outputSize {
		t.Errorf("got %d bytes of stdout, want %d", n, outputSize)
	}
	if mismatch >= 0 {
		t.Errorf("stdout differs from `seq` output at byte %d", mismatch)
	}
	if want := prefixSum(newSeqGen(), n); sum != want {
		t.Errorf("sha256 of stdout %s, want %s", sum, want)
	}
	t.Logf("%d bytes in %s", n, out.Elapsed.Round(time.Millisecond))
}

// Bytes that are not UTF-8 (and NULs) arrive unchanged on both streams.
func caseNonUTF8(t T, h *Harness) {
	sb := h.NewSandbox(t)
	script := `printf '\377\376\200abc\300\n'; head -c 3 /dev/zero; printf '\377\300\n' >&2; head -c 2 /dev/zero >&2`
	out := h.run(t, sb, "sh", "-c", script)
	if want := "\xff\xfe\x80abc\xc0\n\x00\x00\x00"; out.Stdout != want {
		t.Errorf("stdout %q, want %q", out.Stdout, want)
	}
	if want := "\xff\xc0\n\x00\x00"; out.Stderr != want {
		t.Errorf("stderr %q, want %q", out.Stderr, want)
	}
	if out.ExitCode != 0 {
		t.Errorf("%s", out.describe())
	}
}

// A 3-byte character written in two parts arrives unchanged on both streams. The
// second part is written only once the first has reached the caller (a file that a
// second exec makes), so the parts are apart whatever the machine's speed.
func caseUTF8Split(t T, h *Harness) {
	sb := h.NewSandbox(t)
	tag := randHex(4)
	go1, go2 := "berth-conf-split1-"+tag, "berth-conf-split2-"+tag
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	stdout, stderr := newNotifyWriter("\342\202"), newNotifyWriter("\342")
	p, err := h.Exec(ctx, sb, backend.ExecRequest{Argv: []string{"sh", "-c",
		`printf '\342\202'; while [ ! -e "$1" ]; do sleep 0.01; done; printf '\254\n'; ` +
			`printf '\342' >&2; while [ ! -e "$2" ]; do sleep 0.01; done; printf '\202\254\n' >&2`, "sh", go1, go2},
		Stdout: stdout, Stderr: stderr})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	for _, step := range []struct {
		w    *notifyWriter
		file string
	}{{stdout, go1}, {stderr, go2}} {
		select {
		case <-step.w.seen:
		case <-time.After(testwait.Limit):
			cancel()
			_, _ = p.Wait()
			t.Fatalf("the first part never arrived (stdout %q, stderr %q)", stdout.String(), stderr.String())
		}
		h.sh(t, sb, `: > "$1"`, step.file)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if stdout.String() != "\u20ac\n" {
		t.Errorf("stdout %q, want %q", stdout.String(), "\u20ac\n")
	}
	if stderr.String() != "\u20ac\n" {
		t.Errorf("stderr %q, want %q", stderr.String(), "\u20ac\n")
	}
	if res.ExitCode != 0 {
		t.Errorf("exit %d", res.ExitCode)
	}
}

// `cat` without stdin reads EOF: it ends with empty output (with stdin left open it
// would block until its timeout, which is only a safety net).
func caseStdinAbsent(t T, h *Harness) {
	sb := h.NewSandbox(t)
	out, err := h.exec(t, sb, backend.ExecRequest{Argv: []string{"cat"}, Timeout: testwait.Limit})
	if err != nil {
		t.Fatalf("exec cat: %v", err)
	}
	if out.TimedOut || out.ExitCode != 0 || out.Stdout != "" || out.Stderr != "" {
		t.Errorf("cat without stdin: %s, want exit 0 and no output", out.describe())
	}
}

// stdinSize is how much the stdin case streams through cat.
const stdinSize = 1 << 20

// 1 MiB written through Process.Write comes back through cat in full; CloseStdin ends
// cat.
func caseStdinStream(t T, h *Harness) {
	sb := h.NewSandbox(t)
	gen := newStreamGen()
	v := newVerifier(gen.clone())
	stderr := &testwait.Buffer{}
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	p, err := h.Exec(ctx, sb, backend.ExecRequest{Argv: []string{"cat"}, Stdin: true, Stdout: v, Stderr: stderr})
	if err != nil {
		t.Fatalf("Exec cat: %v", err)
	}
	buf := make([]byte, 32<<10)
	for sent := 0; sent < stdinSize; sent += len(buf) {
		_, _ = gen.Read(buf)
		if err := writeAll(p, buf); err != nil {
			cancel()
			_, _ = p.Wait()
			t.Fatalf("Write after %d bytes: %v", sent, err)
		}
	}
	if err := p.CloseStdin(); err != nil {
		t.Errorf("CloseStdin: %v", err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if res.ExitCode != 0 {
		t.Errorf("cat: exit %d, stderr %q", res.ExitCode, stderr.String())
	}
	n, mismatch, sum := v.result()
	if n != stdinSize {
		t.Errorf("cat echoed %d bytes, want %d", n, stdinSize)
	}
	if mismatch >= 0 {
		t.Errorf("cat's output differs from its input at byte %d", mismatch)
	}
	if want := prefixSum(gen.clone(), n); sum != want {
		t.Errorf("sha256 of cat's output %s, want %s", sum, want)
	}
}

// writeAll writes p to the process's stdin, going on after short writes.
func writeAll(p backend.Process, b []byte) error {
	for len(b) > 0 {
		n, err := p.Write(b)
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("Write wrote nothing")
		}
		b = b[n:]
	}
	return nil
}

// startBackground starts `sleep 300` in the background of sb with a fresh marker,
// checks that the exec returned "started" and that the sleep runs, and returns the
// marker.
func (h *Harness) startBackground(t T, sb string) string {
	t.Helper()
	mark := newMarker()
	out, err := h.exec(t, sb, backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 & echo started"}, Env: []string{mark}})
	if err != nil || out.ExitCode != 0 || out.Stdout != "started\n" {
		t.Fatalf("starting a background sleep: err %v, %s", err, out.describe())
	}
	// The sleep may still be between fork and exec when "started" arrives.
	if len(h.markedAlive(t, sb, mark)) == 0 {
		t.Fatalf("the background sleep is not running after its exec returned (or the sandbox's /proc does not show it)")
	}
	return mark
}

// Timeout kills the whole tree: `sh -c 'sleep 300 & sleep 300'` with a 1 s timeout
// returns with TimedOut, not before the timeout and long before the sleeps end, and
// no process of it is left; a background process of an earlier exec is not touched.
// (How soon after the timeout depends on the machine's load and is not checked.)
func caseTimeoutKillsTree(t T, h *Harness) {
	sb := h.NewSandbox(t)
	other := h.startBackground(t, sb)
	mark := newMarker()
	out, err := h.exec(t, sb, backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 & sleep 300"}, Env: []string{mark}, Timeout: time.Second})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if !out.TimedOut {
		t.Errorf("result %s, want TimedOut", out.describe())
	}
	if out.Elapsed < time.Second || out.Elapsed >= 300*time.Second {
		t.Errorf("returned after %s, want at least the 1 s timeout and less than the sleeps' 300 s", out.Elapsed)
	}
	if ps := liveOnly(h.marked(t, sb, mark)); len(ps) > 0 {
		t.Errorf("processes of the timed-out exec still run after its result: %v", ps)
	}
	if len(h.markedAlive(t, sb, other)) == 0 {
		t.Errorf("the timeout also killed a background process of an earlier exec")
	}
}

// Cancelling the Exec context kills the whole tree, and Wait reports Canceled (once the
// tree is gone).
func caseCancelKillsTree(t T, h *Harness) {
	sb := h.NewSandbox(t)
	mark := newMarker()
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	stdout := newNotifyWriter("started\n")
	p, err := h.Exec(ctx, sb, backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 & echo started; sleep 300"}, Env: []string{mark}, Stdout: stdout})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	select {
	case <-stdout.seen:
	case <-time.After(testwait.Limit):
		cancel()
		_, _ = p.Wait()
		t.Fatalf("no \"started\" within %v (stdout %q)", testwait.Limit, stdout.String())
	}
	// The leader may be between fork and exec (or exec-ing its last command, as
	// busybox sh does) when "started" arrives; give the scan a moment.
	if !testwait.For(t.Context(), 0, func() bool { return len(liveOnly(h.marked(t, sb, mark))) >= 2 }) {
		t.Errorf("before cancel: fewer than two marked processes run (the scan does not see them)")
	}
	cancel()
	res, err := p.Wait()
	if !res.Canceled && !errors.Is(err, context.Canceled) {
		t.Errorf("Wait after cancel: result %+v, err %v; want Canceled set (or an error wrapping context.Canceled)", res, err)
	}
	if ps := liveOnly(h.marked(t, sb, mark)); len(ps) > 0 {
		t.Errorf("processes of the cancelled exec still run after Wait returned: %v", ps)
	}
}

// zombieRuns is how many short-lived execs with a background child the zombie case
// runs.
const zombieRuns = 200

// 200 runs of `sh -c 'sleep 0.05 & exit 0'` leave no zombie behind.
func caseNoZombies(t T, h *Harness) {
	sb := h.NewSandbox(t)
	leaders := map[int]bool{}
	parents := map[int]bool{}
	for i := range zombieRuns {
		out := h.run(t, sb, "sh", "-c", "echo $$ $PPID; sleep 0.05 & exit 0")
		f := strings.Fields(out.Stdout)
		if out.ExitCode != 0 || len(f) != 2 {
			t.Fatalf("run %d: %s", i, out.describe())
		}
		l, err1 := strconv.Atoi(f[0])
		p, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			t.Fatalf("run %d: stdout %q", i, out.Stdout)
		}
		leaders[l] = true
		if p > 1 || h.Info.Capabilities.PIDIsolation {
			parents[p] = true
		}
	}
	ours := func(p procInfo) bool {
		return leaders[p.SID] || leaders[p.PPID] || leaders[p.PID] || parents[p.PPID]
	}
	var zombies []procInfo
	clean := testwait.For(t.Context(), 0, func() bool {
		zombies = zombies[:0]
		for _, p := range parseStat(h.sh(t, sb, statScript).Stdout) {
			if p.State == 'Z' && (ours(p) || h.Info.Capabilities.PIDIsolation) {
				zombies = append(zombies, p)
			}
		}
		return len(zombies) == 0
	})
	if !clean {
		t.Errorf("%d zombies remain %v after %d runs: %v", len(zombies), testwait.Limit, zombieRuns, zombies)
	}
}

// A background process that an exec leaves behind: the exec returns "started" within
// 1 s, and the process is alive during the next exec.
func caseBackgroundSurvives(t T, h *Harness) {
	sb := h.NewSandbox(t)
	mark := newMarker()
	out, err := h.exec(t, sb, backend.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 & echo started"}, Env: []string{mark}})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if out.ExitCode != 0 || out.Stdout != "started\n" {
		t.Errorf("%s, want exit 0 and \"started\"", out.describe())
	}
	// Had it waited for the child that holds stdout, it would have ended with the
	// sleep (300 s) or at its timeout. How soon it returned depends on the
	// machine's load and is not checked.
	if out.TimedOut || out.Elapsed >= 300*time.Second {
		t.Errorf("the exec returned after %s (%s), want when its leader exits although its background child holds stdout", out.Elapsed, out.describe())
	}
	ps := h.markedAlive(t, sb, mark)
	if len(ps) == 0 {
		t.Fatalf("the background sleep is not running during the next exec")
	}
	t.Logf("background process: %v", ps)
}

// A background process that writes to the exec's stdout after the exec returned is not
// killed by SIGPIPE and its write succeeds. It writes once a later exec has made a
// file, so after the first exec's result whatever the machine's speed.
func caseBackgroundNoSigpipe(t T, h *Harness) {
	sb := h.NewSandbox(t)
	file := "berth-conf-late-" + randHex(4)
	gofile := file + ".go"
	out := h.sh(t, sb, `(while [ ! -e "$2" ]; do sleep 0.05; done; if echo late && echo late >&2; then echo alive > "$1"; else echo write-failed > "$1"; fi) & echo started`, file, gofile)
	if out.Stdout != "started\n" {
		t.Errorf("stdout %q, want \"started\\n\"", out.Stdout)
	}
	h.sh(t, sb, `: > "$1"`, gofile)
	var got execOut
	ok := testwait.For(t.Context(), 0, func() bool {
		got = h.run(t, sb, "cat", file)
		return got.ExitCode == 0 && got.Stdout != ""
	})
	switch {
	case !ok:
		t.Errorf("the background process never wrote %s after its late output (killed by SIGPIPE?): last cat %s", file, got.describe())
	case got.Stdout != "alive\n":
		t.Errorf("the background process's late write to stdout failed: %s says %q", file, got.Stdout)
	}
}

// A background process is gone after Remove (checked on the host's /proc, where the
// driver's processes are visible there).
func caseBackgroundGoneAfterRemove(t T, h *Harness) {
	sb := h.NewSandbox(t)
	mark := h.startBackground(t, sb)
	if len(hostMarked(mark)) == 0 {
		t.Skipf("the sandbox's processes are not visible in this host's /proc (driver %s runs them elsewhere or hides them), so their end cannot be observed", h.Info.Name)
	}
	h.remove(t, sb)
	if pids := hostMarked(mark); len(pids) > 0 {
		t.Errorf("after Remove, processes of the sandbox still run on the host: pids %v", pids)
	}
}

// Env given to one exec does not leak into the next.
func caseEnvNoLeak(t T, h *Harness) {
	sb := h.NewSandbox(t)
	val := randHex(8)
	out, err := h.exec(t, sb, backend.ExecRequest{Argv: []string{"env"}, Env: []string{"BERTH_CONF_ONE=" + val}})
	if err != nil || out.ExitCode != 0 {
		t.Fatalf("env: %v %s", err, out.describe())
	}
	if !slices.Contains(envLines(out.Stdout), "BERTH_CONF_ONE="+val) {
		t.Errorf("the exec's own env lacks BERTH_CONF_ONE=%s: %q", val, clip(out.Stdout))
	}
	out = h.run(t, sb, "env")
	if hasEnvKey(out.Stdout, "BERTH_CONF_ONE") || strings.Contains(out.Stdout, val) {
		t.Errorf("BERTH_CONF_ONE from the previous exec is visible in the next: %q", clip(out.Stdout))
	}
}

// The spec's env reaches every exec, and an exec's Env overrides it (one entry, the
// exec's value).
func caseEnvOverridesSpec(t T, h *Harness) {
	sb := h.NewSandboxWith(t, func(s *backend.SandboxSpec) {
		s.Env = []string{"BERTH_CONF_SPEC=spec", "BERTH_CONF_KEEP=kept"}
	})
	out := h.run(t, sb, "env")
	lines := envLines(out.Stdout)
	if !slices.Contains(lines, "BERTH_CONF_SPEC=spec") || !slices.Contains(lines, "BERTH_CONF_KEEP=kept") {
		t.Errorf("the spec's env is not in the exec's: %q", clip(out.Stdout))
	}
	o2, err := h.exec(t, sb, backend.ExecRequest{Argv: []string{"env"}, Env: []string{"BERTH_CONF_SPEC=exec"}})
	if err != nil {
		t.Fatalf("env: %v", err)
	}
	var got []string
	for _, l := range envLines(o2.Stdout) {
		if strings.HasPrefix(l, "BERTH_CONF_SPEC=") {
			got = append(got, l)
		}
	}
	if len(got) != 1 || got[0] != "BERTH_CONF_SPEC=exec" {
		t.Errorf("with the exec's BERTH_CONF_SPEC=exec over the spec's, env has %q, want exactly [BERTH_CONF_SPEC=exec]", got)
	}
	if !slices.Contains(envLines(o2.Stdout), "BERTH_CONF_KEEP=kept") {
		t.Errorf("the spec's BERTH_CONF_KEEP is gone when the exec sets other env")
	}
}

// envIdentity are variables a sandbox sets for itself; equal values on the host and in
// the sandbox do not show a leak.
var envIdentity = []string{"HOME", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "USER", "LOGNAME", "SHELL", "_", "TMPDIR"}

// secretVar is the host variable that host-env-hidden sets before creating its
// sandbox.
const secretVar = "BERTH_CONF_SECRET"

// Host variables off the allowlist are not visible in the sandbox; one set in the host
// process just before Create (so a local agent would inherit it) included.
func caseHostEnvHidden(t T, h *Harness) {
	secret := randHex(8)
	old, had := os.LookupEnv(secretVar)
	if err := os.Setenv(secretVar, secret); err != nil {
		t.Fatalf("Setenv: %v", err)
	}
	t.Cleanup(func() {
		if had {
			_ = os.Setenv(secretVar, old)
		} else {
			_ = os.Unsetenv(secretVar)
		}
	})
	sb := h.NewSandboxWith(t, func(s *backend.SandboxSpec) { s.Env = []string{"BERTH_CONF_SPEC=1"} })
	out := h.run(t, sb, "env")
	if out.ExitCode != 0 {
		t.Fatalf("env: %s", out.describe())
	}
	lines := envLines(out.Stdout)
	if !slices.Contains(lines, "BERTH_CONF_SPEC=1") {
		t.Errorf("the spec's env is not visible (env printed %q)", clip(out.Stdout))
	}
	if hasEnvKey(out.Stdout, secretVar) || strings.Contains(out.Stdout, secret) {
		t.Errorf("host variable %s (off the allowlist) is visible in the sandbox", secretVar)
	}
	allow := backend.DefaultEnvAllowlist
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if len(v) < 2 || slices.Contains(allow, k) || slices.Contains(envIdentity, k) || k == secretVar {
			continue
		}
		if slices.Contains(lines, kv) {
			t.Errorf("host variable %s (off the allowlist) is visible in the sandbox with the host's value", k)
		}
	}
}

// A working directory that does not exist is an error wrapping ErrInvalid that names
// it.
func caseWorkdirMissing(t T, h *Harness) {
	sb := h.NewSandbox(t)
	dir := "/berth-conf-missing-" + randHex(4)
	out, err := h.exec(t, sb, backend.ExecRequest{Argv: []string{"true"}, Dir: dir})
	if err == nil {
		t.Fatalf("exec with Dir %s: no error (%s), want one wrapping ErrInvalid", dir, out.describe())
	}
	wantKind(t, "exec with a missing Dir", err, backend.ErrInvalid)
	if !strings.Contains(err.Error(), dir) {
		t.Errorf("the error %q does not name the directory %s", err, dir)
	}
}

// An exec without argv is ErrInvalid.
func caseEmptyArgv(t T, h *Harness) {
	sb := h.NewSandbox(t)
	_, err := h.exec(t, sb, backend.ExecRequest{})
	wantKind(t, "exec with an empty argv", err, backend.ErrInvalid)
	if out := h.run(t, sb, "true"); out.ExitCode != 0 {
		t.Errorf("exec after the refused one: %s", out.describe())
	}
}
