package backend

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"
	"unicode/utf8"
)

// TerminalBackend is the contract every driver implements. All calls take a context
// first; cancelling it abandons the call (and, for Exec, kills the exec's process tree).
// Sandboxes are addressed by the name the host chose in SandboxSpec.Name.
//
// Lifecycle: created → running ⇄ stopped → removed. Create is idempotent by name; Stop
// and Remove of a missing sandbox succeed; Inspect of one returns ErrNotFound.
type TerminalBackend interface {
	// Info reports the driver's name, version, protocol versions and capabilities.
	Info(ctx context.Context) (Info, error)

	// Create makes the sandbox req.Spec.Name and starts it, with berth's agent as its
	// first process (req.Agent). If a sandbox of that name exists and carries the same
	// LabelOwner, it is adopted: started if stopped, and returned with Adopted set. A
	// name held by anything else returns ErrConflict. A failed Create leaves nothing
	// behind. Errors: ErrInvalid (bad spec), ErrConflict, ErrUnavailable.
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

	// Exec starts one process in the running sandbox name. The process's output is
	// written to req.Stdout and req.Stderr as it comes; a writer that blocks holds the
	// process back (flow control), it is never buffered whole. Errors at start:
	// ErrNotFound (no sandbox), ErrConflict (not running), ErrInvalid (empty argv),
	// ErrUnavailable (agent unreachable). A command that cannot be run is not an
	// error: its ExecResult says 127 or 126.
	Exec(ctx context.Context, name string, req ExecRequest) (Process, error)

	// Close releases the driver's connections. Sandboxes are not touched.
	Close() error
}

// Dialer opens a connection to a sandbox's agent. Drivers supply one per sandbox; the
// built-in drivers dial a unix socket in the sandbox's socket directory (see package
// backends/agent), a future driver may tunnel through its runtime's exec stream.
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
	// of the berth binary in the state dir. Start it as "Binary agent serve --socket-dir
	// DIR" (see package backends/agent for the flags).
	Binary string `json:"binary"`
	// Dir is the per-sandbox, host-owned directory that holds Binary. Containers mount it
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
	// AllowHostPaths permits mounts of sensitive host paths (/, the Docker socket).
	AllowHostPaths bool `json:"allow_host_paths,omitempty"`
}

// DefaultEnvAllowlist is the host environment that local execs start from.
var DefaultEnvAllowlist = []string{"PATH", "LANG", "TERM", "TZ"}

// DefaultPidsLimit is the pids limit of container sandboxes when the spec sets none.
const DefaultPidsLimit = 512

// Mount is one bind mount from the host into the sandbox.
type Mount struct {
	// Source is an absolute host path.
	Source string `json:"source"`
	// Target is an absolute path in the sandbox.
	Target string `json:"target"`
	// ReadOnly mounts it read-only.
	ReadOnly bool `json:"read_only"`
}

// Resources are a sandbox's limits. Zero means "driver default" (unlimited for CPU and
// memory, DefaultPidsLimit for pids in containers).
type Resources struct {
	// CPUs is the number of CPUs, fractional allowed (1.5).
	CPUs float64 `json:"cpus"`
	// MemoryBytes is the memory limit in bytes; swap is set equal to it.
	MemoryBytes int64 `json:"memory_bytes"`
	// Pids is the maximum number of processes.
	Pids int64 `json:"pids"`
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
}

// WindowSize is a terminal size in character cells.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExecRequest describes one process to start in a sandbox.
type ExecRequest struct {
	// Argv is the program and its arguments; Argv[0] is looked up in PATH. There is no
	// implicit shell. It must be empty when Shell is set.
	Argv []string
	// Shell, when set, runs this command string in shell mode (Capabilities.Shell):
	// berth's agent runs it with bash when the sandbox has bash in PATH, else sh,
	// through eval, in the directory and with the exported variables that the previous
	// shell-mode exec of Session left (Env is applied over them), and then records the
	// new directory and exported variables for the next one. Every call is its own
	// process: `exit 7`, `set -e; false`, `exec CMD` or a syntax error end only that call,
	// and the next one starts from the last recorded state. Shell-mode execs of one
	// Session run one at a time, in order of arrival.
	Shell string
	// Session is the name of the session the exec belongs to (the registry sets it):
	// shell-mode state and background jobs are kept per session. Required with Shell
	// and Job.
	Session string
	// Job, when set, makes the exec a background-job operation (Capabilities.Jobs)
	// instead of a plain process; see JobRequest.
	Job *JobRequest
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

// JobOp is a background-job operation.
type JobOp string

// Background-job operations (JobRequest.Op). A job is a process that berth's agent
// starts in its own process group and keeps beyond the call that started it, with its
// stdout and stderr together in one bounded log (the last JobLogMax bytes) kept by the
// agent inside the sandbox; it dies with the sandbox.
const (
	// JobStart starts ExecRequest.Argv as a job of ExecRequest.Session (with the
	// request's Env, Dir and User) and writes its id and a newline to Stdout.
	JobStart JobOp = "start"
	// JobList writes one JSON object (JobInfo) a line to Stdout for each job of the
	// session, oldest first.
	JobList JobOp = "list"
	// JobLogs writes job ID's log to Stdout: what is kept (after a marker line
	// "[... N bytes dropped ...]" when the start was dropped), then, with Follow, new
	// output as it comes until the job has ended and its output is drained; the
	// exec's result is then the job's (exit code, signal). Without Follow the result
	// is exit 0.
	JobLogs JobOp = "logs"
	// JobKill ends job ID's process tree (TERM, then KILL after the grace) and
	// returns once it is gone.
	JobKill JobOp = "kill"
)

// AllSessions, as the ExecRequest.Session of a JobList, lists the jobs of every
// session in the sandbox (retention uses it to tell whether a sandbox is idle). It is
// not a valid session name.
const AllSessions = "*"

// JobLogMax is how many bytes of a job's output its log keeps (the newest).
const JobLogMax = 1 << 20

// JobRequest is the job part of an ExecRequest. An unknown ID (or a job of another
// session) makes Exec fail with ErrNotFound.
type JobRequest struct {
	Op     JobOp  `json:"op"`
	ID     string `json:"id,omitempty"`
	Follow bool   `json:"follow,omitempty"`
}

// JobInfo describes one background job, as JobList writes it.
type JobInfo struct {
	// ID is the job's id, unique within its sandbox's agent.
	ID string `json:"id"`
	// Argv is what it runs; PID its leader's pid in the sandbox.
	Argv []string `json:"argv"`
	PID  int      `json:"pid"`
	// Running is set until the leader has exited; then ExitCode and Signal are its
	// result (as in ExecResult).
	Running  bool `json:"running"`
	ExitCode int  `json:"exit_code"`
	Signal   int  `json:"signal"`
	// Started and Ended are when it started and ended (Ended is zero while running).
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	// LogBytes is how many bytes it has written in all; DroppedBytes how many of those
	// the log no longer keeps.
	LogBytes     int64 `json:"log_bytes"`
	DroppedBytes int64 `json:"dropped_bytes"`
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
	// OOMKilled is set when the runtime reported an OOM kill in the sandbox during the exec.
	OOMKilled bool `json:"oom_killed"`
	// Duration is the wall time from start to the leader's exit.
	Duration time.Duration `json:"duration_ns"`
	// Cwd is, for shell-mode execs, the working directory recorded for the next one
	// (where the command left the shell, or the previous one when the command ended
	// without its state being recorded: killed, `exec`); empty otherwise.
	Cwd string `json:"cwd,omitempty"`
}

// NeedsArgv reports whether req must carry an argv: a plain exec or a job start does;
// a shell-mode call and the other job operations do not.
func NeedsArgv(req ExecRequest) bool {
	return req.Shell == "" && (req.Job == nil || req.Job.Op == JobStart)
}

// CheckArgv returns ErrInvalid ("exec: empty argv") when req needs an argv
// (NeedsArgv) and has none, or an empty program name.
func CheckArgv(req ExecRequest) error {
	if NeedsArgv(req) && (len(req.Argv) == 0 || req.Argv[0] == "") {
		return Errorf(ErrInvalid, "exec: empty argv")
	}
	return nil
}

// CheckExecText returns an ErrInvalid error naming the first of req's argv, env, dir,
// user, shell command and session that is not valid UTF-8, or nil. The wire
// protocols (gRPC) carry these as text, so such a value cannot reach a sandbox.
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
	for what, v := range map[string]string{"working directory": req.Dir, "user": req.User, "shell command": req.Shell, "session": req.Session} {
		if err := check(what, v); err != nil {
			return err
		}
	}
	return nil
}
