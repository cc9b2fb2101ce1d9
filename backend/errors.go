package backend

import (
	"errors"
	"fmt"
)

// Error kinds. Drivers wrap one of these with context (fmt.Errorf("...: %w", ErrNotFound)
// or Errorf) and callers test with errors.Is. The kinds survive the plugin boundary:
// package backends maps each to one gRPC status code and back, in one place.
var (
	// ErrNotFound: the sandbox (or image, or path) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the name is held by something that is not ours (another owner's
	// sandbox, a container without berth labels), or the state does not allow the call.
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: the runtime or the driver process is down or unreachable; the call
	// may succeed later.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnsupported: the driver does not implement this call or option; its
	// Capabilities say so.
	ErrUnsupported = errors.New("unsupported")
	// ErrInvalid: the request is malformed (a bad spec, a relative path, an empty argv).
	ErrInvalid = errors.New("invalid argument")
	// ErrTimeout: the call (not an exec, whose timeout is reported in ExecResult) did not
	// finish in time.
	ErrTimeout = errors.New("timeout")
)

// Kinds lists every error kind, in the order used by the wire mapping.
var Kinds = []error{ErrNotFound, ErrConflict, ErrUnavailable, ErrUnsupported, ErrInvalid, ErrTimeout}

// Errorf formats a message and wraps kind, so errors.Is(err, kind) holds and the text
// reads "message: kind" only when the message does not already say it.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// KindOf returns the first kind in Kinds that err wraps, or nil when it wraps none.
func KindOf(err error) error {
	for _, k := range Kinds {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}
