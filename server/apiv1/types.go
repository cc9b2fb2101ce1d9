package apiv1

import (
	"time"
)

// ExecRequest is the JSON body of POST /v1/sessions/{name}/exec. Exactly one of Argv
// (a plain exec: no implicit shell) and Command (shell mode: the session's cd and
// export carry over to its next shell-mode call, see registry.Shell) is set. Unknown
// fields are refused (400), so a misspelt field never passes silently.
type ExecRequest struct {
	// Argv is the program and its arguments; Argv[0] is looked up in the exec's PATH.
	Argv []string `json:"argv,omitempty"`
	// Command is a shell-mode command string (bash, else sh, through eval).
	Command string `json:"command,omitempty"`
	// Env holds variables for this exec only, over the sandbox's environment. Keys
	// must be non-empty and hold no '=' or NUL.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the working directory; empty means the rule's workdir, else the
	// sandbox's default (as berth exec -w). A missing directory is an error (400).
	Cwd string `json:"cwd,omitempty"`
	// User runs a plain exec as this user instead of the sandbox's default, where the
	// driver can (Capabilities.ExecUser); not allowed with Command.
	User string `json:"user,omitempty"`
	// Timeout, a duration as berth's config takes it ("30s", "5m", "1d"), kills the
	// exec's whole process tree once it has passed; the result then says timed_out.
	// Empty means none.
	Timeout string `json:"timeout,omitempty"`
	// MaxOutput caps each output stream, in bytes, as berth exec --max-output does.
	// Plain JSON answer: each stream's text is kept within it as head, marker line
	// and tail (nil: DefaultMaxOutput). Streamed answer (NDJSON): the first MaxOutput
	// bytes of each stream are sent, the rest dropped and counted (nil: no cap).
	// Shell mode: as registry.ShellRequest.MaxOutput (nil or 0: the rule's max_output,
	// else 50 KiB), and it must be at least 1.
	MaxOutput *int64 `json:"max_output,omitempty"`
	// Stdin is the command's standard input as text; StdinBase64 the same as base64
	// (standard encoding, padded) for bytes that are not text. At most one of them;
	// with neither the command reads EOF at once. Both count against the request
	// body's limit (MaxRequestBody).
	Stdin       *string `json:"stdin,omitempty"`
	StdinBase64 *string `json:"stdin_base64,omitempty"`
	// Recreate removes the session's sandbox first and runs in a new one made from
	// its rule's current config (berth exec --recreate).
	Recreate bool `json:"recreate,omitempty"`
}

// DefaultMaxOutput is the per-stream cap, in bytes, of a plain JSON exec answer
// when the request sets no max_output: 1 MiB, as berth exec --json.
const DefaultMaxOutput = 1 << 20

// ExecResult is the result of an exec: the object that berth exec --json prints, and
// the answer of POST /v1/sessions/{name}/exec (the last line, an Event of type
// "result", of a streamed one). Times are milliseconds.
type ExecResult struct {
	// ExitCode is the command's exit code; 128+N when signal N killed it.
	ExitCode int `json:"exit_code"`
	// Signal is the signal that killed the command, 0 if none.
	Signal int `json:"signal"`
	// TimedOut is set when the request's timeout passed and the tree was killed.
	TimedOut bool `json:"timed_out"`
	// OOMKilled is set when the runtime reported an out-of-memory kill during the exec.
	OOMKilled bool `json:"oom_killed"`
	// DurationMS is the command's wall time in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// Session, Driver and Sandbox say where it ran.
	Session string `json:"session"`
	Driver  string `json:"driver"`
	Sandbox string `json:"sandbox"`
	// Recreated says that this exec ran in a new, empty sandbox (the session's
	// previous one was removed by retention, vanished, was mapped elsewhere by a
	// config change, or was removed as asked); RecreatedReason says why.
	Recreated       bool   `json:"recreated"`
	RecreatedReason string `json:"recreated_reason,omitempty"`
	// Moved says that the session is back in a sandbox it had before; MovedReason why.
	Moved       bool   `json:"moved,omitempty"`
	MovedReason string `json:"moved_reason,omitempty"`
	// Pooled says that the session's sandbox is a warm pool member that it claimed
	// (in this call when the session had no sandbox before: a claim, not a create).
	Pooled bool `json:"pooled"`
	// Stdout and Stderr are the captured output as UTF-8 text (invalid bytes
	// replaced), capped per stream (ExecRequest.MaxOutput); empty in a streamed
	// answer, whose output came as events. StdoutTruncatedBytes and
	// StderrTruncatedBytes count the bytes left out (of the text, or of the events).
	Stdout               string `json:"stdout"`
	Stderr               string `json:"stderr"`
	StdoutTruncatedBytes int64  `json:"stdout_truncated_bytes"`
	StderrTruncatedBytes int64  `json:"stderr_truncated_bytes"`
	// Canceled says that the call was cancelled while the command ran (a cancel
	// input event, a signal event in shell mode, a shutdown past its grace) and its
	// tree was killed.
	Canceled bool `json:"canceled,omitempty"`
	// Shell mode only: the session's directory for its next call; the host files
	// that hold a capped stream whole (and what even they left out); how many of the
	// session's older such files this call deleted to stay within output_max_total.
	Cwd                      string `json:"cwd,omitempty"`
	StdoutFile               string `json:"stdout_file,omitempty"`
	StderrFile               string `json:"stderr_file,omitempty"`
	StdoutFileTruncatedBytes int64  `json:"stdout_file_truncated_bytes,omitempty"`
	StderrFileTruncatedBytes int64  `json:"stderr_file_truncated_bytes,omitempty"`
	OutputFilesRemoved       int    `json:"output_files_removed,omitempty"`
}

// Event is one line of a streamed exec answer (Accept: application/x-ndjson): one
// "started" event once the command runs, output events ("stdout", "stderr") in the
// order the command wrote them, then one "result" event, or one "error" event when
// the exec failed after the answer began. Clients ignore events they do not know.
// It is also one input event of a streamed exec request (Content-Type:
// application/x-ndjson; see InputStdin ... InputCancel).
type Event struct {
	// Event is "started", "stdout", "stderr", "result" or "error" in an answer;
	// "stdin", "eof", "signal" or "cancel" in a request.
	Event string `json:"event"`
	// Data is an output or stdin event's bytes, base64 (standard encoding, padded):
	// bytes are passed on unchanged, whatever their encoding.
	Data []byte `json:"data,omitempty"`
	// Started is the "started" event's placement of the command.
	Started *ExecStarted `json:"started,omitempty"`
	// Signal is a "signal" input event's Linux signal number (1-64).
	Signal int `json:"signal,omitempty"`
	// Result is the "result" event's result.
	Result *ExecResult `json:"result,omitempty"`
	// Error is the "error" event's error.
	Error *ErrorInfo `json:"error,omitempty"`
}

// ExecStarted says where a streamed exec's command runs, as soon as it does (a
// plain exec; in shell mode only Session is set): the fields of ExecResult that
// are known at the start.
type ExecStarted struct {
	Session         string `json:"session"`
	Driver          string `json:"driver,omitempty"`
	Sandbox         string `json:"sandbox,omitempty"`
	Recreated       bool   `json:"recreated,omitempty"`
	RecreatedReason string `json:"recreated_reason,omitempty"`
	Moved           bool   `json:"moved,omitempty"`
	MovedReason     string `json:"moved_reason,omitempty"`
	Pooled          bool   `json:"pooled,omitempty"`
}

// Session is one session as GET /v1/sessions lists it and GET /v1/sessions/{name}
// returns it; berth sessions --json prints the same objects.
type Session struct {
	// Session, Driver, Sandbox and Scope (the glob of the rule that created the
	// record) are as recorded.
	Session string `json:"session"`
	Driver  string `json:"driver"`
	Sandbox string `json:"sandbox"`
	Scope   string `json:"scope"`
	// State is created, running or stopped as the driver reports it; removed when
	// retention removed the sandbox (RemovedReason says why), missing when the
	// driver no longer has it, unknown when the driver could not be asked (Error).
	State string `json:"state"`
	// Created and LastUsed are RFC 3339 times (UTC).
	Created  time.Time `json:"created"`
	LastUsed time.Time `json:"last_used"`
	// Drift says that the sandbox no longer matches its rule; DriftReason how.
	Drift       bool   `json:"drift"`
	DriftReason string `json:"drift_reason,omitempty"`
	// Pooled says that the sandbox is a warm pool member that the session claimed
	// (its Created is the claim's time).
	Pooled bool `json:"pooled"`
	// Error is why State is unknown.
	Error string `json:"error,omitempty"`
	// RemovedReason is why retention removed the sandbox (State removed).
	RemovedReason string `json:"removed_reason,omitempty"`
}

// ErrorBody is the body of every error answer: {"error": {...}}.
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo is one error: its kind (see Kinds), its message, and the session it
// concerns, if any.
type ErrorInfo struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Session string `json:"session,omitempty"`
	// Retried is set for kind driver_crashed only: whether berth made the call once
	// more on the restarted plugin (it does for idempotent calls: create, stop,
	// remove; never for an exec that may have started).
	Retried *bool `json:"retried,omitempty"`
}

// Health is the answer of GET /v1/health.
type Health struct {
	// Status is "ok" when the store can be used and every driver that a scope rule
	// names answers, "degraded" when a driver does not (see Drivers), "unavailable"
	// (HTTP 503) when the store cannot be used.
	Status string `json:"status"`
	// Version is berth's version; PID the daemon's process id; StateDir its state
	// dir; Config the config file in use ("" for the built-in default).
	Version  string `json:"version"`
	PID      int    `json:"pid"`
	StateDir string `json:"state_dir"`
	Config   string `json:"config"`
	// Store is "ok" or why the store cannot be used.
	Store string `json:"store"`
	// Drivers are the drivers the config's rules name, sorted, each with "ok" or the
	// error that starting or asking it gave.
	Drivers []DriverHealth `json:"drivers"`
}

// DriverHealth is one driver's line in Health.
type DriverHealth struct {
	Name   string `json:"name"`
	Health string `json:"health"`
}

// Status is the answer of GET /v1/status: who the daemon is, without asking any
// driver (health does that), so that a client can check cheaply that it talks to
// the daemon of its own state dir and config before each call.
type Status struct {
	// API is the API's version, "v1".
	API string `json:"api"`
	// Version is berth's version; PID the daemon's process id.
	Version string `json:"version"`
	PID     int    `json:"pid"`
	// StateDir is the daemon's state dir (absolute); Config its config file ("" for
	// the built-in default, no file).
	StateDir string `json:"state_dir"`
	Config   string `json:"config"`
	// ClockOffsetMS is the offset at which the daemon judges retention
	// (BERTH_CLOCK_OFFSET), in milliseconds; 0 for none.
	ClockOffsetMS int64 `json:"clock_offset_ms"`
	// ConfigSHA256 is the SHA-256 of the config file's bytes as the daemon read
	// them (64 hex digits; "" for the built-in default): a client whose file hashes
	// the same knows it is the one the daemon checked.
	ConfigSHA256 string `json:"config_sha256,omitempty"`
	// PruneIntervalMS is how often the daemon prunes (retention and reconcile,
	// berth serve --prune-interval), in milliseconds; 0 when it does not.
	PruneIntervalMS int64 `json:"prune_interval_ms"`
}

// JobStartRequest is the JSON body of POST /v1/sessions/{name}/jobs. Exactly one of
// Argv and Command is set; unknown fields are refused.
type JobStartRequest struct {
	// Argv is the program and its arguments (no implicit shell).
	Argv []string `json:"argv,omitempty"`
	// Command is a command string, run as ["/bin/sh", "-c", Command] (not shell
	// mode: no session state is read or kept).
	Command string `json:"command,omitempty"`
	// Env holds variables for the job, over the sandbox's environment.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the job's working directory; empty means the sandbox's default.
	Cwd string `json:"cwd,omitempty"`
}

// Job is one background job, as POST /v1/sessions/{name}/jobs returns it and GET
// /v1/sessions/{name}/jobs lists it; berth job ls --json prints the same objects.
type Job struct {
	// ID is the job's id, unique within its sandbox's agent; Session its session.
	ID      string `json:"id"`
	Session string `json:"session"`
	// Argv is what it runs; PID its leader's pid in the sandbox.
	Argv []string `json:"argv"`
	PID  int      `json:"pid"`
	// Running is set until the leader has exited; then ExitCode and Signal are its
	// result (128+N for signal N).
	Running  bool `json:"running"`
	ExitCode int  `json:"exit_code"`
	Signal   int  `json:"signal"`
	// Started and Ended are RFC 3339 times (Ended is left out while it runs).
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	// LogBytes is how many bytes it has written in all; DroppedBytes how many of
	// those its log (the newest 1 MiB) no longer keeps.
	LogBytes     int64 `json:"log_bytes"`
	DroppedBytes int64 `json:"dropped_bytes"`
}

// LogEvent is one line of the answer of GET /v1/sessions/{name}/jobs/{id}/logs
// (NDJSON): "gap" (output before the kept log, Dropped bytes, is gone), "output"
// (Data, base64), then one "end" (Ended, ExitCode and Signal once the job has ended
// and its output is drained) or one "error". Offset is the byte offset into the
// job's output where a gap ends, where an output event's data starts, and, in
// "end", after the last byte sent: pass it as the next call's offset.
type LogEvent struct {
	Event    string     `json:"event"`
	Offset   int64      `json:"offset"`
	Dropped  int64      `json:"dropped,omitempty"`
	Data     []byte     `json:"data,omitempty"`
	Ended    bool       `json:"ended,omitempty"`
	ExitCode int        `json:"exit_code,omitempty"`
	Signal   int        `json:"signal,omitempty"`
	Error    *ErrorInfo `json:"error,omitempty"`
}

// ConfigCheck is the answer of POST /v1/config/check: how the check of the daemon's
// config file ended, what berth config check prints. A file that fails the check is
// an answer (OK false, Failure saying why at file:line:col), not an error of the
// call.
type ConfigCheck struct {
	// Path is the file checked.
	Path string `json:"path"`
	// OK says that it passed; Rules is then its number of scope rules.
	OK    bool `json:"ok"`
	Rules int  `json:"rules"`
	// Warnings are the mount policy's warnings, one per line with file:line:col
	// (config.FormatDiagnostics); empty for none.
	Warnings string `json:"warnings,omitempty"`
	// Notes are what the check could not settle (an image the first exec will
	// pull, a runtime that does not answer).
	Notes []string `json:"notes,omitempty"`
	// Failure is why the file failed the check (OK false).
	Failure string `json:"failure,omitempty"`
}

// RecreateAnswer is the answer of POST /v1/sessions/{name}/recreate.
type RecreateAnswer struct {
	// Session is the session's name (NFC).
	Session string `json:"session"`
	// Removed says whether there was a sandbox to remove; the next exec creates a
	// new one from the rule's current config.
	Removed bool `json:"removed"`
}

// NDJSON is the media type of a streamed exec answer: one Event per line.
const NDJSON = "application/x-ndjson"

// RecreateReason is the recreated_reason of an exec whose request set recreate.
const RecreateReason = "recreated as asked (recreate)"

// Input event names of a streamed exec request.
const (
	InputStdin  = "stdin"
	InputEOF    = "eof"
	InputSignal = "signal"
	InputCancel = "cancel"
)

// DefaultRetentionInterval is how often berth serve prunes (--prune-interval).
const DefaultRetentionInterval = 30 * time.Second

// PruneRequest is the optional JSON body of POST /v1/prune.
type PruneRequest struct {
	// DryRun reports what prune would do and changes nothing (berth prune --dry-run).
	DryRun bool `json:"dry_run,omitempty"`
	// Owner, when set, reconciles the sandboxes of that owner id instead: those of
	// another owner (a lost state dir's) are removed, past the grace period, and
	// nothing else is touched (berth prune --owner; registry.PruneOptions.Owner).
	// An id that is not one is 400 (invalid).
	Owner string `json:"owner,omitempty"`
}

// The HTTP layer's error kinds.
const (
	// KindUnauthorized: a TCP listener's request without the right bearer token.
	KindUnauthorized = "unauthorized"
	// KindTooLarge: a request body over MaxRequestBody.
	KindTooLarge = "too_large"
	// KindRequestTimeout: a request body that did not arrive within BodyTimeout.
	KindRequestTimeout = "request_timeout"
	// KindMediaType: a body that is not declared as application/json.
	KindMediaType = "unsupported_media_type"
	// KindMethod: a method that the path does not serve.
	KindMethod = "method_not_allowed"
	// KindShuttingDown: the daemon is shutting down and takes no new calls.
	KindShuttingDown = "shutting_down"
	// KindCanceled: the call was cancelled (the client went away, or the daemon's
	// shutdown grace ran out).
	KindCanceled = "canceled"
	// KindInternal: an error of no kind.
	KindInternal = "internal"
	// KindDriverCrashed: the driver's plugin crashed during the call (a kind of
	// unavailable: errors.Is(err, backend.ErrUnavailable) holds for it).
	KindDriverCrashed = "driver_crashed"
)

// MaxFileBytes is the largest file that GET and PUT /v1/sessions/{name}/files read
// or write (16 MiB); a larger one is answered 413 (too_large): use /archive.
const MaxFileBytes = 16 << 20

// TarType is the media type of a tar stream (/archive's bodies).
const TarType = "application/x-tar"

// ModeHeader is the header that carries a file's mode in GET /files's answer, as
// four octal digits (setuid, setgid and sticky first, e.g. "0644", "4755").
const ModeHeader = "X-Berth-Mode"

// ArchiveUpload is the answer of PUT /v1/sessions/{name}/archive.
type ArchiveUpload struct {
	// Entries is the number of tar entries extracted; Bytes the regular files'
	// bytes together.
	Entries int   `json:"entries"`
	Bytes   int64 `json:"bytes"`
}

// DefaultBodyTimeout is how long a request body may take to arrive (30 s); a
// slower one is answered 408 (request_timeout) and its connection closed.
const DefaultBodyTimeout = 30 * time.Second
