package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/output"
)

// DefaultShellMaxOutput is the per-stream cap of a shell-mode call's output, in bytes
// (50 KiB), when neither the call nor its rule's max_output sets one.
const DefaultShellMaxOutput = 50 << 10

// DefaultFullOutputMax is the cap of a full-output file, in bytes (64 MiB).
const DefaultFullOutputMax = output.DefaultSpillMax

// DefaultExecEnv are the variables every exec gets unless its rule's env or the call
// sets them: they keep programs from waiting for a terminal that nobody watches
// (pagers, git's credential prompt, debconf's questions).
var DefaultExecEnv = []string{"PAGER=cat", "GIT_PAGER=cat", "GIT_TERMINAL_PROMPT=0", "DEBIAN_FRONTEND=noninteractive"}

// withDefaultEnv returns env plus the DefaultExecEnv variables that neither env nor
// the rule's env sets.
func withDefaultEnv(rule *config.Rule, env []string) []string {
	out := env
	for _, kv := range DefaultExecEnv {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := rule.Env[k]; ok || hasVar(env, k) {
			continue
		}
		if len(out) == len(env) {
			out = append([]string(nil), env...)
		}
		out = append(out, kv)
	}
	return out
}

func hasVar(env []string, k string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			return true
		}
	}
	return false
}

// ShellRequest is one shell-mode call (Registry.Shell).
type ShellRequest struct {
	// Command is the shell command string, run with bash (sh when the sandbox has no
	// bash) through eval in the session's current directory and exported variables.
	Command string
	// Env is KEY=VALUE pairs for this call, applied over the session's variables; like
	// any exported variable they are recorded for the next call.
	Env []string
	// Dir, when set, is the working directory instead of the session's current one.
	Dir string
	// Stdin, when set, is the command's standard input; nil means empty stdin.
	Stdin io.Reader
	// Timeout, when positive, kills the call's process tree after this long; the state
	// is then left as the previous call recorded it.
	Timeout time.Duration
	// MaxOutput caps each stream's text in the result, in bytes: 0 means the rule's
	// max_output, else DefaultShellMaxOutput; negative means no cap.
	MaxOutput int64
	// Stdout and Stderr, when set, also receive the raw output as it comes.
	Stdout, Stderr io.Writer
	// Started, when set, is called once the command runs in the sandbox (the agent
	// has started it), before its output and result come. A caller that cancels the
	// call from then on gets a result with Canceled set rather than an error.
	Started func()
}

// ShellResult is the outcome of a shell-mode call.
type ShellResult struct {
	// ExecResult is the exec's result; its Cwd is the session's directory for the
	// next call.
	backend.ExecResult
	// Session, Driver and Sandbox say where the call ran.
	Session, Driver, Sandbox string
	// Recreated and RecreatedReason are the Lease's: the session's previous sandbox
	// was gone (retention, or removed behind berth's back) and this call ran in a new,
	// empty one, with a fresh shell state. Callers should tell the user.
	Recreated       bool
	RecreatedReason string
	// Moved and MovedReason are the Lease's: the session is back in a sandbox it had
	// before.
	Moved       bool
	MovedReason string
	// Pooled is the Lease's: the session's sandbox is a warm pool member that it
	// claimed.
	Pooled bool
	// Stdout and Stderr are the output as UTF-8 text (invalid bytes replaced), each
	// within the cap: when a stream did not fit it is its head, the line
	// "[... N bytes truncated ...]" and its tail, and StdoutTruncatedBytes /
	// StderrTruncatedBytes say how many bytes were left out.
	Stdout, Stderr                             string
	StdoutTruncatedBytes, StderrTruncatedBytes int64
	// StdoutFile and StderrFile hold a stream's full bytes, up to DefaultFullOutputMax,
	// when it did not fit its cap; empty otherwise. They live in the state dir
	// (STATE/output/, private to the invoking user), never in the sandbox.
	// StdoutFileTruncatedBytes / StderrFileTruncatedBytes count what even the file
	// left out.
	StdoutFile, StderrFile                             string
	StdoutFileTruncatedBytes, StderrFileTruncatedBytes int64
	// OutputFilesRemoved counts the session's older full-output files this call
	// deleted so that the session's files stay within output_max_total
	// (config.Config.OutputMaxTotal); never this call's own.
	OutputFilesRemoved int
}

// capabilities returns b's capabilities, asking it once per driver instance (a
// restarted plugin is a new instance).
func (r *Registry) capabilities(ctx context.Context, b backend.TerminalBackend) (backend.Capabilities, error) {
	if c, ok := r.caps.Load(b); ok {
		return c.(backend.Capabilities), nil
	}
	info, err := backend.InfoOf(ctx, b)
	if err != nil {
		return backend.Capabilities{}, err
	}
	r.caps.Store(b, info.Capabilities)
	return info.Capabilities, nil
}

// RuntimeCapabilities returns the capabilities of rule's sandboxes on a driver with
// caps: caps.ForRuntime(rule.Runtime). A runtime the driver does not list (a driver
// from before runtimes, which would ignore the field, or an engine without it) is
// ErrUnsupported, naming the rule, the runtime, those the driver offers and how to
// register one, so that no sandbox is ever made with the engine's default runtime in
// its place.
func RuntimeCapabilities(caps backend.Capabilities, rule *config.Rule) (backend.Capabilities, error) {
	rc, ok := caps.ForRuntime(rule.Runtime)
	if ok {
		return rc, nil
	}
	offered := "none besides the default"
	if names := caps.RuntimeNames(); len(names) > 0 {
		offered = strings.Join(names, ", ")
	}
	return backend.Capabilities{}, backend.Errorf(backend.ErrUnsupported, "%s: scope %q: driver %s does not offer runtime %q (it offers %s); register it with the engine (docker: dockerd --add-runtime %s=/path/to/%s, or \"runtimes\" in daemon.json, then restart dockerd; containerd: the driver block's runtimes = { %s = \"/path/to/%s\" }; see docs/gvisor.md), or remove runtime from the rule",
		rule.Pos(), rule.Glob, rule.Driver, rule.Runtime, offered, rule.Runtime, rule.Runtime, rule.Runtime, rule.Runtime)
}

// spillSeq makes full-output file names unique within a process.
var spillSeq atomic.Uint64

// outputPath returns a new full-output file path for session's stream.
func (r *Registry) outputPath(session, stream string) string {
	sum := sha256.Sum256([]byte(session))
	name := fmt.Sprintf("%s-%d-%d.%s", time.Now().UTC().Format("20060102T150405.000000000"), os.Getpid(), spillSeq.Add(1), stream)
	return filepath.Join(r.stateDir, "output", hex.EncodeToString(sum[:12]), name)
}

// Shell runs req.Command in session's sandbox in shell mode: `cd` and `export` of one
// call hold for the next, each call is its own process (so `exit`, `set -e`, a syntax
// error or `exec` end only that call), and the calls of one session run one at a
// time, in order of arrival, while other sessions and plain execs go on. Output is
// capped per stream (ShellRequest.MaxOutput) and kept whole in host-only files when
// it did not fit. The sandbox is reached, created and expired as for Exec. Errors:
// those of Exec; ErrInvalid for an empty command; ErrUnsupported when the session's
// driver runs no berth agent. A command that fails is not an error: see the result's
// ExitCode.
func (r *Registry) Shell(ctx context.Context, session string, req ShellRequest) (ShellResult, error) {
	session, err := config.NormalizeSession(session)
	if err != nil {
		return ShellResult{}, err
	}
	if strings.TrimSpace(req.Command) == "" {
		return ShellResult{}, backend.Errorf(backend.ErrInvalid, "session %q: shell mode: empty command", session)
	}
	var out ShellResult
	err = r.agentCall(ctx, session, openCreate, "has no shell mode (its sandboxes run no berth agent); use a plain exec (berth exec -- sh -c ...)", func(c *sessionConn) error {
		lease := c.lease
		out = ShellResult{Session: session, Driver: lease.Driver, Sandbox: lease.Sandbox,
			Recreated: lease.Recreated, RecreatedReason: lease.RecreatedReason,
			Moved: lease.Moved, MovedReason: lease.MovedReason, Pooled: lease.Pooled}
		streams := r.shellStreams(session, r.shellLimit(lease.Rule, req.MaxOutput), req.Stdout, req.Stderr)
		p, err := c.client.Shell(ctx, agent.ShellRequest{
			Command: req.Command, Session: session, Env: withDefaultEnv(lease.Rule, req.Env), Dir: req.Dir,
			Timeout: req.Timeout, Stdin: req.Stdin != nil, Stdout: streams[0].w, Stderr: streams[1].w,
		})
		if err != nil {
			streams.discard()
			if c.lost(err) {
				return errRetry
			}
			return c.callErr("shell call", err)
		}
		if req.Started != nil {
			req.Started()
		}
		if req.Stdin != nil {
			go func() {
				io.Copy(processStdin{p}, req.Stdin)
				p.CloseStdin()
			}()
		}
		res, err := p.Wait()
		out.ExecResult = res
		streams.fill(r, &out)
		if out.StdoutFile != "" || out.StderrFile != "" {
			out.OutputFilesRemoved = r.trimOutputs(session, out.StdoutFile, out.StderrFile)
		}
		return c.callErr("shell call", err)
	})
	return out, err
}

// shellLimit is a call's per-stream cap: the call's, else the rule's max_output,
// else DefaultShellMaxOutput; negative means none.
func (r *Registry) shellLimit(rule *config.Rule, limit int64) int64 {
	if limit == 0 {
		limit = rule.MaxOutput
	}
	if limit == 0 {
		limit = DefaultShellMaxOutput
	}
	return limit
}

// shellStream is one output stream of a shell call: its capped text, the spill file
// of its full bytes, and the writer the call writes to (both, and the caller's).
type shellStream struct {
	capture *output.Capture
	spill   *output.Spill
	w       io.Writer
}

type shellStreams [2]*shellStream

// shellStreams makes the stdout and stderr streams of a call of session capped at
// limit, each also writing to the caller's writer when set.
func (r *Registry) shellStreams(session string, limit int64, stdout, stderr io.Writer) shellStreams {
	var streams shellStreams
	for i, name := range []string{"stdout", "stderr"} {
		st := &shellStream{}
		var ws []io.Writer
		if limit >= 0 {
			st.capture = output.NewCapture(limit)
			st.spill = output.NewSpill(r.outputPath(session, name), limit, DefaultFullOutputMax)
			ws = append(ws, st.capture, st.spill)
		} else {
			st.capture = output.NewCapture(1<<62 - 1)
			ws = append(ws, st.capture)
		}
		if user := []io.Writer{stdout, stderr}[i]; user != nil {
			ws = append(ws, user)
		}
		st.w = io.MultiWriter(ws...)
		streams[i] = st
	}
	return streams
}

// fill puts the streams' text and spill files into out.
func (s shellStreams) fill(r *Registry, out *ShellResult) {
	out.Stdout, out.StdoutTruncatedBytes = s[0].capture.Text()
	out.Stderr, out.StderrTruncatedBytes = s[1].capture.Text()
	for i, st := range s {
		if st.spill == nil {
			continue
		}
		path, dropped, err := st.spill.Close()
		if err != nil {
			r.log.Warn("writing a full-output file", "session", out.Session, "path", path, "error", err)
		}
		if i == 0 {
			out.StdoutFile, out.StdoutFileTruncatedBytes = path, dropped
		} else {
			out.StderrFile, out.StderrFileTruncatedBytes = path, dropped
		}
	}
}

// discard closes the spill files of a call that did not run.
func (s shellStreams) discard() {
	for _, st := range s {
		if st.spill != nil {
			if path, _, _ := st.spill.Close(); path != "" {
				os.Remove(path)
			}
		}
	}
}

// processStdin adapts a Process to io.Writer for io.Copy.
type processStdin struct{ p backend.Process }

func (w processStdin) Write(b []byte) (int, error) { return w.p.Write(b) }

// outputMaxTotal is the config's output_max_total in bytes, or negative for none.
func (r *Registry) outputMaxTotal() int64 {
	if r.cfg.OutputMaxTotal == 0 {
		return config.DefaultOutputMaxTotal
	}
	return r.cfg.OutputMaxTotal
}

// trimOutputs deletes session's oldest full-output files (by modification time, then
// name) until the rest hold at most output_max_total bytes, never deleting keep, and
// returns how many it deleted. Files it cannot stat or delete are logged and left.
func (r *Registry) trimOutputs(session string, keep ...string) int {
	limit := r.outputMaxTotal()
	if limit < 0 {
		return 0
	}
	dir := filepath.Dir(r.outputPath(session, "x"))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	type file struct {
		path string
		size int64
		mod  time.Time
	}
	var files []file
	var total int64
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		p := filepath.Join(dir, e.Name())
		total += fi.Size()
		files = append(files, file{p, fi.Size(), fi.ModTime()})
	}
	sort.Slice(files, func(i, j int) bool {
		if !files[i].mod.Equal(files[j].mod) {
			return files[i].mod.Before(files[j].mod)
		}
		return files[i].path < files[j].path
	})
	removed := 0
	for _, f := range files {
		if total <= limit {
			break
		}
		if slices.Contains(keep, f.path) {
			continue
		}
		if err := os.Remove(f.path); err != nil && !os.IsNotExist(err) {
			r.log.Warn("deleting an old full-output file", "session", session, "path", f.path, "error", err)
			continue
		}
		total -= f.size
		removed++
	}
	return removed
}
