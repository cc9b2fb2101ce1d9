// Package containerutil holds what berth's container drivers (docker, containerd)
// share: the Linux capabilities a sandbox keeps, the checks of agent files, users and
// host mounts, and the agent's command line. It is internal: drivers outside this
// module get the same behaviour from the conformance suite, not from this code.
package containerutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/hostpaths"
)

// AgentStateDir is where the agent of a container sandbox keeps, inside the
// container's own filesystem (so it survives Stop and goes with Remove), the state
// that outlives it: the shell-mode state of each session, readable by root only.
const AgentStateDir = "/.berth/state"

// DefaultCapabilities are the Linux capabilities (names without CAP_) that a
// container sandbox keeps; every other one is dropped. The agent runs as root in the
// container and needs SETUID, SETGID (execs as another user, setgroups) and KILL
// (ending process trees of execs that run as another user); CHOWN, DAC_OVERRIDE and
// FOWNER let root in the sandbox manage the files of the sandbox's own filesystem as
// root expects (copying in files with their owners, package installs, writing into
// directories of other users). Callers must not modify the slice.
var DefaultCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"}

// MinMemoryBytes is the smallest memory limit a container sandbox accepts (6 MiB,
// Docker's minimum): below it the agent cannot even start.
const MinMemoryBytes = 6 << 20

// CheckAgent refuses agent files that cannot run as PID 1 of a container with its own
// root filesystem: all three paths must be set, Binary must be
// backend.AgentBinaryName inside Dir, and it must be static. driver names the driver
// in messages ("docker", "containerd"). Errors wrap backend.ErrInvalid.
func CheckAgent(driver, name string, a backend.AgentFiles) error {
	if a.Binary == "" || a.Dir == "" || a.SocketDir == "" {
		return backend.Errorf(backend.ErrInvalid, "%s sandbox %s: no agent binary, agent dir or socket dir given", driver, name)
	}
	if filepath.Base(a.Binary) != backend.AgentBinaryName || filepath.Dir(a.Binary) != filepath.Clean(a.Dir) {
		return backend.Errorf(backend.ErrInvalid, "%s sandbox %s: agent binary %s must be %s inside the agent dir %s", driver, name, a.Binary, backend.AgentBinaryName, a.Dir)
	}
	if !a.Static {
		return backend.Errorf(backend.ErrInvalid, "%s sandbox %s: the agent binary %s is dynamically linked and cannot run inside a container's own filesystem; build a static berth-cli with `CGO_ENABLED=0 go build -o DIR/ ./cmd/...` and use that (or point agent_path at a static build of berth-cli or berth-agent)", driver, name, a.Binary)
	}
	return nil
}

// ResolveUser checks a spec user and returns the default exec user to store: "" (the
// image's default, root for berth's agent), "UID", "UID:GID", a name (resolved in the
// image by the agent at each exec), or "host", which becomes the invoking user's
// "UID:GID" (SUDO_UID and SUDO_GID under sudo, else the process's own ids). The error
// says which forms are accepted.
func ResolveUser(u string) (string, error) {
	if u != "host" {
		if strings.ContainsAny(u, " \t\n\x00") || strings.Count(u, ":") > 1 || strings.HasPrefix(u, ":") || strings.HasSuffix(u, ":") {
			return "", fmt.Errorf("user %q: want \"UID\", \"UID:GID\", a user name of the image, or \"host\"", u)
		}
		return u, nil
	}
	uid, gid := os.Getuid(), os.Getgid()
	if s := os.Getenv("SUDO_UID"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return "", fmt.Errorf("user \"host\": SUDO_UID=%q is not a uid", s)
		}
		uid = n
		gid = n
		if g := os.Getenv("SUDO_GID"); g != "" {
			if gid, err = strconv.Atoi(g); err != nil || gid < 0 {
				return "", fmt.Errorf("user \"host\": SUDO_GID=%q is not a gid", g)
			}
		}
	}
	return fmt.Sprintf("%d:%d", uid, gid), nil
}

// MinPids is the smallest pids limit (resources.pids) a container sandbox accepts.
// The agent, PID 1, makes its OS threads in advance so that pids exhaustion cannot
// crash it: GOMAXPROCS (at most 4) + 8 for blocking calls + 2 for copies + 8 spare,
// plus the Go runtime's own, some 26–30 threads in all (measured), and each thread
// counts against the limit. Below about 30 the agent dies at start; 48 leaves room
// for the commands of a few execs.
const MinPids = 48

// Socket is a host socket that gives root on the host to whoever can connect to it
// (a container runtime's API), which mounts must not expose.
type Socket struct {
	// Path is the socket's path on the host.
	Path string
	// What names it in errors: "Docker socket", "containerd socket".
	What string
}

// wellKnownSockets are the standard places of the runtime sockets that give root on
// the host: Docker's, containerd's (and the one dockerd starts for itself when it runs
// without a system containerd), Podman's and CRI-O's.
var wellKnownSockets = []Socket{
	{"/var/run/docker.sock", "Docker socket"},
	{"/run/docker.sock", "Docker socket"},
	{"/run/containerd/containerd.sock", "containerd socket"},
	{"/var/run/containerd/containerd.sock", "containerd socket"},
	{"/run/docker/containerd/containerd.sock", "containerd socket"},
	{"/var/run/docker/containerd/containerd.sock", "containerd socket"},
	{"/run/podman/podman.sock", "Podman socket"},
	{"/run/crio/crio.sock", "CRI-O socket"},
}

// RuntimeSockets returns the runtime sockets that mounts must not expose (for
// CheckMount): inUse (the daemon the driver talks to, and what it runs on), the
// sockets named by $DOCKER_HOST (a unix:// address) and $CONTAINERD_ADDRESS, and the
// well-known places of Docker's, containerd's, Podman's and CRI-O's. Each containerd
// socket brings its ttrpc sibling (PATH.ttrpc, the shims' API, as dangerous).
func RuntimeSockets(inUse ...Socket) []Socket {
	socks := append([]Socket(nil), inUse...)
	if h, ok := strings.CutPrefix(os.Getenv("DOCKER_HOST"), "unix://"); ok && filepath.IsAbs(h) {
		socks = append(socks, Socket{filepath.Clean(h), "Docker socket"})
	}
	if a := strings.TrimPrefix(os.Getenv("CONTAINERD_ADDRESS"), "unix://"); filepath.IsAbs(a) {
		socks = append(socks, Socket{filepath.Clean(a), "containerd socket"})
	}
	socks = append(socks, wellKnownSockets...)
	out := make([]Socket, 0, 2*len(socks))
	seen := map[string]bool{}
	add := func(s Socket) {
		if s.Path != "" && !seen[s.Path] {
			seen[s.Path] = true
			out = append(out, s)
		}
	}
	for _, s := range socks {
		add(s)
		if !strings.HasSuffix(s.Path, ".ttrpc") && (strings.Contains(s.What, "containerd") || strings.Contains(s.Path, "containerd")) {
			add(Socket{s.Path + ".ttrpc", s.What + " (ttrpc)"})
		}
	}
	return out
}

// BerthDirs returns the berth directories that a container driver's mounts must not
// expose (for CheckMount): hostpaths.Known of the berth state dir that the driver's
// state dir lies in (the registry gives each driver STATE/drivers/NAME as
// DriverSetup.StateDir), of driverStateDir itself, and of the sandbox's own host
// directory (the parent of its agent socket dir, STATE/sandboxes/DRIVER/SANDBOX).
// Empty paths are skipped.
func BerthDirs(driverStateDir string, a backend.AgentFiles) []hostpaths.Dir {
	var dirs []string
	if driverStateDir != "" {
		sd := filepath.Clean(driverStateDir)
		if filepath.Base(filepath.Dir(sd)) == "drivers" {
			dirs = append(dirs, filepath.Dir(filepath.Dir(sd)))
		}
		dirs = append(dirs, sd)
	}
	if a.SocketDir != "" {
		dirs = append(dirs, filepath.Dir(filepath.Clean(a.SocketDir)))
	}
	return hostpaths.Known(dirs...)
}

// CheckMount applies the host-path policy to one bind mount: both paths absolute,
// a target outside /.berth (the agent's), a source that exists, and, unless
// allowHost, a source that is neither the host's / nor a unix socket (any: a runtime's
// API socket gives root on the host, wherever it lives) nor a directory holding one
// of sockets (see RuntimeSockets; links resolved on both sides), and that neither is,
// contains nor lies inside one of berth's directories (hostpaths.Check with berth,
// see BerthDirs). The registry applies the berth part before any driver sees a
// spec; drivers apply it again as defence. The error (plain, for the caller to wrap
// with backend.ErrInvalid) names the source and what to do.
func CheckMount(m backend.Mount, allowHost bool, sockets []Socket, berth []hostpaths.Dir) error {
	if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
		return fmt.Errorf("mount %s -> %s: both paths must be absolute", m.Source, m.Target)
	}
	if t := filepath.Clean(m.Target); t == "/" || t == backend.AgentRoot || strings.HasPrefix(t, backend.AgentRoot+"/") {
		return fmt.Errorf("mount target %s is reserved (berth's agent lives under /.berth)", m.Target)
	}
	src, err := filepath.EvalSymlinks(m.Source)
	if err != nil {
		return fmt.Errorf("mount source %s does not exist on the host (%v); create it or fix the path", m.Source, err)
	}
	src, err = filepath.Abs(src)
	if err != nil {
		return fmt.Errorf("mount source %s: %v", m.Source, err)
	}
	if allowHost {
		return nil
	}
	if src == "/" {
		return fmt.Errorf("mount source %s is the host's root directory; set allow_host_paths = true in the rule if you mean it", m.Source)
	}
	for _, s := range sockets {
		for _, p := range resolved(s.Path) {
			if p == src || strings.HasPrefix(p, src+"/") {
				return fmt.Errorf("mount source %s exposes the %s %s (root on the host); set allow_host_paths = true in the rule if you mean it", m.Source, s.What, s.Path)
			}
		}
	}
	if fi, err := os.Stat(src); err == nil && fi.Mode().Type() == os.ModeSocket {
		return fmt.Errorf("mount source %s is a unix socket (%s); a socket can be a runtime's API, which gives root on the host, so sockets are refused: set allow_host_paths = true in the rule if you mean it", m.Source, src)
	}
	return hostpaths.Check(m.Source, berth)
}

// resolved returns path and, when it differs, path with links resolved.
func resolved(path string) []string {
	out := []string{path}
	if r, err := filepath.EvalSymlinks(path); err == nil && r != path {
		out = append(out, r)
	}
	return out
}

// NameLocks holds one in-process mutex per sandbox name, so that concurrent Creates of
// one name in a driver run one at a time. The zero value is ready to use.
type NameLocks struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

// Lock returns the mutex of name, not locked; the caller locks and unlocks it.
func (l *NameLocks) Lock(name string) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*sync.Mutex{}
	}
	m := l.m[name]
	if m == nil {
		m = &sync.Mutex{}
		l.m[name] = m
	}
	return m
}

// CheckUser runs `true` through c, the agent of the container name that driver
// ("docker", "containerd") has just started, as its default exec user, so that a user
// unknown in the image is an error of Create, not of every exec. It does nothing when
// user (the spec's, resolved) is "". The error wraps backend.ErrInvalid.
func CheckUser(ctx context.Context, c *agent.Client, driver, name, user string) error {
	if user == "" {
		return nil
	}
	p, err := c.Exec(ctx, backend.ExecRequest{Argv: []string{"true"}, Stderr: io.Discard})
	if err == nil {
		_, err = p.Wait()
	}
	if err != nil {
		return backend.Errorf(backend.ErrInvalid, "%s sandbox %s: user %q: %w", driver, name, user, err)
	}
	return nil
}

// AgentArgs returns the arguments after the agent binary that start berth's agent as
// PID 1 of a container sandbox: serving on backend.SocketMountDir, its state in
// AgentStateDir, reporting OOM kills from its own memory cgroup, with the resolved
// default exec user (when set), then extra.
func AgentArgs(user string, extra ...string) []string {
	args := []string{"serve", "--socket-dir", backend.SocketMountDir, "--state-dir", AgentStateDir, "--oom-counter", agent.OOMCounterAuto}
	if user != "" {
		args = append(args, "--exec-user", user)
	}
	return append(args, extra...)
}

// HealthTimeout bounds the runtime check of a container driver's Info: the engine or
// daemon must answer within this long (docker.HealthTimeout, containerd.HealthTimeout).
const HealthTimeout = 5 * time.Second

// CheckHealth is the runtime check of a container driver's Info: probe asks the
// runtime (a ping, a version request) with a context bounded by HealthTimeout. A
// probe that fails for running out of that time (a runtime that accepts connections
// but does not answer) is reported by hung, which says so as backend.ErrUnavailable,
// naming the runtime's address; any other error of probe is returned as it is (the
// driver's own mapping, which names the address of a runtime that is not there).
func CheckHealth(ctx context.Context, probe func(context.Context) error, hung func() error) error {
	ctx, cancel := context.WithTimeout(ctx, HealthTimeout)
	defer cancel()
	err := probe(ctx)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && !errors.Is(err, backend.ErrUnavailable) {
		return hung()
	}
	return err
}

// CheckEnv checks a spec's env for a container sandbox: every entry is KEY=VALUE
// with a non-empty KEY, and none sets agent.TokenEnv, through which the driver hands
// the agent its token. Errors: ErrInvalid naming the entry and the fix, prefixed with
// what ("docker sandbox NAME").
func CheckEnv(what string, env []string) error {
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		switch {
		case !ok || k == "":
			return backend.Errorf(backend.ErrInvalid, "%s: env entry %q is not KEY=VALUE", what, kv)
		case k == agent.TokenEnv:
			return backend.Errorf(backend.ErrInvalid, "%s: env %s is berth's own (it hands the agent its token); remove it from the rule", what, k)
		}
	}
	return nil
}

// AgentEnv returns the environment of a container sandbox's first process, the
// agent: the spec's env (checked by CheckEnv), then agent.TokenEnvEntry of the agent
// files a, so that the token never lies in a file the sandbox can read. Without
// agent files (a.Dir empty: Validate) it is the spec's env alone. Errors: those of
// agent.ReadToken (ErrUnavailable: PrepareSandbox made no token).
func AgentEnv(env []string, a backend.AgentFiles) ([]string, error) {
	out := append([]string(nil), env...)
	if a.Dir == "" {
		return out, nil
	}
	tok, err := agent.TokenEnvEntry(a.Dir)
	if err != nil {
		return nil, backend.Errorf(backend.ErrUnavailable, "the sandbox's agent token: %w", err)
	}
	return append(out, tok), nil
}
