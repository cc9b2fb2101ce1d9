package apiv1

import "time"

// AuditFile is the audit log's default name in the state dir.
const AuditFile = "audit.log"

// Audit log defaults (berth serve's --audit-max-size and --audit-keep).
const (
	// DefaultAuditMaxMB is the size, in MiB, at which the audit log is rotated.
	DefaultAuditMaxMB = 10
	// DefaultAuditKeep is how many rotated audit logs are kept beside the current one.
	DefaultAuditKeep = 5
)

// AuditEntry is one line of the audit log: one API call, written when its answer
// has ended. It never holds a command's text, its stdin or its environment: only
// the command's length and SHA-256, so that an operator can match a call to a
// command they know without the log holding secrets.
type AuditEntry struct {
	// Time is when the call arrived (RFC 3339, UTC, nanoseconds).
	Time time.Time `json:"time"`
	// Caller is who called: on a unix socket the peer's uid, gid and pid (SO_PEERCRED,
	// as the kernel saw them at connect time), on TCP the remote address.
	Caller Caller `json:"caller"`
	// Method and Route are the HTTP method and the route's pattern
	// ("/v1/sessions/{name}/exec"; "" for a path that no route serves); Path is the
	// request's escaped path.
	Method string `json:"method"`
	Route  string `json:"route"`
	Path   string `json:"path"`
	// Session is the session name of the path, as given, or "".
	Session string `json:"session,omitempty"`
	// CommandBytes and CommandSHA256 describe an exec's command: the shell-mode
	// command text, or a plain exec's argv joined with NUL bytes (its length in bytes,
	// and the lower-case hex SHA-256 of those bytes).
	CommandBytes  *int   `json:"command_bytes,omitempty"`
	CommandSHA256 string `json:"command_sha256,omitempty"`
	// ExitCode is an exec's exit code, when it ran to a result.
	ExitCode *int `json:"exit_code,omitempty"`
	// Status is the answer's HTTP status (200 for a streamed answer, whatever its end);
	// ErrorKind the kind of its error, if it ended with one.
	Status    int    `json:"status"`
	ErrorKind string `json:"error_kind,omitempty"`
	// DurationMS is the call's wall time, from its arrival to its answer's end, in
	// milliseconds.
	DurationMS float64 `json:"duration_ms"`
}

// Caller is an API caller, as the audit log records it.
type Caller struct {
	// UID, GID and PID are a unix socket peer's credentials (SO_PEERCRED).
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	PID *int32  `json:"pid,omitempty"`
	// Addr is a TCP caller's remote address (HOST:PORT).
	Addr string `json:"addr,omitempty"`
}
