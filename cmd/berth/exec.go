package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/registry"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// defaultJSONCap is the per-stream output cap in --json mode when --max-output is not given.
const defaultJSONCap = 1 << 20

type execFlags struct {
	session   string
	env       []string
	workdir   string
	timeout   time.Duration
	stdin     bool
	tty       bool
	maxOutput int64
	json      bool
}

func newExecCmd(g *globals) *cobra.Command {
	f := &execFlags{}
	cmd := &cobra.Command{
		Use:   "exec [flags] -- CMD [ARG...]",
		Short: "Run a command in a session's sandbox",
		Long: `Run CMD in the sandbox of SESSION (default "main"), streaming its stdout and stderr,
and exit with its exit code. berth's own exit codes: 124 the command timed out, 125 berth
failed or was used wrongly, 126 not executable, 127 not found. SIGINT, SIGTERM and SIGHUP
are forwarded to the command's process group; a second SIGINT kills its process tree.`,
		Example: `  berth exec -- sh -c 'echo hello; exit 3'
  berth exec -s chat:4711 --timeout 30s -- make test
  berth exec -s main --json --max-output 65536 -- ls -la`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("max-output") && f.maxOutput < 0 {
				return usageError("--max-output %d: must be 0 or more bytes", f.maxOutput)
			}
			return runExec(cmd.Context(), g, f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.session, "session", "s", defaultSession(), "session name ($BERTH_SESSION sets the default)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable for this command (KEY=VALUE, repeatable)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory in the sandbox")
	fl.DurationVar(&f.timeout, "timeout", 0, "kill the command's process tree after this long (e.g. 30s, 5m) and exit 124")
	fl.BoolVarP(&f.stdin, "interactive", "i", false, "pass stdin to the command")
	fl.BoolVarP(&f.tty, "tty", "t", false, "allocate a terminal for the command")
	fl.Int64Var(&f.maxOutput, "max-output", -1, "cap each output stream at BYTES (default: no cap; 1 MiB per stream with --json)")
	fl.BoolVar(&f.json, "json", false, "print one JSON object with the result and the output at the end")
	fl.SetInterspersed(false)
	return cmd
}

func defaultSession() string {
	if s := os.Getenv("BERTH_SESSION"); s != "" {
		return s
	}
	return "main"
}

// execJSON is the --json output of berth exec.
type execJSON struct {
	ExitCode             int    `json:"exit_code"`
	Signal               int    `json:"signal"`
	TimedOut             bool   `json:"timed_out"`
	OOMKilled            bool   `json:"oom_killed"`
	DurationMS           int64  `json:"duration_ms"`
	Session              string `json:"session"`
	Driver               string `json:"driver"`
	Sandbox              string `json:"sandbox"`
	Recreated            bool   `json:"recreated"`
	RecreatedReason      string `json:"recreated_reason,omitempty"`
	Stdout               string `json:"stdout"`
	Stderr               string `json:"stderr"`
	StdoutTruncatedBytes int64  `json:"stdout_truncated_bytes"`
	StderrTruncatedBytes int64  `json:"stderr_truncated_bytes"`
}

func runExec(ctx context.Context, g *globals, f *execFlags, argv []string) error {
	for _, kv := range f.env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return usageError("-e %q: want KEY=VALUE", kv)
		}
	}
	if f.timeout < 0 {
		return usageError("--timeout %v: must not be negative", f.timeout)
	}
	if f.json && f.tty {
		return usageError("--json and -t cannot be combined: a terminal merges stdout and stderr")
	}
	capBytes := f.maxOutput
	if f.json && capBytes < 0 {
		capBytes = defaultJSONCap
	}

	req := backend.ExecRequest{Argv: argv, Env: f.env, Dir: f.workdir, Timeout: f.timeout, Stdin: f.stdin || f.tty, TTY: f.tty}
	// berth's own stdout and stderr: the first failed write stops the command (as a
	// closed pipe does) and berth exits 125 saying why; output is never lost silently.
	stopOnce := make(chan struct{})
	var stopExec sync.Once
	stop := func() { stopExec.Do(func() { close(stopOnce) }) }
	stdout := &outWriter{w: os.Stdout, name: "stdout", fail: stop}
	stderr := &outWriter{w: os.Stderr, name: "stderr", fail: stop}
	var outCap, errCap *capture
	var outStream, errStream *headWriter
	switch {
	case f.json:
		outCap, errCap = newCapture(capBytes), newCapture(capBytes)
		req.Stdout, req.Stderr = outCap, errCap
	case capBytes >= 0:
		outStream, errStream = &headWriter{w: stdout, n: capBytes}, &headWriter{w: stderr, n: capBytes}
		req.Stdout, req.Stderr = outStream, errStream
	default:
		req.Stdout, req.Stderr = stdout, stderr
	}

	var restore func()
	if f.tty {
		fd := int(os.Stdin.Fd())
		if !term.IsTerminal(fd) {
			return usageError("-t needs a terminal on stdin; drop -t or run from a terminal")
		}
		if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
			req.Size = backend.WindowSize{Rows: uint16(h), Cols: uint16(w)}
		} else {
			req.Size = backend.WindowSize{Rows: 24, Cols: 80}
		}
		state, err := term.MakeRaw(fd)
		if err != nil {
			return failure(fmt.Errorf("cannot put the terminal in raw mode: %w", err))
		}
		restore = func() { term.Restore(fd, state) }
		defer restore()
	}

	reg, err := g.open(ctx)
	if err != nil {
		return failure(err)
	}
	defer reg.Close()

	execCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-stopOnce:
			cancel()
		case <-execCtx.Done():
		}
	}()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGWINCH)
	defer signal.Stop(sigs)

	p, lease, err := reg.Exec(execCtx, f.session, req)
	if err != nil {
		return failure(err)
	}
	if lease.Recreated && !f.json {
		reportRecreated(f.session, lease)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		interrupts := 0
		for {
			select {
			case <-done:
				return
			case s := <-sigs:
				sig := s.(syscall.Signal)
				switch {
				case sig == syscall.SIGWINCH:
					if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil && f.tty {
						p.Resize(backend.WindowSize{Rows: uint16(h), Cols: uint16(w)})
					}
				case sig == syscall.SIGINT && interrupts > 0:
					cancel() // the second interrupt kills the tree
				default:
					if sig == syscall.SIGINT {
						interrupts++
					}
					p.Signal(int(sig))
				}
			}
		}
	}()
	if req.Stdin {
		go func() {
			io.Copy(processWriter{p}, os.Stdin)
			p.CloseStdin()
		}()
	}
	res, err := p.Wait()
	if restore != nil {
		restore()
	}
	for _, o := range []*outWriter{stdout, stderr} {
		if o.err != nil {
			return failure(fmt.Errorf("writing the command's %s: %v; the command was stopped", o.name, o.err))
		}
	}
	if err != nil {
		return failure(err)
	}
	if f.json {
		out := execJSON{
			ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
			DurationMS: res.Duration.Milliseconds(), Session: f.session, Driver: lease.Driver, Sandbox: lease.Sandbox,
			Recreated: lease.Recreated, RecreatedReason: lease.RecreatedReason,
		}
		out.Stdout, out.StdoutTruncatedBytes = outCap.Text()
		out.Stderr, out.StderrTruncatedBytes = errCap.Text()
		enc := json.NewEncoder(os.Stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(out); err != nil {
			return failure(err)
		}
	} else {
		for _, h := range []*headWriter{outStream, errStream} {
			if h != nil && h.dropped > 0 {
				fmt.Fprintf(os.Stderr, "berth: output capped by --max-output: %d bytes dropped\n", h.dropped)
			}
		}
	}
	if res.TimedOut {
		return exitCode(exitTimeout)
	}
	if res.Canceled && res.ExitCode == 0 {
		return exitCode(128 + int(syscall.SIGINT))
	}
	if res.ExitCode != 0 {
		return exitCode(res.ExitCode)
	}
	return nil
}

// outWriter writes to one of berth's own output streams. After the first failure it
// drops the rest and calls fail once; err is read after the exec has ended.
type outWriter struct {
	w    io.Writer
	name string
	fail func()
	err  error
}

func (o *outWriter) Write(b []byte) (int, error) {
	if o.err == nil {
		if _, err := o.w.Write(b); err != nil {
			o.err = err
			o.fail()
		}
	}
	return len(b), nil
}

// processWriter adapts a Process's stdin to io.Writer.
type processWriter struct{ p backend.Process }

func (w processWriter) Write(b []byte) (int, error) { return w.p.Write(b) }

// headWriter passes the first n bytes through and counts the rest.
type headWriter struct {
	w       io.Writer
	n       int64
	dropped int64
}

func (h *headWriter) Write(b []byte) (int, error) {
	keep := int64(len(b))
	if keep > h.n {
		keep = h.n
	}
	if keep > 0 {
		if _, err := h.w.Write(b[:keep]); err != nil {
			return 0, err
		}
		h.n -= keep
	}
	h.dropped += int64(len(b)) - keep
	return len(b), nil
}

// capture keeps at most max bytes of a stream: all of it when it fits, otherwise its
// head, a marker and its tail, together within max bytes.
type capture struct {
	max   int64
	head  []byte
	tail  []byte // ring buffer
	tpos  int
	total int64
}

func newCapture(max int64) *capture { return &capture{max: max} }

const truncMarker = "\n[... %d bytes truncated ...]\n"

func (c *capture) Write(b []byte) (int, error) {
	n := len(b)
	c.total += int64(n)
	headCap := c.max / 2
	if room := headCap - int64(len(c.head)); room > 0 {
		k := int64(len(b))
		if k > room {
			k = room
		}
		c.head = append(c.head, b[:k]...)
		b = b[k:]
	}
	tailCap := int(c.max - headCap)
	if tailCap <= 0 {
		return n, nil
	}
	for len(b) > 0 {
		if len(c.tail) < tailCap {
			k := min(tailCap-len(c.tail), len(b))
			c.tail = append(c.tail, b[:k]...)
			b = b[k:]
			continue
		}
		k := copy(c.tail[c.tpos:], b)
		c.tpos = (c.tpos + k) % tailCap
		b = b[k:]
	}
	return n, nil
}

// Text returns the captured output as UTF-8 (invalid bytes replaced by U+FFFD) and the
// number of bytes left out. The result is at most max bytes long, counted after the
// replacement (a replaced byte grows to three), and when output was left out it is the
// head, the marker and the tail, the budget shared between head and tail. A character
// cut by the head/tail split is left out whole rather than replaced.
func (c *capture) Text() (string, int64) {
	tail := append(append([]byte(nil), c.tail[c.tpos:]...), c.tail[:c.tpos]...)
	if c.total <= c.max {
		if s := strings.ToValidUTF8(string(c.head)+string(tail), "\uFFFD"); int64(len(s)) <= c.max {
			return s, 0
		}
	}
	h0 := c.head[:len(c.head)-partialSuffix(c.head)]
	t0 := tail[partialPrefix(tail):]
	// The marker's length with the largest possible count bounds the real one.
	budget := max(c.max-int64(len(fmt.Sprintf(truncMarker, c.total))), 0)
	k, hlen := fitPrefix(h0, budget/2)
	k, tlen := fitSuffix(t0, budget-hlen)
	tail = t0[len(t0)-k:]
	k, _ = fitPrefix(h0, budget-tlen) // the tail may have left room
	head := h0[:k]
	for {
		dropped := c.total - int64(len(head)) - int64(len(tail))
		marker := fmt.Sprintf(truncMarker, dropped)
		hs := strings.ToValidUTF8(string(head), "\uFFFD")
		ts := strings.ToValidUTF8(string(tail), "\uFFFD")
		over := int64(len(hs)+len(marker)+len(ts)) - c.max
		switch {
		case over <= 0:
			return hs + marker + ts, dropped
		case len(tail) > 0: // not expected: the fit above is exact
			tail = tail[min(int(over), len(tail)):]
			tail = tail[partialPrefix(tail):]
		case len(head) > 0:
			head = head[:len(head)-min(int(over), len(head))]
			head = head[:len(head)-partialSuffix(head)]
		default: // the marker alone does not fit (ASCII: cut it)
			return marker[:c.max], dropped
		}
	}
}

// fitPrefix returns the length of b's longest prefix, ending at a character boundary,
// whose text with invalid bytes replaced is at most n bytes, and that text's length.
// As in strings.ToValidUTF8, a run of invalid bytes becomes one 3-byte U+FFFD.
func fitPrefix(b []byte, n int64) (int, int64) {
	var out int64
	i, prevBad := 0, false
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		w, bad := validWidth(r, size, prevBad)
		if out+w > n {
			break
		}
		out += w
		i += size
		prevBad = bad
	}
	return i, out
}

// fitSuffix is fitPrefix for b's longest suffix starting at a character boundary.
func fitSuffix(b []byte, n int64) (int, int64) {
	var out int64
	j, nextBad := len(b), false
	for j > 0 {
		r, size := utf8.DecodeLastRune(b[:j])
		w, bad := validWidth(r, size, nextBad)
		if out+w > n {
			break
		}
		out += w
		j -= size
		nextBad = bad
	}
	return len(b) - j, out
}

// validWidth returns how many bytes a decoded character takes once invalid bytes are
// replaced: its own size, or 3 for the first invalid byte of a run and 0 for the rest.
func validWidth(r rune, size int, neighbourBad bool) (int64, bool) {
	if r != utf8.RuneError || size != 1 {
		return int64(size), false
	}
	if neighbourBad {
		return 0, true
	}
	return int64(utf8.RuneLen(utf8.RuneError)), true
}

// partialSuffix returns how many bytes at the end of b are the start of a UTF-8
// character whose remaining bytes are missing.
func partialSuffix(b []byte) int {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		if c := b[len(b)-i]; utf8.RuneStart(c) {
			if c >= 0xC0 && !utf8.FullRune(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}

// partialPrefix returns how many continuation bytes (the rest of a character that
// started before b) b starts with, at most utf8.UTFMax-1.
func partialPrefix(b []byte) int {
	n := 0
	for n < len(b) && n < utf8.UTFMax-1 && !utf8.RuneStart(b[n]) {
		n++
	}
	return n
}

// errorsIsAny reports whether err is any of kinds.
func errorsIsAny(err error, kinds ...error) bool {
	for _, k := range kinds {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

// reportRecreated says on stderr, in one line, that session's sandbox is new: the
// files of the old one are gone (never silently).
func reportRecreated(session string, lease *registry.Lease) {
	fmt.Fprintf(os.Stderr, "berth: session %s: %s\n", session, lease.RecreatedReason)
}
