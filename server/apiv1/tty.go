package apiv1

// LoginShell is the command that a TTY runs when the request names none, and what
// berth shell runs: the sandbox's bash as a login shell when it has one, else sh.
var LoginShell = []string{"sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"}

// MaxTTYMessage is the largest message a TTY client may send (1 MiB); a larger one
// closes the connection (status 1009) and kills the command.
const MaxTTYMessage = 1 << 20

// TTYMessage is one JSON text message of the TTY WebSocket. Type says which:
//
//	client → server: "resize" (Rows, Cols), "signal" (Signal), "eof" (close stdin),
//	                 "cancel" (kill the command's tree; the result still comes,
//	                 with Canceled set)
//	server → client: "started" (Session, Driver, Sandbox, Recreated...),
//	                 "result" (Result), "error" (Error)
//
// Unknown types and fields from a client are an error: the server sends "error"
// (kind invalid), closes the connection and the command's tree is killed.
type TTYMessage struct {
	Type string `json:"type"`
	// Rows and Cols are a resize's new terminal size, in characters (both ≥ 1).
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Signal is a signal's name ("INT" or "SIGINT") or number ("2"), sent to the
	// command's process group.
	Signal string `json:"signal,omitempty"`
	// Session, Driver and Sandbox say where a started command runs; Recreated,
	// Moved (with their reasons) and Pooled are as in ExecResult.
	Session         string `json:"session,omitempty"`
	Driver          string `json:"driver,omitempty"`
	Sandbox         string `json:"sandbox,omitempty"`
	Recreated       bool   `json:"recreated,omitempty"`
	RecreatedReason string `json:"recreated_reason,omitempty"`
	Moved           bool   `json:"moved,omitempty"`
	MovedReason     string `json:"moved_reason,omitempty"`
	Pooled          bool   `json:"pooled,omitempty"`
	// Result is a result message's result (its Stdout and Stderr are empty: the
	// output came as binary messages).
	Result *ExecResult `json:"result,omitempty"`
	// Error is an error message's error.
	Error *ErrorInfo `json:"error,omitempty"`
}
