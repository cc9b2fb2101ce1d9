package backends

import (
	"errors"

	"github.com/berth-sh/berth/backend"
)

// ErrCrashed is wrapped, beside backend.ErrUnavailable, by the error of a call
// whose plugin process exited during it without the host stopping it (a crash or a
// kill from outside): errors.Is(err, ErrCrashed) tells a crash from an unreachable
// runtime, so that a supervising host can restart the plugin and retry the calls
// that may be retried.
var ErrCrashed = errors.New("driver plugin crashed")

// crashError is a call's error when its plugin crashed: its own text, wrapping
// backend.ErrUnavailable and ErrCrashed.
type crashError struct{ msg string }

func (e *crashError) Error() string   { return e.msg }
func (e *crashError) Unwrap() []error { return []error{backend.ErrUnavailable, ErrCrashed} }

// wrapError is an error with its own text that wraps another (a context error the
// caller tests with errors.Is). The mapping of error kinds to gRPC codes is package
// internal/rpcerr's.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }
