package backend

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// TerminalBackend is the contract every driver implements: lifecycle and placement.
// All calls take a context first; cancelling it abandons the call. Sandboxes are
// addressed by the name the host chose in SandboxSpec.Name.
//
// Lifecycle: created → running ⇄ stopped → removed. Create is idempotent by name; Stop
// and Remove of a missing sandbox succeed; Inspect of one returns ErrNotFound.
//
// Execs do not go through the driver: every sandbox runs berth's agent (req.Agent of
// Create), and the host talks to it directly, the way Capabilities.Agent says
// (AgentSocket: the host dials the socket in the socket directory it prepared;
// AgentDial: through the driver's AgentDialer). A driver whose sandboxes run no berth
// agent implements Execer instead (Capabilities.Agent empty).
type TerminalBackend interface {
	// Info reports the driver's name, version, protocol versions and capabilities.
	Info(ctx context.Context) (Info, error)

	// Create makes the sandbox req.Spec.Name and starts it, with berth's agent as its
	// first process (req.Agent), and returns once the agent answers. If a sandbox of
	// that name exists and carries the same LabelOwner, it is adopted: started if
	// stopped, and returned with Adopted set. A name held by anything else returns
	// ErrConflict. A failed Create leaves nothing behind. Errors: ErrInvalid (bad
	// spec), ErrConflict, ErrUnavailable.
	Create(ctx context.Context, req CreateRequest) (Sandbox, error)

	// Inspect returns the sandbox's status, or ErrNotFound.
	Inspect(ctx context.Context, name string) (Sandbox, error)

	// List returns the sandboxes whose labels contain every pair of filter
	// (all of them when filter is empty), in no particular order.
	List(ctx context.Context, filter map[string]string) ([]Sandbox, error)

	// Stop ends every process in the sandbox, asking the agent first and, after grace
	// (0 means the driver's default of 1 second), killing. The sandbox keeps its
	// filesystem where the driver's Capabilities.StopStart says so. Stopping a missing
	// or stopped sandbox succeeds.
	Stop(ctx context.Context, name string, grace time.Duration) error

	// Remove stops the sandbox and deletes it with its filesystem. Removing a missing
	// sandbox succeeds.
	Remove(ctx context.Context, name string) error

	// Close releases the driver's connections. Sandboxes are not touched.
	Close() error
}

// Execer is implemented by drivers whose sandboxes run no berth agent
// (Capabilities.Agent empty): the host then sends plain execs through the driver.
// Shell mode and background jobs need berth's agent and are not offered there.
type Execer interface {
	// Exec starts one process in the running sandbox name. The process's output is
	// written to req.Stdout and req.Stderr as it comes; a writer that blocks holds the
	// process back (flow control), it is never buffered whole. Errors at start:
	// ErrNotFound (no sandbox), ErrConflict (not running), ErrInvalid (empty argv),
	// ErrUnavailable (runtime unreachable). A command that cannot be run is not an
	// error: its ExecResult says 127 or 126.
	Exec(ctx context.Context, name string, req ExecRequest) (Process, error)
}

// AgentDialer is implemented by drivers with Capabilities.AgentDial: it opens a byte
// stream to the agent of the running sandbox name (a Kubernetes port-forward, a VM's
// vsock, a cloud sandbox's tunnel), over which the host speaks berth's agent
// protocol, its token handshake included, without knowing the transport. Through
// the plugin protocol the stream is proxied by the plugin. Errors: ErrNotFound (no
// sandbox), ErrConflict (not running), ErrUnavailable.
type AgentDialer interface {
	DialAgent(ctx context.Context, name string) (net.Conn, error)
}

// Validator is implemented by drivers with Capabilities.Validate: it checks spec as
// Create would (images present, limits, network modes, mounts, users) without
// creating anything, so that `berth config check` reports what the first exec would
// refuse. Errors: those Create would return for the spec (ErrInvalid, ErrUnsupported,
// ErrNotFound for a missing image), ErrUnavailable when the runtime cannot be asked.
type Validator interface {
	Validate(ctx context.Context, spec SandboxSpec) error
}

// Dialer opens a connection to a sandbox's agent: the host dials the unix socket in
// the sandbox's socket directory (package agent's DialSocketDir), or a
// driver's AgentDialer supplies the stream.
type Dialer func(ctx context.Context) (net.Conn, error)

// CreateRequest is what Create receives: the spec from the scope rule and the files of
// berth's agent that the driver must start as the sandbox's first process.
type CreateRequest struct {
	Spec  SandboxSpec
	Agent AgentFiles
}

// AgentFiles names the host paths that the host prepared for one sandbox's agent.
type AgentFiles struct {
	// Binary is the agent executable: a hard link inside Dir to the content-hashed copy
	// of the agent binary (the berth binary, or the config's agent_path) in the state
	// dir. Start it as "Binary agent serve --socket-dir DIR" (the flags are package
	// agent's Main; agent.SandboxCommand and agent.HostCommand build the
	// argv). Any Go program can serve as the agent binary by calling agent.Main when
	// agent.IsAgent says it was started as one.
	Binary string `json:"binary"`
	// Dir is the per-sandbox, host-owned directory that holds Binary and the sandbox's
	// agent token (the agent reads it beside its binary). Containers mount it
	// read-only at AgentMountDir.
	Dir string `json:"dir"`
	// SocketDir is the per-sandbox directory in which the agent creates its socket
	// (AgentSocketName). Containers bind-mount it at SocketMountDir.
	SocketDir string `json:"socket_dir"`
	// Static reports whether Binary is statically linked. Drivers whose sandbox has its
	// own root filesystem must refuse a dynamic binary with ErrInvalid.
	Static bool `json:"static"`
}

// Paths inside a sandbox with its own root filesystem.
const (
	// AgentRoot holds berth's own paths (AgentMountDir, SocketMountDir, the agent's
	// state): no mount may target it and no copy may write into it.
	AgentRoot = "/.berth"
	// AgentMountDir is where AgentFiles.Dir is mounted read-only.
	AgentMountDir = "/.berth/agent"
	// SocketMountDir is where AgentFiles.SocketDir is mounted.
	SocketMountDir = "/.berth/run"
	// AgentSocketName is the agent's socket file name inside the socket directory.
	AgentSocketName = "agent.sock"
	// AgentBinaryName is the agent executable's file name inside AgentFiles.Dir.
	AgentBinaryName = "berth-agent"
)

// SandboxSpec describes one sandbox. The host fills it from the matching scope rule;
// fields a driver cannot honour return ErrUnsupported from Create (an empty field never
// does).
type SandboxSpec struct {
	// Name is the sandbox's name, chosen by the host: 1–63 characters of a–z 0–9 _ . -
	// starting with a letter or digit. It is never raw session text.
	Name string `json:"name"`
	// Image is the image reference for drivers with FSIsolationImage; ignored by local.
	Image string `json:"image"`
	// Labels holds the berth labels (LabelOwner, ...) and user labels.
	Labels map[string]string `json:"labels,omitempty"`
	// Env is KEY=VALUE pairs set for every exec, after the image's environment
	// (containers) or the allowlisted host variables (local).
	Env []string `json:"env,omitempty"`
	// EnvAllowlist names host variables passed to execs by drivers without their own
	// filesystem (local), in addition to the driver's own allowlist (by default
	// DefaultEnvAllowlist).
	EnvAllowlist []string `json:"env_allowlist,omitempty"`
	// Workdir is the default working directory of execs; empty means the sandbox's home.
	Workdir string `json:"workdir"`
	// User is the default user of execs: "UID", "UID:GID" or a name known in the
	// sandbox; empty means the driver's default.
	User string `json:"user"`
	// Mounts are bind mounts from the host.
	Mounts []Mount `json:"mounts,omitempty"`
	// Network is the network mode: one the driver lists in Capabilities.NetworkModes.
	// Empty means the driver's default: "none" for drivers that isolate networking
	// (containers), "host" for local, whose only mode is the host network.
	Network string `json:"network"`
	// Resources are the limits; zero values mean the driver's defaults.
	Resources Resources `json:"resources"`
	// AllowHostPaths permits mounts of sensitive host paths: /, runtime sockets and
	// the directories holding them, berth's state dirs (every sandbox's agent socket)
	// and the plugin socket dir. The registry refuses mounts of berth's own dirs
	// without it before any driver sees the spec; drivers refuse the rest.
	AllowHostPaths bool `json:"allow_host_paths,omitempty"`
	// Runtime is the OCI runtime of a container sandbox, one the driver lists in
	// Capabilities.Runtimes (e.g. "runsc", gVisor); empty means the engine's default
	// (runc). Drivers without Runtimes refuse any other value with ErrUnsupported.
	// It is part of the spec hash (only when set, so specs from before it hash as
	// they did).
	Runtime string `json:"runtime,omitempty"`
	// Pull is the rule's pull policy (config.Rule.Pull): when the image is fetched,
	// for drivers whose runtime fetches it as the sandbox starts (the kubelet:
	// PullMissing, PullAlways, PullNever become imagePullPolicy IfNotPresent,
	// Always, Never). "" is the driver's default. Drivers that implement
	// ImagePuller get the policy there too. It is not part of the spec hash: it
	// says when the image is fetched, not what runs.
	Pull PullPolicy `json:"pull,omitempty"`
}

// DefaultEnvAllowlist is the host environment that local execs start from.
var DefaultEnvAllowlist = []string{"PATH", "LANG", "TERM", "TZ"}

// DefaultPidsLimit is the pids limit of container sandboxes when the spec sets none.
const DefaultPidsLimit = 512

// DefaultMemoryBytes is the memory limit of the built-in container drivers'
// sandboxes when the spec sets none (4 GiB; at most half the host's memory, see
// containerutil.DefaultMemory), so that one memory bomb cannot take the host down.
const DefaultMemoryBytes = 4 << 30

// UnlimitedMemory in Resources.MemoryBytes asks for no memory limit at all.
const UnlimitedMemory = -1

// DefaultCPUShares is the relative CPU weight of the built-in container drivers'
// sandboxes when the spec sets none: half an ordinary container's 1024 (Docker's
// --cpu-shares, OCI linux.resources.cpu.shares), so that under contention the host's
// own work comes first.
const DefaultCPUShares = 512

// Mount is one bind mount from the host into the sandbox.
type Mount struct {
	// Source is an absolute host path.
	Source string `json:"source"`
	// Target is an absolute path in the sandbox.
	Target string `json:"target"`
	// ReadOnly mounts it read-only.
	ReadOnly bool `json:"read_only"`
}

// Resources are a sandbox's limits. Zero means "driver default": for the built-in
// container drivers no CPU quota, DefaultMemoryBytes, DefaultPidsLimit and
// DefaultCPUShares; drivers without limits (local) refuse any limit.
type Resources struct {
	// CPUs is the CPU quota in CPUs, fractional allowed (1.5).
	CPUs float64 `json:"cpus"`
	// MemoryBytes is the memory limit in bytes; swap is set equal to it.
	// UnlimitedMemory (-1) asks for none, which every driver grants.
	MemoryBytes int64 `json:"memory_bytes"`
	// Pids is the maximum number of processes.
	Pids int64 `json:"pids"`
	// CPUShares is the relative CPU weight under contention, 2..262144 (Docker's
	// --cpu-shares, OCI linux.resources.cpu.shares; 1024 is an ordinary container's).
	CPUShares int64 `json:"cpu_shares,omitempty"`
}

// Limited reports whether r asks for any limit: UnlimitedMemory alone asks for none.
func (r Resources) Limited() bool {
	return r.CPUs != 0 || r.MemoryBytes > 0 || r.MemoryBytes < UnlimitedMemory || r.Pids != 0 || r.CPUShares != 0
}

// State is a sandbox's lifecycle state.
type State string

// The lifecycle states.
const (
	StateCreated State = "created"
	StateRunning State = "running"
	StateStopped State = "stopped"
)

// Sandbox is a sandbox's status as the driver sees it.
type Sandbox struct {
	// Name is the name from SandboxSpec.Name.
	Name string `json:"name"`
	// ID is the runtime's id (container id, directory path for local).
	ID string `json:"id"`
	// State is created, running or stopped.
	State State `json:"state"`
	// Labels are the sandbox's labels as stored by the runtime.
	Labels map[string]string `json:"labels"`
	// CreatedAt is when the runtime created the sandbox.
	CreatedAt time.Time `json:"created_at"`
	// Adopted is set by Create when it found the sandbox already there.
	Adopted bool `json:"adopted"`
	// EndReason says why the sandbox's last run ended when the runtime ended it
	// (its first process, berth's agent, exited or was killed, the runtime evicted
	// it, its node went away) rather than berth's Stop: one of the End* values, or
	// another short word the runtime uses (a Kubernetes Pod status reason); empty
	// when it is running, was stopped by berth, or the runtime does not say. Inspect
	// sets it on a sandbox that is not running (List too where the runtime's listing
	// says it); Create sets it on the sandbox it returns when it found the sandbox
	// ended that way and started it again or, where an ended sandbox cannot be
	// started (a Pod), made it anew: then it is why the previous run ended. Hosts
	// show it to users, so drivers take it from the runtime, never from anything
	// the sandbox can write.
	EndReason string `json:"end_reason,omitempty"`
	// EndMessage is the runtime's one-line detail of EndReason (Kubernetes' Pod
	// status message, such as "The node was low on resource: memory"), or empty. It
	// is at most MaxEndMessage bytes of printable text (SanitizeEndMessage).
	EndMessage string `json:"end_message,omitempty"`
}

// The well-known values of Sandbox.EndReason, spelled as Kubernetes spells a Pod's
// status reason and a container's terminated reason.
const (
	// EndOOMKilled: the kernel's OOM killer killed the sandbox's first process (the
	// memory limit was reached), or the runtime recorded an OOM kill in the sandbox
	// and its first process died of it.
	EndOOMKilled = "OOMKilled"
	// EndEvicted: the runtime evicted the sandbox, e.g. the node ran low on memory or
	// disk, or the sandbox went over its ephemeral storage limit.
	EndEvicted = "Evicted"
	// EndError: the sandbox's first process exited with a non-zero status or was
	// killed by a signal, without an OOM kill.
	EndError = "Error"
	// EndCompleted: the sandbox's first process exited with status 0 without being
	// asked by berth's Stop.
	EndCompleted = "Completed"
)

// MaxEndMessage is the most bytes Sandbox.EndMessage holds.
const MaxEndMessage = 256

// SanitizeEndMessage makes s fit Sandbox.EndMessage: control characters and
// invalid UTF-8 become spaces, runs of spaces one space, and the result is cut at
// MaxEndMessage bytes (on a rune boundary, with "..." when cut). It also suits
// EndReason, which drivers cap at MaxEndMessage too.
func SanitizeEndMessage(s string) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			r = ' '
		}
		if r == ' ' && (space || b.Len() == 0) {
			continue
		}
		space = r == ' '
		b.WriteRune(r)
	}
	out := strings.TrimRight(b.String(), " ")
	if len(out) <= MaxEndMessage {
		return out
	}
	cut := MaxEndMessage - len("...")
	for !utf8.RuneStart(out[cut]) {
		cut--
	}
	return strings.TrimRight(out[:cut], " ") + "..."
}

// WindowSize is a terminal size in character cells.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExecRequest describes one process to start in a sandbox.
type ExecRequest struct {
	// Argv is the program and its arguments; Argv[0] is looked up in PATH. There is no
	// implicit shell.
	Argv []string
	// Env is KEY=VALUE pairs added for this exec only, over the sandbox's environment.
	Env []string
	// Dir is the working directory; empty means the sandbox's Workdir or home. A
	// directory that does not exist makes Exec fail with ErrInvalid.
	Dir string
	// User overrides the sandbox's default user for this exec (Capabilities.ExecUser).
	User string
	// TTY allocates a pseudo-terminal of Size; stdout and stderr are then one stream,
	// written to Stdout.
	TTY  bool
	Size WindowSize
	// Stdin, when true, connects Process.Write to the process's standard input. When
	// false the process's stdin is at EOF from the start.
	Stdin bool
	// Stdout and Stderr receive the output bytes unchanged, in order. nil discards.
	// Writes come from one goroutine (the two streams share one ordered wire stream),
	// so a writer that blocks holds back both streams and, past the documented
	// buffering, the process itself (back pressure).
	Stdout io.Writer
	Stderr io.Writer
	// Timeout, when positive, kills the exec's whole process tree after this long;
	// the result then has TimedOut set.
	Timeout time.Duration
}

// Process is a started exec. Write, CloseStdin, Resize and Signal are applied in call
// order; they are safe to call from one goroutine while another waits.
type Process interface {
	// Write sends bytes to the process's stdin (ExecRequest.Stdin must be true).
	Write(p []byte) (int, error)
	// CloseStdin closes the process's stdin; the process then reads EOF.
	CloseStdin() error
	// Resize changes the TTY's size (TTY execs only; ErrInvalid otherwise).
	Resize(size WindowSize) error
	// Signal sends a signal (a Linux signal number) to the exec's process group.
	Signal(sig int) error
	// Wait blocks until the leader has exited and its output up to that moment has been
	// written to the writers, and returns the result. When the Exec context is
	// cancelled first, the tree is killed and Wait returns with Canceled set.
	Wait() (ExecResult, error)
}

// ExecResult is the outcome of an exec.
type ExecResult struct {
	// ExitCode is the leader's exit status; 128+N when killed by signal N; 127 when the
	// command was not found and 126 when it could not be executed (the reason is
	// written to stderr).
	ExitCode int `json:"exit_code"`
	// Signal is the signal number that killed the leader, 0 if it exited.
	Signal int `json:"signal"`
	// TimedOut is set when ExecRequest.Timeout expired and the tree was killed.
	TimedOut bool `json:"timed_out"`
	// Canceled is set when the caller cancelled the exec (context) and the tree was killed.
	Canceled bool `json:"canceled"`
	// OOMKilled is set when the kernel killed a process of the sandbox for lack of
	// memory during the exec (berth's agent reads its cgroup's OOM-kill counter).
	OOMKilled bool `json:"oom_killed"`
	// Duration is the wall time from start to the leader's exit.
	Duration time.Duration `json:"duration_ns"`
	// Cwd is, for shell-mode calls of berth's agent, the working directory recorded
	// for the session's next call (where the command left the shell, or the previous
	// one when the command ended without its state being recorded: killed, `exec`);
	// empty otherwise.
	Cwd string `json:"cwd,omitempty"`
}

// CheckArgv returns ErrInvalid when req has no argv ("exec: empty argv") or an empty
// program name ("argv[0]: empty program name", as berth serve's API says it).
func CheckArgv(req ExecRequest) error {
	switch {
	case len(req.Argv) == 0:
		return Errorf(ErrInvalid, "exec: empty argv")
	case req.Argv[0] == "":
		return Errorf(ErrInvalid, "argv[0]: empty program name")
	}
	return nil
}

// CheckExecText returns an ErrInvalid error naming the first of req's argv, env, dir
// and user that is not valid UTF-8, or nil. The wire protocols (gRPC) carry these as
// text, so such a value cannot reach a sandbox.
func CheckExecText(req ExecRequest) error {
	check := func(what, v string) error {
		if !utf8.ValidString(v) {
			return Errorf(ErrInvalid, "%s %q is not valid UTF-8; berth passes commands, variables and paths as text", what, v)
		}
		return nil
	}
	for i, a := range req.Argv {
		if err := check(fmt.Sprintf("argument %d", i), a); err != nil {
			return err
		}
	}
	for _, kv := range req.Env {
		if err := check("environment variable", kv); err != nil {
			return err
		}
	}
	if err := check("working directory", req.Dir); err != nil {
		return err
	}
	return check("user", req.User)
}
