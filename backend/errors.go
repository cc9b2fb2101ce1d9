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

// Errorf returns an error of kind whose text is the formatted message, as
// fmt.Errorf makes it. A %w verb keeps its operand as the cause: errors.Is on the
// cause's own errors (fs.ErrNotExist, a syscall.Errno, a runtime's sentinel) and
// errors.As to its types (*fs.PathError, a runtime's error type) hold, as
// fmt.Errorf's wrapping does. The error has one kind, kind: error kinds inside the
// cause are not seen by errors.Is (a driver's ErrNotFound wrapped into an
// ErrUnavailable is unavailable, not both), so KindOf and the wire mappings agree
// with errors.Is. The text is the message alone; KindOf names the kind.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, cause: causeOf{fmt.Errorf(format, args...)}}
}

// kindError is Errorf's error: its kind, then its formatted error as a cause whose
// kinds are hidden.
type kindError struct {
	kind  error
	cause causeOf
}

func (e *kindError) Error() string   { return e.cause.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.cause} }

// causeOf is the cause of a kindError: errors.Is and errors.As see everything in
// err's tree but the error kinds (it answers them itself, so they do not descend).
type causeOf struct{ err error }

func (c causeOf) Error() string { return c.err.Error() }

// Is reports whether err's tree holds target, for any target that is not an error
// kind.
func (c causeOf) Is(target error) bool {
	for _, k := range Kinds {
		if target == k {
			return false
		}
	}
	return errors.Is(c.err, target)
}

// As finds the first error in err's tree that matches target.
func (c causeOf) As(target any) bool { return errors.As(c.err, target) }

// KindOf returns the first kind in Kinds that err wraps, or nil when it wraps none.
func KindOf(err error) error {
	for _, k := range Kinds {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}
