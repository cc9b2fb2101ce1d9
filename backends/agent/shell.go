package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sh/berth/backends/agent/agentpb"
)

// Shell mode (ExecStart.shell): the agent runs the command string with bash (when the
// exec's PATH has it) or sh, as
//
//	SHELL -c shellWrapper berth-shell RESTORE COMMAND
//
// where RESTORE is the `export -p` text that the previous call of the key left plus
// the call's own variables, and the process starts in the directory that call left.
// The wrapper evaluates RESTORE, sets an EXIT trap that writes the new state to fd
// shellStateFD (a memfd the agent reads once the shell has exited), and evaluates
// COMMAND. So `exit N`, `set -e` failures and syntax errors still record the state;
// `exec CMD`, a kill, or a command that replaces the trap record nothing, and the
// next call starts from the last recorded state.

// shellStateFD is the descriptor on which the wrapper reports its state. It is a
// single digit because dash's redirections take one digit only.
const shellStateFD = 9

// shellStateMagic starts a state report; shellStateEnd ends a complete one.
const (
	shellStateMagic = "berth-shell-state 1\n"
	shellStateEnd   = "\n#berth-shell-end\n"
)

// maxShellState caps a state report, in bytes; a larger one is ignored.
const maxShellState = 1 << 20

const shellWrapper = `__berth_pwd=$PWD
eval "$1" >/dev/null 2>&1
PWD=$__berth_pwd
__berth_cmd=$2
shift 2
__berth_save() {
  __berth_rc=$?
  trap - EXIT
  { printf 'berth-shell-state 1\n%s\n' "${PWD:-$(pwd)}"; export -p; printf '\n#berth-shell-end\n'; } >&9 2>/dev/null
  exit "$__berth_rc"
}
trap __berth_save EXIT
eval "$__berth_cmd"
`

// shellState is one key's recorded state.
type shellState struct {
	cwd     string
	exports string // `export -p` output of the shell that recorded it
}

// shellKey is one key's FIFO lock and state.
type shellKey struct {
	// turn holds one token; waiters queue on it in arrival order (Go's channel
	// receivers are served first in, first out).
	turn   chan struct{}
	loaded bool
	state  shellState
}

// shells holds every key's state, and persists it under dir when dir is set.
type shells struct {
	mu   sync.Mutex
	dir  string
	log  *log.Logger
	keys map[string]*shellKey
}

func newShells(dir string, logger *log.Logger) *shells {
	return &shells{dir: dir, log: logger, keys: map[string]*shellKey{}}
}

// acquire waits for key's turn (in arrival order) and returns its entry; the caller
// must call release. It fails when ctx ends first.
func (s *shells) acquire(ctx context.Context, key string) (*shellKey, error) {
	s.mu.Lock()
	k := s.keys[key]
	if k == nil {
		k = &shellKey{turn: make(chan struct{}, 1)}
		k.turn <- struct{}{}
		s.keys[key] = k
	}
	s.mu.Unlock()
	select {
	case <-k.turn:
	default:
		if s.log != nil {
			s.log.Printf("shell key %q is busy: waiting for its turn", key)
		}
		select {
		case <-k.turn:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if !k.loaded {
		k.loaded = true
		k.state = s.load(key)
	}
	return k, nil
}

func (s *shells) release(k *shellKey) { k.turn <- struct{}{} }

func (s *shells) path(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.dir, "shell-"+hex.EncodeToString(sum[:16]))
}

// load reads key's persisted state; a missing or damaged file is the empty state.
func (s *shells) load(key string) shellState {
	if s.dir == "" {
		return shellState{}
	}
	b, err := os.ReadFile(s.path(key))
	if err != nil {
		return shellState{}
	}
	st, ok := parseShellState(b)
	if !ok {
		return shellState{}
	}
	return st
}

// save records st for key, in memory and (atomically) on disk.
func (s *shells) save(k *shellKey, key string, st shellState) error {
	k.state = st
	if s.dir == "" {
		return nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	tmp := s.path(key) + ".tmp"
	data := shellStateMagic + st.cwd + "\n" + st.exports + shellStateEnd
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.path(key))
}

// parseShellState parses a state report: magic, the directory on one line, the
// `export -p` text, the end marker. ok is false for an incomplete report.
func parseShellState(b []byte) (shellState, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(shellStateMagic))
	if !ok {
		return shellState{}, false
	}
	body, ok := bytes.CutSuffix(rest, []byte(shellStateEnd))
	if !ok {
		return shellState{}, false
	}
	cwd, exports, _ := strings.Cut(string(body), "\n")
	if !filepath.IsAbs(cwd) {
		return shellState{}, false
	}
	return shellState{cwd: cwd, exports: exports}, true
}

// shellQuote quotes s for sh in single quotes; a quote inside s becomes quote,
// backslash, quote, quote (close, escaped quote, reopen).
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellStart turns a shell-mode start into a plain one that runs the wrapper with
// bash (when the exec's PATH has it) or sh, in the directory that state recorded
// (unless the start names one, or that directory is gone), and returns the memfd for
// the state report, which the caller closes.
func (s *server) shellStart(st *agentpb.ExecStart, state shellState) (*agentpb.ExecStart, *os.File, error) {
	out := proto.Clone(st).(*agentpb.ExecStart)
	env, err := mergeEnv(os.Environ(), st.Env)
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	pathEnv, ok := envGet(env, "PATH")
	if !ok {
		pathEnv = defaultPath
	}
	shell := "sh"
	s.blk.enter()
	if _, f := findExecutable("bash", pathEnv, "/"); f == nil {
		shell = "bash"
	}
	if out.Dir == "" && state.cwd != "" {
		if fi, err := os.Stat(state.cwd); err == nil && fi.IsDir() {
			out.Dir = state.cwd
		}
	}
	s.blk.leave()
	var restore strings.Builder
	restore.WriteString(state.exports)
	for _, kv := range st.Env {
		k, v, _ := strings.Cut(kv, "=")
		if validName(k) {
			fmt.Fprintf(&restore, "\nexport %s=%s", k, shellQuote(v))
		}
	}
	fd, err := unix.MemfdCreate("berth-shell-state", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "shell mode: memfd: %v", err)
	}
	out.Argv = []string{shell, "-c", shellWrapper, "berth-shell", restore.String(), st.Shell}
	out.Shell = ""
	return out, os.NewFile(uintptr(fd), "berth-shell-state"), nil
}

// readShellState reads the wrapper's report from memfd.
func readShellState(memfd *os.File) (shellState, bool) {
	b := make([]byte, maxShellState+1)
	n, _ := memfd.ReadAt(b, 0)
	if n > maxShellState {
		return shellState{}, false
	}
	return parseShellState(b[:n])
}

// validName reports whether k is a shell variable name.
func validName(k string) bool {
	if k == "" {
		return false
	}
	for i, r := range k {
		if r != '_' && !(r >= 'a' && r <= 'z') && !(r >= 'A' && r <= 'Z') && !(i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
