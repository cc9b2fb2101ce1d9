package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/backend"

	"github.com/berth-sh/berth/internal/testsupport/testproc"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// execTimeout bounds one exec made by a case helper (context deadline).
const execTimeout = 2 * time.Minute

// randHex returns 2n random hex digits.
func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// execOut is the outcome of one exec run by a helper.
type execOut struct {
	backend.ExecResult
	// Stdout and Stderr hold the output when the helper captured it.
	Stdout, Stderr string
	// Elapsed is the wall time from the Exec call to Wait's return.
	Elapsed time.Duration
}

// exec runs req in sandbox sb and waits for it. Output goes to req.Stdout/Stderr when
// set, otherwise into execOut. The exec's context is t.Context() with execTimeout.
func (h *Harness) exec(t T, sb string, req backend.ExecRequest) (execOut, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), execTimeout)
	defer cancel()
	var stdout, stderr *testwait.Buffer
	if req.Stdout == nil {
		stdout = &testwait.Buffer{}
		req.Stdout = stdout
	}
	if req.Stderr == nil {
		stderr = &testwait.Buffer{}
		req.Stderr = stderr
	}
	start := time.Now()
	p, err := h.Exec(ctx, sb, req)
	if err != nil {
		return execOut{}, err
	}
	res, err := p.Wait()
	out := execOut{ExecResult: res, Elapsed: time.Since(start)}
	if stdout != nil {
		out.Stdout = stdout.String()
	}
	if stderr != nil {
		out.Stderr = stderr.String()
	}
	return out, err
}

// run runs argv in sb and fails the case if the exec cannot be run.
func (h *Harness) run(t T, sb string, argv ...string) execOut {
	t.Helper()
	out, err := h.exec(t, sb, backend.ExecRequest{Argv: argv})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", argv, sb, err)
	}
	return out
}

// sh runs `sh -c script sh args...` in sb and fails the case if it cannot be run or
// does not exit 0.
func (h *Harness) sh(t T, sb, script string, args ...string) execOut {
	t.Helper()
	out := h.run(t, sb, append([]string{"sh", "-c", script, "sh"}, args...)...)
	if out.ExitCode != 0 {
		t.Fatalf("sh -c %q in %s: exit %d, stdout %q, stderr %q", script, sb, out.ExitCode, out.Stdout, out.Stderr)
	}
	return out
}

// describe formats a result for messages.
func (o execOut) describe() string {
	return fmt.Sprintf("exit %d signal %d timed_out %v canceled %v after %s, stdout %q, stderr %q",
		o.ExitCode, o.Signal, o.TimedOut, o.Canceled, o.Elapsed.Round(time.Millisecond), clip(o.Stdout), clip(o.Stderr))
}

// clip shortens s for a message.
func clip(s string) string {
	if len(s) > 400 {
		return s[:200] + fmt.Sprintf("...(%d bytes)...", len(s)-400) + s[len(s)-200:]
	}
	return s
}

// markerVar is the environment variable that marks a case's processes, so a scan of
// /proc finds those and nothing else on a shared host.
const markerVar = "BERTH_CONF_MARK"

// newMarker returns a fresh marker: the KEY=VALUE entry to put in ExecRequest.Env.
func newMarker() string { return markerVar + "=" + randHex(8) }

// procInfo is one process's line of /proc/PID/stat.
type procInfo struct {
	PID, PPID, PGRP, SID int
	State                byte
	Comm                 string
}

// live reports whether the process is running (not a zombie or dead).
func (p procInfo) live() bool { return p.State != 'Z' && p.State != 'X' && p.State != 'x' }

func (p procInfo) String() string {
	return fmt.Sprintf("pid %d (%s) state %c ppid %d session %d", p.PID, p.Comm, p.State, p.PPID, p.SID)
}

// parseStat parses the contents of /proc/PID/stat files, one a line; lines that do
// not parse are skipped.
func parseStat(text string) []procInfo {
	var out []procInfo
	for _, line := range strings.Split(text, "\n") {
		open := strings.IndexByte(line, '(')
		closing := strings.LastIndexByte(line, ')')
		if open < 0 || closing < open {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(line[:open]))
		if err != nil {
			continue
		}
		f := strings.Fields(line[closing+1:])
		if len(f) < 4 || len(f[0]) != 1 {
			continue
		}
		p := procInfo{PID: pid, Comm: line[open+1 : closing], State: f[0][0]}
		p.PPID, _ = strconv.Atoi(f[1])
		p.PGRP, _ = strconv.Atoi(f[2])
		p.SID, _ = strconv.Atoi(f[3])
		out = append(out, p)
	}
	return out
}

// markedScript prints /proc/PID/stat of every process whose environment holds $1.
// The marker is an argument, not in the scanning processes' environment, so they never
// find themselves. Processes that end during the scan are passed over. grep -z reads
// the NUL-separated entries as lines (busybox grep stops a line at a NUL otherwise),
// and -x matches whole KEY=VALUE entries.
const markedScript = `for f in $(grep -l -z -x -F -e "$1" /proc/[0-9]*/environ 2>/dev/null); do cat "${f%/environ}/stat" 2>/dev/null; done; true`

// statScript prints /proc/PID/stat of every process.
const statScript = `cat /proc/[0-9]*/stat 2>/dev/null; true`

// marked returns the processes in sandbox sb whose environment holds marker (as the
// sandbox sees them: the host's for drivers without PID isolation).
func (h *Harness) marked(t T, sb, marker string) []procInfo {
	t.Helper()
	return parseStat(h.sh(t, sb, markedScript, marker).Stdout)
}

// markedAlive returns the live processes in sandbox sb whose environment holds
// marker, reading again until there is one or testwait.Limit has passed (then it
// returns none). One read is not enough to say a process is gone: while a process is
// in execve, between the kernel's swap to the new memory and its setting the new
// environment, /proc/PID/environ reads empty, and on a loaded machine a background
// process can sit in that window when the next exec looks.
func (h *Harness) markedAlive(t T, sb, marker string) []procInfo {
	t.Helper()
	var ps []procInfo
	testwait.For(t.Context(), 0, func() bool {
		ps = liveOnly(h.marked(t, sb, marker))
		return len(ps) > 0
	})
	return ps
}

// liveOnly returns the processes of ps that are not zombies.
func liveOnly(ps []procInfo) []procInfo {
	var out []procInfo
	for _, p := range ps {
		if p.live() {
			out = append(out, p)
		}
	}
	return out
}

// hostMarked scans the test host's /proc for processes whose environment holds
// marker and returns their pids. It sees a sandbox's processes only when the driver
// runs them on this host without a PID namespace.
func hostMarked(marker string) []int {
	needle := []byte(marker + "\x00")
	return testproc.Find(func(pid int) bool {
		env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
		return err == nil && (bytes.HasPrefix(env, needle) || bytes.Contains(env, append([]byte{0}, needle...)))
	})
}

// streamGen is a deterministic byte stream: sha256(seed || counter) blocks.
type streamGen struct {
	seed  [16]byte
	ctr   uint64
	block []byte
}

func newStreamGen() *streamGen {
	g := &streamGen{}
	if _, err := rand.Read(g.seed[:]); err != nil {
		panic(err)
	}
	return g
}

// clone returns a generator at the start of the same stream.
func (g *streamGen) clone() *streamGen { return &streamGen{seed: g.seed} }

// Read fills p with the next bytes of the stream; it never fails.
func (g *streamGen) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(g.block) == 0 {
			var in [24]byte
			copy(in[:], g.seed[:])
			binary.BigEndian.PutUint64(in[16:], g.ctr)
			g.ctr++
			sum := sha256.Sum256(in[:])
			g.block = sum[:]
		}
		c := copy(p[n:], g.block)
		g.block = g.block[c:]
		n += c
	}
	return n, nil
}

// seqGen produces the output of `seq 1 N` for unbounded N: "1\n2\n3\n...".
type seqGen struct {
	next    int64
	pending []byte
}

func newSeqGen() *seqGen { return &seqGen{next: 1} }

// Read fills p with the next bytes of the stream; it never fails.
func (g *seqGen) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(g.pending) == 0 {
			g.pending = strconv.AppendInt(g.pending[:0], g.next, 10)
			g.pending = append(g.pending, '\n')
			g.next++
		}
		c := copy(p[n:], g.pending)
		g.pending = g.pending[c:]
		n += c
	}
	return n, nil
}

// verifier is an io.Writer that compares what it receives, as it arrives, with an
// expected stream, and hashes it; it keeps nothing else, so it holds no output whole.
type verifier struct {
	mu       sync.Mutex
	want     interface{ Read([]byte) (int, error) }
	n        int64
	mismatch int64 // offset of the first differing byte, -1 when none
	got      hash.Hash
	scratch  []byte
}

func newVerifier(want interface{ Read([]byte) (int, error) }) *verifier {
	return &verifier{want: want, mismatch: -1, got: sha256.New()}
}

func (v *verifier) Write(p []byte) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.got.Write(p)
	if v.mismatch < 0 {
		if cap(v.scratch) < len(p) {
			v.scratch = make([]byte, len(p))
		}
		exp := v.scratch[:len(p)]
		_, _ = v.want.Read(exp)
		if !bytes.Equal(exp, p) {
			for i := range p {
				if p[i] != exp[i] {
					v.mismatch = v.n + int64(i)
					break
				}
			}
		}
	}
	v.n += int64(len(p))
	return len(p), nil
}

// result returns the bytes received, the offset of the first wrong byte (-1 if none)
// and the sha256 of what was received.
func (v *verifier) result() (n, mismatch int64, sum string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.n, v.mismatch, hex.EncodeToString(v.got.Sum(nil))
}

// prefixSum returns the sha256 of the first n bytes of r.
func prefixSum(r interface{ Read([]byte) (int, error) }, n int64) string {
	h := sha256.New()
	buf := make([]byte, 64<<10)
	for n > 0 {
		c := int64(len(buf))
		if n < c {
			c = n
		}
		_, _ = r.Read(buf[:c])
		h.Write(buf[:c])
		n -= c
	}
	return hex.EncodeToString(h.Sum(nil))
}

// notifyWriter is a testwait.Buffer that closes a channel when its content first contains
// a string.
type notifyWriter struct {
	testwait.Buffer
	want string
	once sync.Once
	seen chan struct{}
}

func newNotifyWriter(want string) *notifyWriter {
	return &notifyWriter{want: want, seen: make(chan struct{})}
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if strings.Contains(w.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

// wantKind fails the case unless err wraps kind.
func wantKind(t T, what string, err, kind error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: got no error, want one wrapping %v", what, kind)
		return
	}
	if !errors.Is(err, kind) {
		t.Errorf("%s: got error %q (kind %v), want one wrapping %v", what, err, backend.KindOf(err), kind)
	}
}

// envLines splits the output of env into KEY=VALUE lines.
func envLines(s string) []string {
	return strings.Split(strings.TrimRight(s, "\n"), "\n")
}

// hasEnvKey reports whether env output has a variable named key.
func hasEnvKey(s, key string) bool {
	for _, l := range envLines(s) {
		if strings.HasPrefix(l, key+"=") {
			return true
		}
	}
	return false
}
