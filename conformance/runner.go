package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/backend"
)

// cleanupGrace is how long RunAll waits for a case that ran past its timeout to return
// once its context is cancelled, before it runs the case's cleanups anyway.
const cleanupGrace = 30 * time.Second

// RunAll runs the cases that filter selects against b, one after another, each with
// its own T (see T), context (derived from ctx) and a timeout of opts.CaseTimeout, and
// returns the report. It is what `berth conformance` uses. A case whose needed
// capability b lacks is reported as skipped with the reason; when ctx is cancelled the
// cases not yet run are reported as skipped. When b.Info fails, the report holds one
// failed case, setup/info, with the error; when sandboxes of the run are left after
// the cases, it ends with a failed teardown/leftovers (and they are removed).
func RunAll(ctx context.Context, b backend.TerminalBackend, opts Options, filter Filter) Report {
	start := time.Now()
	ictx, cancel := context.WithTimeout(ctx, callTimeout)
	info, err := backend.InfoOf(ictx, b)
	cancel()
	if err == nil {
		_, err = forRuntime(info, opts.Runtime)
	}
	if err != nil {
		rep := Report{}
		rep.add(CaseReport{Group: "setup", Name: "info", Status: StatusFail, Reason: fmt.Sprintf("Info: %v", err), DurationMS: time.Since(start).Milliseconds()})
		return rep
	}
	stateDir := opts.StateDir
	if stateDir == "" {
		dir, remove, err := makeStateDir()
		if err != nil {
			rep := Report{Driver: info.Name}
			rep.add(CaseReport{Group: "setup", Name: "state-dir", Status: StatusFail, Reason: fmt.Sprintf("making a temporary state dir: %v", err)})
			return rep
		}
		defer remove()
		stateDir = dir
	}
	h := newHarness(b, info, opts, stateDir)
	rep := runCases(ctx, h, Cases(), filter)
	if left := h.leftovers(context.WithoutCancel(ctx)); len(left) > 0 {
		rep.add(CaseReport{Group: "teardown", Name: "leftovers", Status: StatusFail,
			Reason: fmt.Sprintf("sandboxes of this run left behind after every case's cleanup (now removed): %v", left)})
	}
	return rep
}

// runCases runs the selected cases with h and returns the report.
func runCases(ctx context.Context, h *Harness, cases []Case, filter Filter) Report {
	rep := Report{Driver: h.Info.Name}
	for _, c := range cases {
		if !filter.Match(c) {
			continue
		}
		var cr CaseReport
		if ctx.Err() != nil {
			cr = CaseReport{Name: c.Name, Group: c.Group, Status: StatusSkip, Reason: "not run: the run was cancelled"}
		} else {
			cr = runCase(ctx, h, c)
		}
		rep.add(cr)
		if h.Options.OnCase != nil {
			h.Options.OnCase(cr)
		}
	}
	return rep
}

// runCase runs one case with a fresh caseT and returns its report.
func runCase(ctx context.Context, h *Harness, c Case) CaseReport {
	start := time.Now()
	cr := CaseReport{Name: c.Name, Group: c.Group}
	if ok, reason := h.applies(c); !ok {
		cr.Status, cr.Reason = StatusSkip, reason
		return cr
	}
	t := newCaseT(ctx, c.FullName())
	defer t.removeTempDirs()

	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			// recover is nil when the goroutine ends by runtime.Goexit (FailNow, SkipNow).
			if r := recover(); r != nil {
				t.Errorf("panic: %v\n%s", r, debug.Stack())
			}
		}()
		c.Run(t, h)
	}()
	timer := time.NewTimer(h.Options.CaseTimeout)
	select {
	case <-done:
		timer.Stop()
	case <-timer.C:
		t.Errorf("timed out after %s", h.Options.CaseTimeout)
		t.cancel()
		select {
		case <-done:
		case <-time.After(cleanupGrace):
			t.Errorf("the case did not return within %s of its context being cancelled; running its cleanups anyway", cleanupGrace)
		}
	}
	t.runCleanups(h.Options.CaseTimeout)
	t.finish()

	cr.DurationMS = time.Since(start).Milliseconds()
	cr.Status, cr.Reason, cr.Log = t.result()
	return cr
}

// caseT is RunAll's implementation of T for one case.
type caseT struct {
	name   string
	ctx    context.Context
	cancel context.CancelFunc

	mu         sync.Mutex
	failed     bool
	skipped    bool
	errors     []string
	skipReason string
	logs       []string
	cleanups   []func()
	tempRoot   string
	tempN      int
	finished   bool
}

var _ T = (*caseT)(nil)

func newCaseT(parent context.Context, name string) *caseT {
	ctx, cancel := context.WithCancel(parent)
	return &caseT{name: name, ctx: ctx, cancel: cancel}
}

// Helper does nothing: messages carry no file:line.
func (t *caseT) Helper() {}

// Name returns "group/name".
func (t *caseT) Name() string { return t.name }

// Context is cancelled when the case times out and before its cleanups run.
func (t *caseT) Context() context.Context { return t.ctx }

func (t *caseT) log(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.finished {
		t.logs = append(t.logs, s)
	}
}

// Log records a log line (fmt.Sprintln formatting, without the newline).
func (t *caseT) Log(args ...any) { t.log(strings.TrimSuffix(fmt.Sprintln(args...), "\n")) }

// Logf records a log line.
func (t *caseT) Logf(format string, args ...any) { t.log(fmt.Sprintf(format, args...)) }

func (t *caseT) fail(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
	if !t.finished {
		t.errors = append(t.errors, s)
		t.logs = append(t.logs, s)
	}
}

// Error marks the case failed with a message and goes on.
func (t *caseT) Error(args ...any) { t.fail(strings.TrimSuffix(fmt.Sprintln(args...), "\n")) }

// Errorf marks the case failed with a message and goes on.
func (t *caseT) Errorf(format string, args ...any) { t.fail(fmt.Sprintf(format, args...)) }

// Fatal is Error then FailNow.
func (t *caseT) Fatal(args ...any) { t.Error(args...); t.FailNow() }

// Fatalf is Errorf then FailNow.
func (t *caseT) Fatalf(format string, args ...any) { t.Errorf(format, args...); t.FailNow() }

// FailNow marks the case failed and ends the calling goroutine.
func (t *caseT) FailNow() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	runtime.Goexit()
}

// Failed reports whether the case has failed.
func (t *caseT) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *caseT) skip(s string) {
	t.mu.Lock()
	if t.skipReason == "" {
		t.skipReason = s
	}
	t.mu.Unlock()
	t.SkipNow()
}

// Skip records the reason and ends the calling goroutine with the case skipped.
func (t *caseT) Skip(args ...any) { t.skip(strings.TrimSuffix(fmt.Sprintln(args...), "\n")) }

// Skipf records the reason and ends the calling goroutine with the case skipped.
func (t *caseT) Skipf(format string, args ...any) { t.skip(fmt.Sprintf(format, args...)) }

// SkipNow marks the case skipped and ends the calling goroutine. A case that has
// failed stays failed.
func (t *caseT) SkipNow() {
	t.mu.Lock()
	t.skipped = true
	t.mu.Unlock()
	runtime.Goexit()
}

// Skipped reports whether the case was skipped.
func (t *caseT) Skipped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.skipped
}

// Cleanup registers f to run after the case, last registered first.
func (t *caseT) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// TempDir returns a new directory that is removed after the case's cleanups. A
// failure to make one is fatal.
func (t *caseT) TempDir() string {
	t.mu.Lock()
	if t.tempRoot == "" {
		root, err := os.MkdirTemp("", "berth-conformance-case-")
		if err == nil {
			root, err = filepath.EvalSymlinks(root)
		}
		if err != nil {
			t.mu.Unlock()
			t.Fatalf("TempDir: %v", err)
		}
		t.tempRoot = root
	}
	t.tempN++
	dir := filepath.Join(t.tempRoot, fmt.Sprintf("%03d", t.tempN))
	t.mu.Unlock()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	return dir
}

// removeTempDirs deletes the case's temporary directories.
func (t *caseT) removeTempDirs() {
	t.mu.Lock()
	root := t.tempRoot
	t.mu.Unlock()
	if root != "" {
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("removing the case's temporary directory: %v", err)
		}
	}
}

// runCleanups cancels the case's context and runs its cleanups last first, each in
// its own goroutine so that FailNow or a panic in one does not stop the others. It
// stops waiting after timeout (in all) and reports that as a failure.
func (t *caseT) runCleanups(timeout time.Duration) {
	t.cancel()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			return
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()

		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("panic in cleanup: %v\n%s", r, debug.Stack())
				}
			}()
			f()
		}()
		select {
		case <-done:
		case <-deadline.C:
			t.Errorf("cleanups did not finish within %s; left running", timeout)
			return
		}
	}
}

// finish makes later messages (from goroutines the case left behind) be dropped.
func (t *caseT) finish() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.finished = true
}

// result returns the case's status, reason and log lines.
func (t *caseT) result() (Status, string, []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	logs := append([]string(nil), t.logs...)
	switch {
	case t.failed:
		reason := strings.Join(t.errors, "\n")
		if reason == "" {
			reason = "failed (FailNow without a message)"
		}
		return StatusFail, reason, logs
	case t.skipped:
		reason := t.skipReason
		if reason == "" {
			reason = "skipped (SkipNow without a reason)"
		}
		return StatusSkip, reason, logs
	default:
		return StatusPass, "", logs
	}
}
