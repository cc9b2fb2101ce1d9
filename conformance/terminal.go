package conformance

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// markerRE finds the truncation marker line of capped output and its count.
var markerRE = regexp.MustCompile(`\n\[\.\.\. (\d+) bytes truncated \.\.\.\]\n`)

// needAgent is Case.Needs for the shell-mode and job cases: they come with berth's
// agent.
func needAgent(c backend.Capabilities) (bool, string) {
	if !c.HasAgent() {
		return false, "driver's sandboxes run no berth agent (Capabilities.Agent is empty), which shell mode and jobs need"
	}
	return true, ""
}

func terminalCases() []Case {
	g := "terminal"
	return []Case{
		{Group: g, Name: "shell-state-persists", Requires: "Capabilities.Agent", Needs: needAgent, Run: caseShellStatePersists},
		{Group: g, Name: "shell-survives-bad-calls", Requires: "Capabilities.Agent", Needs: needAgent, Run: caseShellSurvivesBadCalls},
		{Group: g, Name: "shell-keys-parallel", Requires: "Capabilities.Agent", Needs: needAgent, Run: caseShellKeysParallel},
		{Group: g, Name: "shell-calls-side-by-side", Requires: "Capabilities.Agent", Needs: needAgent, Run: caseShellCallsSideBySide},
		{Group: g, Name: "shell-output-capped", Requires: "Capabilities.Agent, a registry", Needs: needAgent, Run: caseShellOutputCapped, registry: true},
		{Group: g, Name: "shell-sessions-parallel", Requires: "Capabilities.Agent, a registry", Needs: needAgent, Run: caseShellSessionsParallel, registry: true},
		{Group: g, Name: "job-lifecycle", Requires: "Capabilities.Agent", Needs: needAgent, Run: caseJobLifecycle},
		{Group: g, Name: "copy-round-trip", Requires: "Capabilities.Copy", Needs: needCopy, Run: caseCopyRoundTrip},
		{Group: g, Name: "copy-symlink-contained", Requires: "Capabilities.Copy", Needs: needCopy, Run: caseCopySymlinkContained},
	}
}

// needCopy is Case.Needs for the copy cases.
func needCopy(c backend.Capabilities) (bool, string) {
	if !c.Copy {
		return false, "driver does not claim Capabilities.Copy"
	}
	return true, ""
}

// copyIn extracts the tar stream tr into dir of sandbox sb the way berth's host
// does: through the agent, or the driver's Copier for drivers without one.
func (h *Harness) copyIn(ctx context.Context, sb, dir string, tr []byte) error {
	if !h.Info.Capabilities.HasAgent() {
		return h.Backend.(backend.Copier).CopyIn(ctx, sb, dir, bytes.NewReader(tr))
	}
	c, err := h.Connect(ctx, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.CopyIn(ctx, dir, bytes.NewReader(tr))
}

// copyOut writes path of sandbox sb to w as a tar stream (see copyIn).
func (h *Harness) copyOut(ctx context.Context, sb, path string, w io.Writer) error {
	if !h.Info.Capabilities.HasAgent() {
		return h.Backend.(backend.Copier).CopyOut(ctx, sb, path, w)
	}
	c, err := h.Connect(ctx, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.CopyOut(ctx, path, w)
}

// client connects to sb's agent (Connect) for the case, closed when it ends.
func (h *Harness) client(t T, sb string) *agent.Client {
	t.Helper()
	ctx, cancel := h.ctx(t)
	defer cancel()
	c, err := h.Connect(ctx, sb)
	if err != nil {
		t.Fatalf("connecting to the agent of %s: %v", sb, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tarEntry is one entry of a tar stream that a copy case builds.
type tarEntry struct {
	name, link, body string
	dir              bool
	mode             int64
	mtime            time.Time
}

func makeTar(t T, entries []tarEntry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Typeflag: tar.TypeReg, Size: int64(len(e.body)), ModTime: e.mtime, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Size = tar.TypeDir, 0
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("building a tar stream: %v", err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

// A tree copied in (a directory, a file with mode 0640 and an old mtime, a symlink)
// comes back out the same.
func caseCopyRoundTrip(t T, h *Harness) {
	sb := h.NewSandbox(t)
	dir := "/tmp/berth-cp-" + randHex(4)
	h.sh(t, sb, `mkdir -p "$1"`, dir)
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	in := []tarEntry{
		{name: "tree/", dir: true, mode: 0o750, mtime: mtime},
		{name: "tree/f.txt", body: "hello\n", mode: 0o640, mtime: mtime},
		{name: "tree/link", link: "f.txt", mtime: mtime},
	}
	ctx, cancel := h.ctx(t)
	defer cancel()
	if err := h.copyIn(ctx, sb, dir, makeTar(t, in)); err != nil {
		t.Fatalf("CopyIn: %v", err)
	}
	var out bytes.Buffer
	if err := h.copyOut(ctx, sb, dir+"/tree", &out); err != nil {
		t.Fatalf("CopyOut: %v", err)
	}
	got := map[string]*tar.Header{}
	tr := tar.NewReader(&out)
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		got[strings.TrimSuffix(hdr.Name, "/")] = hdr
	}
	for _, want := range in {
		hdr := got[strings.TrimSuffix(want.name, "/")]
		switch {
		case hdr == nil:
			t.Errorf("%s is missing from CopyOut (got %v)", want.name, got)
		case want.link != "" && (hdr.Typeflag != tar.TypeSymlink || hdr.Linkname != want.link):
			t.Errorf("%s: type %c link %q, want a symlink to %q", want.name, hdr.Typeflag, hdr.Linkname, want.link)
		case want.link == "" && (hdr.Mode&0o7777 != want.mode || !hdr.ModTime.Equal(want.mtime)):
			t.Errorf("%s: mode %o mtime %v, want %o %v", want.name, hdr.Mode&0o7777, hdr.ModTime, want.mode, want.mtime)
		}
	}
}

// A tar stream whose symlink points out of the destination, followed by an entry
// through that link, writes nothing outside the destination.
func caseCopySymlinkContained(t T, h *Harness) {
	sb := h.NewSandbox(t)
	id := randHex(4)
	dst, outside := "/tmp/berth-cpdst-"+id, "/tmp/berth-cpout-"+id
	h.sh(t, sb, `mkdir -p "$1" "$2"`, dst, outside)
	evil := makeTar(t, []tarEntry{
		{name: "t/", dir: true},
		{name: "t/link", link: outside},
		{name: "t/link/evil", body: "x"},
		{name: "../escape", body: "x"},
	})
	ctx, cancel := h.ctx(t)
	defer cancel()
	err := h.copyIn(ctx, sb, dst, evil)
	if err == nil {
		t.Errorf("CopyIn of a stream that writes through a link succeeded")
	}
	if out := h.sh(t, sb, `ls -A "$1"; test -e "$2/../escape" && echo escaped; true`, outside, dst); strings.TrimSpace(out.Stdout) != "" {
		t.Errorf("CopyIn wrote outside the destination: %q", out.Stdout)
	}
}

// A job running `while :; do date; sleep 1; done` is listed, its log grows after the
// call that started it has ended, kill stops it, and no process of it is left once
// the sandbox is removed.
func caseJobLifecycle(t T, h *Harness) {
	sb := h.NewSandbox(t)
	c := h.client(t, sb)
	ctx, cancel := h.ctx(t)
	defer cancel()
	marker := newMarker()
	j, err := c.StartJob(ctx, agent.StartJobRequest{Session: "s", Argv: []string{"env", marker, "sh", "-c", "while :; do date; sleep 1; done"}})
	if err != nil || j.ID == "" || !j.Running {
		t.Fatalf("job start: %+v %v", j, err)
	}
	jobs, err := c.Jobs(ctx, "s")
	if err != nil || len(jobs) != 1 || jobs[0].ID != j.ID || !jobs[0].Running {
		t.Fatalf("job list %+v %v: want job %s running", jobs, err, j.ID)
	}
	if other, err := c.Jobs(ctx, "other"); err != nil || len(other) != 0 {
		t.Errorf("another session lists %+v %v", other, err)
	}
	lines := func() int {
		var out bytes.Buffer
		if _, err := c.JobLogs(ctx, agent.JobLogsRequest{Session: "s", ID: j.ID}, &out); err != nil {
			t.Fatalf("job logs: %v", err)
		}
		return strings.Count(out.String(), "\n")
	}
	first := lines()
	if !testwait.For(t.Context(), 0, func() bool { return lines() >= first+2 }) {
		t.Fatalf("the job's log did not grow from %d lines", first)
	}
	if err := c.KillJob(ctx, "s", j.ID); err != nil {
		t.Fatalf("job kill: %v", err)
	}
	if jobs, err = c.Jobs(ctx, "s"); err != nil || len(jobs) != 1 || jobs[0].Running {
		t.Errorf("job list after kill %+v %v: want it ended", jobs, err)
	}
	n := lines()
	if again := lines(); again != n {
		t.Errorf("the killed job's log still grows (%d, then %d lines)", n, again)
	}
	// A second job dies with the sandbox.
	if _, err := c.StartJob(ctx, agent.StartJobRequest{Session: "s", Argv: []string{"env", marker, "sleep", "3600"}}); err != nil {
		t.Fatalf("job start: %v", err)
	}
	h.remove(t, sb)
	if !h.Info.Capabilities.PIDIsolation && !testwait.For(t.Context(), 0, func() bool { return len(hostMarked(marker)) == 0 }) {
		t.Errorf("job processes %v outlived their removed sandbox", hostMarked(marker))
	}
}

// shellExec runs cmd in shell mode under key in sb through the sandbox's agent.
func (h *Harness) shellExec(t T, sb, key, cmd string) (execOut, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	c, err := h.Connect(ctx, sb)
	if err != nil {
		return execOut{}, err
	}
	defer c.Close()
	var stdout, stderr testwait.Buffer
	start := time.Now()
	p, err := c.Shell(ctx, agent.ShellRequest{Command: cmd, Session: key, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return execOut{}, err
	}
	res, err := p.Wait()
	return execOut{ExecResult: res, Stdout: stdout.String(), Stderr: stderr.String(), Elapsed: time.Since(start)}, err
}

// shell runs cmd in shell mode under key in sb and fails the case if it cannot be run.
func (h *Harness) shell(t T, sb, key, cmd string) execOut {
	t.Helper()
	out, err := h.shellExec(t, sb, key, cmd)
	if err != nil {
		t.Fatalf("shell-mode call %q (key %s) in %s: %v", cmd, key, sb, err)
	}
	return out
}

// `cd` and `export` in one shell-mode call hold in the next.
func caseShellStatePersists(t T, h *Harness) {
	sb := h.NewSandbox(t)
	if out := h.shell(t, sb, "s", "cd /tmp && export A=1"); out.ExitCode != 0 || out.Cwd != "/tmp" {
		t.Fatalf("cd /tmp && export A=1: %s cwd %q, want exit 0 and cwd /tmp", out.describe(), out.Cwd)
	}
	if out := h.shell(t, sb, "s", `pwd; echo "$A"`); out.Stdout != "/tmp\n1\n" || out.Cwd != "/tmp" {
		t.Errorf("the next call: %s cwd %q, want \"/tmp\\n1\\n\"", out.describe(), out.Cwd)
	}
	// A plain exec is not affected by the shell state.
	if out := h.run(t, sb, "sh", "-c", `echo "[$A]"`); out.Stdout != "[]\n" {
		t.Errorf("a plain exec sees the shell state: %s", out.describe())
	}
}

// Calls that end their shell early (set -e, exit, a syntax error, an unterminated
// heredoc, exec) end only themselves: the next call works, with the last state.
func caseShellSurvivesBadCalls(t T, h *Harness) {
	sb := h.NewSandbox(t)
	h.shell(t, sb, "s", "cd /tmp && export A=kept")
	for _, c := range []struct {
		cmd  string
		code int // -1: any failure, -2: anything (bash runs an unterminated heredoc)
	}{
		{"set -e; false; echo not-reached", 1},
		{"exit 7", 7},
		{"if then fi (", -1},
		{"cat <<EOF\nno terminator", -2},
		{"exec true", 0},
	} {
		out := h.shell(t, sb, "s", c.cmd)
		if c.code >= 0 && out.ExitCode != c.code || strings.Contains(out.Stdout, "not-reached") {
			t.Errorf("%q: %s, want exit %d", c.cmd, out.describe(), c.code)
		}
		if c.code == -1 && out.ExitCode == 0 {
			t.Errorf("%q: exit 0, want a failure", c.cmd)
		}
		if next := h.shell(t, sb, "s", `echo "ok $A $(pwd)"`); next.Stdout != "ok kept /tmp\n" || next.ExitCode != 0 {
			t.Errorf("the call after %q: %s, want \"ok kept /tmp\"", c.cmd, next.describe())
		}
	}
}

// Ten shell keys in one sandbox, each making 20 calls in parallel with the others:
// every call sees its own key's state only.
func caseShellKeysParallel(t T, h *Harness) {
	sb := h.NewSandbox(t)
	const keys, calls = 10, 20
	var wg sync.WaitGroup
	errs := make(chan string, keys*calls)
	for k := 0; k < keys; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "key-" + strconv.Itoa(k)
			for i := 0; i < calls; i++ {
				cmd := fmt.Sprintf(`[ "${K-}" = "%s" ] && [ "${N-}" = "%d" ] && echo ok; export K=%s N=%d`, key, i-1, key, i)
				if i == 0 {
					cmd = fmt.Sprintf(`[ -z "${K-}" ] && echo ok; export K=%s N=0`, key)
				}
				out, err := h.shellExec(t, sb, key, cmd)
				if err != nil || out.Stdout != "ok\n" {
					errs <- fmt.Sprintf("key %s call %d: %v %s", key, i, err, out.describe())
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// Two shell calls of one key run side by side: the first waits for a file that only
// the second makes (calls run one at a time would wait for each other until the
// timeout). Each starts from the state recorded before either; the one that ends
// last records the next call's, so the next call sees one call's export, never both.
func caseShellCallsSideBySide(t T, h *Harness) {
	sb := h.NewSandbox(t)
	dir := "/tmp/berth-side-" + randHex(4)
	h.shell(t, sb, "s", "mkdir -p "+dir+" && export BASE=1")
	first := make(chan execOut, 1)
	firstErr := make(chan error, 1)
	go func() {
		out, err := h.shellExec(t, sb, "s", `touch `+dir+`/started; while [ ! -e `+dir+`/go ]; do sleep 0.02; done; echo "first ${BASE-} ${B-}"; export A=first`)
		first <- out
		firstErr <- err
	}()
	// The second call starts once the first runs (it has its state by then).
	if !testwait.For(t.Context(), 0, func() bool { return h.run(t, sb, "test", "-e", dir+"/started").ExitCode == 0 }) {
		t.Fatalf("the first call did not start (looked for %v)", testwait.Limit)
	}
	second := h.shell(t, sb, "s", `echo "second ${BASE-} ${A-}"; export B=second; touch `+dir+`/go`)
	if second.ExitCode != 0 || second.Stdout != "second 1 \n" {
		t.Errorf("the second call, while the first waits for it: %s, want \"second 1 \\n\" (the state from before either)", second.describe())
	}
	out, err := <-first, <-firstErr
	if err != nil || out.ExitCode != 0 || out.Stdout != "first 1 \n" {
		t.Fatalf("the first call: %v %s, want it to end once the second made its file, from the state before either", err, out.describe())
	}
	next := h.shell(t, sb, "s", `echo "${BASE-} ${A-}${B-}"`)
	if next.Stdout != "1 first\n" && next.Stdout != "1 second\n" {
		t.Errorf("the call after both: %s, want the state of the one that ended last (A=first or B=second, not both)", next.describe())
	}
}

// shellRegistry opens the registry of the registry cases and returns it with its id.
func (h *Harness) shellRegistry(t T) (*registry.Registry, string) {
	id := randHex(4)
	return h.openRegistry(t, id), id
}

// With a 64 KiB cap, `seq 1 2000000` comes back as head, one marker line with the
// exact number of bytes left out, and tail, within the cap; the full-output file
// holds every byte.
func caseShellOutputCapped(t T, h *Harness) {
	r, id := h.shellRegistry(t)
	session := "conf-iso-" + id + ":out"
	acquire(t, r, session)
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	const limit = 64 << 10
	res, err := r.Shell(ctx, session, registry.ShellRequest{Command: "seq 1 2000000", MaxOutput: limit})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("shell call: %v %+v", err, res.ExecResult)
	}
	var full bytes.Buffer
	for i := 1; i <= 2000000; i++ {
		full.WriteString(strconv.Itoa(i))
		full.WriteByte('\n')
	}
	want := full.Bytes()
	if len(res.Stdout) > limit {
		t.Errorf("stdout is %d bytes, over the %d-byte cap", len(res.Stdout), limit)
	}
	m := markerRE.FindStringSubmatchIndex(res.Stdout)
	if m == nil {
		t.Fatalf("no truncation marker in the capped stdout (%d bytes)", len(res.Stdout))
	}
	head, tail := res.Stdout[:m[0]], res.Stdout[m[1]:]
	left, _ := strconv.ParseInt(res.Stdout[m[2]:m[3]], 10, 64)
	if !bytes.HasPrefix(want, []byte(head)) || !bytes.HasSuffix(want, []byte(tail)) || len(head) == 0 || len(tail) == 0 {
		t.Errorf("head %q... / ...tail %q are not the output's start and end", clip(head), clip(tail))
	}
	if total := int64(len(head)+len(tail)) + left; total != int64(len(want)) || left != res.StdoutTruncatedBytes {
		t.Errorf("marker says %d bytes left out, truncated bytes %d; head %d + tail %d + that = %d, want %d",
			left, res.StdoutTruncatedBytes, len(head), len(tail), total, len(want))
	}
	if res.StdoutFile == "" {
		t.Fatal("no full-output file for the capped stdout")
	}
	got, err := os.ReadFile(res.StdoutFile)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("full-output file %s: %d bytes (%v), want the %d bytes of the output", res.StdoutFile, len(got), err, len(want))
	}
	if res.StderrFile != "" || res.StderrTruncatedBytes != 0 {
		t.Errorf("an empty stderr has file %q and %d truncated bytes", res.StderrFile, res.StderrTruncatedBytes)
	}
}

// Ten sessions sharing one sandbox (a shared rule), each making 20 shell calls in
// parallel: every call sees its own session's state only.
func caseShellSessionsParallel(t T, h *Harness) {
	r, id := h.shellRegistry(t)
	const sessions, calls = 10, 20
	for s := 0; s < sessions; s++ {
		acquire(t, r, fmt.Sprintf("conf-shared-%s:%d", id, s))
	}
	var wg sync.WaitGroup
	errs := make(chan string, sessions*calls)
	for s := 0; s < sessions; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			session := fmt.Sprintf("conf-shared-%s:%d", id, s)
			for i := 0; i < calls; i++ {
				cmd := fmt.Sprintf(`[ "${S-}" = "%d" ] && [ "${N-}" = "%d" ] && echo ok; export S=%d N=%d`, s, i-1, s, i)
				if i == 0 {
					cmd = fmt.Sprintf(`[ -z "${S-}" ] && echo ok; export S=%d N=0`, s)
				}
				ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
				res, err := r.Shell(ctx, session, registry.ShellRequest{Command: cmd})
				cancel()
				if err != nil || res.Stdout != "ok\n" {
					errs <- fmt.Sprintf("session %s call %d: %v %+v stdout %q stderr %q", session, i, err, res.ExecResult, res.Stdout, res.Stderr)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
