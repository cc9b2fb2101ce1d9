package conformance

import (
	"context"
	"strings"
	"time"

	"github.com/berth-sh/berth/backend"

	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// needTTY is Case.Needs for TTY cases.
func needTTY(c backend.Capabilities) (bool, string) {
	if !c.TTY {
		return false, "driver does not claim Capabilities.TTY"
	}
	return true, ""
}

func ttyCases() []Case {
	g := "tty"
	return []Case{
		{Group: g, Name: "is-terminal", Requires: "Capabilities.TTY", Needs: needTTY, Run: caseTTYIsTerminal},
		{Group: g, Name: "initial-size", Requires: "Capabilities.TTY", Needs: needTTY, Run: caseTTYInitialSize},
		{Group: g, Name: "resize-ordered-with-stdin", Requires: "Capabilities.TTY", Needs: needTTY, Run: caseTTYResize},
		{Group: g, Name: "resize-without-tty-invalid", Run: caseResizeNoTTY},
	}
}

// ttySize is the initial size of the TTY cases.
var ttySize = backend.WindowSize{Rows: 24, Cols: 80}

// ttyExec runs argv with a TTY of ttySize (stdin connected) and returns its output.
func (h *Harness) ttyExec(t T, sb string, argv ...string) execOut {
	t.Helper()
	out, err := h.exec(t, sb, backend.ExecRequest{Argv: argv, TTY: true, Size: ttySize, Stdin: true, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("TTY exec %q: %v", argv, err)
	}
	return out
}

// A TTY exec sees a terminal on stdin, stdout and stderr.
func caseTTYIsTerminal(t T, h *Harness) {
	sb := h.NewSandbox(t)
	out := h.ttyExec(t, sb, "sh", "-c", "test -t 0 && test -t 1 && test -t 2 && echo tty")
	if out.ExitCode != 0 || strings.TrimSpace(out.Stdout) != "tty" {
		t.Errorf("test -t 0/1/2 in a TTY exec: %s, want exit 0 and \"tty\"", out.describe())
	}
	if out.Stderr != "" {
		t.Errorf("a TTY exec wrote %q to the separate stderr writer; TTY output is one stream on Stdout", out.Stderr)
	}
	// And a non-TTY exec does not.
	if o := h.run(t, sb, "sh", "-c", "test -t 0 || test -t 1"); o.ExitCode == 0 {
		t.Errorf("a non-TTY exec sees a terminal")
	}
}

// A TTY exec created at 24x80 has that size.
func caseTTYInitialSize(t T, h *Harness) {
	sb := h.NewSandbox(t)
	out := h.ttyExec(t, sb, "stty", "size")
	if out.ExitCode != 0 || strings.TrimSpace(out.Stdout) != "24 80" {
		t.Errorf("stty size: %s, want \"24 80\"", out.describe())
	}
}

// A resize then a line of stdin are applied in that order: an interactive sh that
// reads "stty size" after Resize(40, 100) prints "40 100".
func caseTTYResize(t T, h *Harness) {
	sb := h.NewSandbox(t)
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	out := &testwait.Buffer{}
	p, err := h.Exec(ctx, sb, backend.ExecRequest{Argv: []string{"sh"}, TTY: true, Size: ttySize, Stdin: true, Stdout: out, Stderr: out, Env: []string{"PS1=$ "}})
	if err != nil {
		t.Fatalf("Exec sh with a TTY: %v", err)
	}
	abort := func(format string, args ...any) {
		cancel()
		_, _ = p.Wait()
		t.Fatalf(format, args...)
	}
	// answerAfter waits for the first "R C" answer of stty after offset from.
	answerAfter := func(from int, wants ...string) string {
		var found string
		testwait.For(ctx, 0, func() bool {
			s := out.String()[from:]
			for _, w := range wants {
				if strings.Contains(s, w) {
					found = w
					return true
				}
			}
			return false
		})
		return found
	}
	if err := writeAll(p, []byte("stty size\n")); err != nil {
		abort("Write: %v", err)
	}
	if got := answerAfter(0, "24 80"); got == "" {
		abort("the first stty size printed no \"24 80\" within %v; output %q", testwait.Limit, clip(out.String()))
	}
	from := out.Len()
	if err := p.Resize(backend.WindowSize{Rows: 40, Cols: 100}); err != nil {
		abort("Resize(40, 100): %v", err)
	}
	if err := writeAll(p, []byte("stty size\n")); err != nil {
		abort("Write: %v", err)
	}
	switch got := answerAfter(from, "40 100", "24 80"); got {
	case "40 100":
	case "24 80":
		t.Errorf("stty size written after Resize(40, 100) printed \"24 80\": the resize was applied after the stdin that followed it")
	default:
		abort("the second stty size printed no size within %v; output %q", testwait.Limit, clip(out.String()))
	}
	if err := writeAll(p, []byte("exit 7\n")); err != nil {
		abort("Write: %v", err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if res.ExitCode != 7 {
		t.Errorf("interactive sh after \"exit 7\": exit %d, want 7; output %q", res.ExitCode, clip(out.String()))
	}
}

// Resize of an exec without a TTY is ErrInvalid.
func caseResizeNoTTY(t T, h *Harness) {
	sb := h.NewSandbox(t)
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	p, err := h.Exec(ctx, sb, backend.ExecRequest{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatalf("Exec cat: %v", err)
	}
	err = p.Resize(backend.WindowSize{Rows: 40, Cols: 100})
	wantKind(t, "Resize of a non-TTY exec", err, backend.ErrInvalid)
	if err := p.CloseStdin(); err != nil {
		t.Errorf("CloseStdin: %v", err)
	}
	if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
		t.Errorf("cat after CloseStdin: %+v, %v", res, err)
	}
}
