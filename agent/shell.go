package agent

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
)

// Shell mode (the Shell call): the agent runs the command string with bash (when the
// exec's PATH has it) or sh, as
//
//	SHELL -c shellWrapper berth-shell STATEFILE REPORTFILE COMMAND
//
// (berth-shell-login for the session's first call, when nothing is recorded yet: the
// wrapper then first sources the login profile as a login shell would, /etc/profile
// and then ~/.bash_profile, ~/.bash_login or ~/.profile with bash, ~/.profile with sh,
// their output discarded and stdin empty, and goes back to the call's directory; what
// the profile sets is recorded with the call's state, as hermes-agent's login-shell
// snapshot does, and later calls restore it instead of reading the profile again.)
//
// STATEFILE and REPORTFILE are files that only the agent and the exec's user can
// reach (random names in a directory others cannot list). STATEFILE holds the
// restore script: the `export -p` text that the session's last recorded call left
// (with bash, its `alias -p` and `declare -f` text too: aliases and functions carry
// over, but for names that start with one underscore, private helpers such as
// bash-completion's, left out as hermes-agent's snapshot leaves them; sh has no way to
// print its functions), plus the call's own variables. REPORTFILE is empty. The process starts in the directory
// that call left. The wrapper sources STATEFILE, sets an EXIT trap that appends the
// new state to REPORTFILE, and evaluates COMMAND; the agent reads REPORTFILE once the
// shell has exited and deletes both. The report leaves out the call's kill marker
// (execMarkerVar, tree.go): the next call has its own, which a restored old one would
// hide from its descendants. (Appending to an empty file, rather than
// truncating the restore script and writing over it: on ext4, a file truncated to
// zero and written again is flushed to disk at close (auto_da_alloc), which cost a
// shell call 0.3 ms on this project's machines.) So `exit N`, `set -e`
// failures and syntax errors still record the state; `exec CMD`, a kill, or a command
// that replaces the trap record nothing, and the next call starts from the last
// recorded state. Nothing of the state is on a command line (ps shows only COMMAND),
// no descriptor of the user's is taken, and the state's size is not bound by the
// kernel's argument limit. A command longer than maxArgCommand is not on the command
// line either: the state file sets it, so no command is bound by that limit.

// shellStateMagic starts a state report; shellStateEnd ends a complete one.
const (
	shellStateMagic = "berth-shell-state 1\n"
	shellStateEnd   = "\n#berth-shell-end\n"
)

// maxArgCommand is the longest shell-mode command, in bytes, passed on the shell's
// command line (where ps shows it); a longer one travels in the call's state file.
const maxArgCommand = 32 << 10

// maxShellState caps a state report, in bytes; a larger one is not recorded.
const maxShellState = 4 << 20

const shellWrapper = `__berth_state=$1
__berth_report=$2
__berth_pwd=$PWD
__berth_cmd=$3
if [ "$0" = berth-shell-login ]; then
  {
    [ -r /etc/profile ] && . /etc/profile
    if [ -n "${BASH_VERSION-}" ]; then
      for __berth_p in "$HOME/.bash_profile" "$HOME/.bash_login" "$HOME/.profile"; do
        if [ -r "$__berth_p" ]; then . "$__berth_p"; break; fi
      done
    elif [ -r "$HOME/.profile" ]; then
      . "$HOME/.profile"
    fi
  } >/dev/null 2>&1 </dev/null
  cd -- "$__berth_pwd" 2>/dev/null
fi
. "$__berth_state" >/dev/null 2>&1
PWD=$__berth_pwd
shift 3
__berth_save() {
  __berth_rc=$?
  trap - EXIT
  unset BERTH_EXEC BERTH_JOB 2>/dev/null
  {
    printf 'berth-shell-state 1\n%s\n' "${PWD:-$(pwd)}"
    export -p
    if [ -n "${BASH_VERSION-}" ]; then
      alias -p
      local IFS=$' \t\n'
      for __berth_n in $(compgen -A function); do
        case $__berth_n in __berth_*|_[!_]*) ;; *) declare -f "$__berth_n" ;; esac
      done
    fi
    printf '\n#berth-shell-end\n'
  } >>"$__berth_report" 2>/dev/null
  exit "$__berth_rc"
}
trap __berth_save EXIT
[ -z "${BASH_VERSION-}" ] || shopt -s expand_aliases
eval "$__berth_cmd"
`

// shellState is one key's recorded state.
type shellState struct {
	cwd     string
	exports string // the restore script the shell that recorded it printed (export -p, and with bash alias -p and declare -f)
}

// shellKey is one key's recorded state. Calls of a key run side by side: each
// starts from the state recorded when it started (snapshot) and records its own when
// it ends (save), so the last call to end wins, as hermes-agent's own snapshot does.
type shellKey struct {
	mu     sync.Mutex // guards loaded and state, and orders the writes of the file
	loaded bool
	state  shellState
}

// shells holds every key's state, and persists it under dir when dir is set.
type shells struct {
	mu       sync.Mutex
	dir      string
	shm      string // the tmpfs run dir (tmpfsRunDir), once made; "" when there is none
	shmTried bool
	run      string // the other run dir, once made
	temp     bool   // run is a temporary directory of this agent's, for cleanup
	log      *log.Logger
	keys     map[string]*shellKey
}

func newShells(dir string, logger *log.Logger) *shells {
	return &shells{dir: dir, log: logger, keys: map[string]*shellKey{}}
}

// snapshot returns key's entry and the state a call of it starts from: the last
// recorded one (read from dir the first time). It never waits for another call.
func (s *shells) snapshot(key string) (*shellKey, shellState) {
	s.mu.Lock()
	k := s.keys[key]
	if k == nil {
		k = &shellKey{}
		s.keys[key] = k
	}
	s.mu.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.loaded {
		k.loaded = true
		k.state = s.load(key)
	}
	return k, k.state
}

// current returns key's recorded state now.
func (k *shellKey) current() shellState {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.state
}

// runDir returns the directory for a call's files, whose report may take need
// bytes, mode 0711, so that a user can reach a file whose random name the agent gave
// it but cannot list the others:
//
//   - when /dev/shm is a tmpfs that every user may traverse and none may rename
//     another's entries in (sticky, or not world-writable), a directory of this
//     agent's there, berth-agent-shell-RANDOM, while it exists and the tmpfs has
//     room for need (a container's /dev/shm is 64 MiB by default, and programs fill
//     it). A call's files cost a quarter there of what they cost on a container's
//     overlay root (74 against 277 µs p50 to create, read, append to and delete
//     them, in a docker sandbox on this project's machines);
//   - else DIR/run under the state dir;
//   - else (no state dir) berth-agent-shell-RANDOM under the system's temporary
//     directory.
//
// A directory of this agent's is made by this agent (never one that someone else
// made first at a name they could guess) and removed by cleanup. The state dir keeps
// the tmpfs one's name (shellRunFile), so that the next agent removes it when this
// one was killed before its cleanup.
func (s *shells) runDir(need int64) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.shmTried {
		s.shmTried = true
		s.shm = s.tmpfsRunDir()
	}
	if s.shm != "" && shmUsable(s.shm, need) {
		return s.shm, nil
	}
	if s.run != "" {
		return s.run, nil
	}
	dir := filepath.Join(s.dir, "run")
	if s.dir == "" {
		d, err := os.MkdirTemp("", "berth-agent-shell-")
		if err != nil {
			return "", err
		}
		dir, s.temp = d, true
	} else if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", err
	}
	if s.dir != "" {
		os.Chmod(s.dir, 0o711) // the run dir below it must be reachable
	}
	s.run = dir
	return dir, nil
}

// shmDir is where the agent puts its shell calls' files when it is a tmpfs.
const shmDir = "/dev/shm"

// shellRunFile, in the state dir, names the tmpfs run dir of the agent that made it.
const shellRunFile = "shell-run"

// shmUsable reports whether the tmpfs run dir d is still there (a user's
// clean-up, or systemd-logind's RemoveIPC, may have removed it) with room for need
// bytes more.
func shmUsable(d string, need int64) bool {
	fi, err := os.Lstat(d)
	if err != nil || !fi.IsDir() {
		return false
	}
	var st unix.Statfs_t
	return unix.Statfs(d, &st) == nil && int64(st.Bavail)*st.Bsize >= need
}

// tmpfsRunDir makes this agent's run dir in shmDir when that is a tmpfs that
// others may traverse and where no one can rename another's entry, after removing
// the one that an earlier agent of this state dir left; "" otherwise.
func (s *shells) tmpfsRunDir() string {
	var st unix.Statfs_t
	if err := unix.Statfs(shmDir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return ""
	}
	fi, err := os.Stat(shmDir)
	if err != nil || fi.Mode().Perm()&0o001 == 0 || (fi.Mode().Perm()&0o002 != 0 && fi.Mode()&os.ModeSticky == 0) {
		return ""
	}
	if s.dir != "" {
		removeOwnRunDir(filepath.Join(s.dir, shellRunFile))
	}
	d, err := os.MkdirTemp(shmDir, "berth-agent-shell-")
	if err != nil {
		return ""
	}
	// Through the directory's own descriptor, checked to be the one just made.
	f, err := os.OpenFile(d, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err == nil {
		var fst unix.Stat_t
		if err = unix.Fstat(int(f.Fd()), &fst); err == nil && int(fst.Uid) != os.Getuid() {
			err = fmt.Errorf("%s is not this agent's", d)
		}
		if err == nil {
			err = f.Chmod(0o711)
		}
		f.Close()
	}
	if err != nil {
		os.Remove(d)
		return ""
	}
	if s.dir != "" {
		if err := os.MkdirAll(s.dir, 0o700); err == nil {
			os.WriteFile(filepath.Join(s.dir, shellRunFile), []byte(d+"\n"), 0o600)
		}
	}
	return d
}

// removeOwnRunDir removes the run dir that the file record names, when it is a
// directory in shmDir named as this agent names them and owned by this agent's user
// (not a link, not someone else's), and then the record.
func removeOwnRunDir(record string) {
	b, err := os.ReadFile(record)
	if err != nil {
		return
	}
	defer os.Remove(record)
	d := strings.TrimSpace(string(b))
	if filepath.Dir(d) != shmDir || !strings.HasPrefix(filepath.Base(d), "berth-agent-shell-") {
		return
	}
	fi, err := os.Lstat(d)
	if err != nil || !fi.IsDir() {
		return
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == os.Getuid() {
		os.RemoveAll(d)
	}
}

// cleanup removes the run dirs that are this agent's own (the tmpfs one and its
// record; a temporary one without a state dir): the agent is shutting down, and a
// file there belongs to a call that has ended.
func (s *shells) cleanup() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shm != "" {
		os.RemoveAll(s.shm)
		if s.dir != "" {
			os.Remove(filepath.Join(s.dir, shellRunFile))
		}
		s.shm = ""
	}
	if s.temp && s.run != "" {
		os.RemoveAll(s.run)
		s.run, s.temp = "", false
	}
}

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

// save records st for key, in memory and (atomically) on disk: the state of the
// call that ends last wins.
func (s *shells) save(k *shellKey, key string, st shellState) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st == k.state && k.state.cwd != "" {
		// Most calls change neither the directory nor the environment: the
		// state on disk is already this one (a write and a rename per call saved).
		return nil
	}
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
// (unless the start names one, or that directory is gone), and returns the call's
// state file (not created yet: see shellFile.create).
func (s *server) shellStart(sh *agentpb.ShellStart, state shellState) (*agentpb.ExecStart, *shellFile, error) {
	out := &agentpb.ExecStart{Env: sh.Env, Dir: sh.Dir, User: sh.User, Stdin: sh.Stdin, TimeoutNs: sh.TimeoutNs}
	env, err := mergeEnv(os.Environ(), sh.Env)
	if err != nil {
		return nil, nil, backend.Errorf(backend.ErrInvalid, "%w", err)
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
	command := sh.Command
	if len(command) > maxArgCommand {
		// Past the kernel's limit of one argument (128 KiB), execve would fail with
		// "Argument list too long": the restore script sets the command instead,
		// first, so that nothing in the recorded state can skip it.
		fmt.Fprintf(&restore, "__berth_cmd=%s\n", shellQuote(command))
		command = ""
	}
	restore.WriteString(state.exports)
	for _, kv := range sh.Env {
		k, v, _ := strings.Cut(kv, "=")
		if validName(k) {
			fmt.Fprintf(&restore, "\nexport %s=%s", k, shellQuote(v))
		}
	}
	restore.WriteString("\n")
	// The report is at most maxShellState to be recorded; a little more for its
	// framing.
	dir, err := s.shells.runDir(int64(restore.Len()) + maxShellState + 64<<10)
	if err != nil {
		return nil, nil, backend.Errorf(backend.ErrUnavailable, "shell mode: %w", err)
	}
	var rnd [12]byte
	rand.Read(rnd[:])
	base := filepath.Join(dir, hex.EncodeToString(rnd[:]))
	sf := &shellFile{path: base, report: base + ".report", restore: restore.String()}
	name := "berth-shell"
	if state == (shellState{}) {
		// The session's first call (nothing recorded yet): the wrapper reads the
		// login profile first, as a login shell would.
		name = "berth-shell-login"
	}
	out.Argv = []string{shell, "-c", shellWrapper, name, sf.path, sf.report, command}
	return out, sf, nil
}

// shellFile is one shell-mode call's two files: the restore script (path) and the
// empty file that the wrapper appends its report to (report).
type shellFile struct {
	path    string
	report  string
	restore string
}

// create writes the restore script and makes the empty report file, each readable
// and writable by the exec's user (cred; nil means the agent's own) only. On an
// error neither file is left.
func (f *shellFile) create(cred *syscall.Credential) error {
	err := createOwned(f.path, f.restore, cred)
	if err == nil {
		if err = createOwned(f.report, "", cred); err != nil {
			os.Remove(f.path)
		}
	}
	return err
}

// remove deletes both files.
func (f *shellFile) remove() {
	os.Remove(f.path)
	os.Remove(f.report)
}

// createOwned makes the file path (it must not exist; a link there is refused) with
// content, mode 0600, owned by cred's user when cred is set; on an error it is gone.
func createOwned(path, content string, cred *syscall.Credential) error {
	fd, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if content != "" {
		_, err = fd.WriteString(content)
	}
	if err == nil && cred != nil {
		err = fd.Chown(int(cred.Uid), int(cred.Gid))
	}
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// read returns the state the wrapper reported (the caller removes the files).
func (f *shellFile) read() (shellState, bool) {
	fd, err := os.OpenFile(f.report, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return shellState{}, false
	}
	defer fd.Close()
	b, _ := io.ReadAll(io.LimitReader(fd, maxShellState+1))
	if len(b) > maxShellState {
		return shellState{}, false
	}
	return parseShellState(b)
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
