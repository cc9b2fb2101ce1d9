package backend_test

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/backend"
)

// runtimeError stands for a runtime SDK's own error type (the Docker client's, a
// Kubernetes StatusError): a caller reaches it with errors.As.
type runtimeError struct{ code int }

func (e *runtimeError) Error() string { return "runtime said no" }

// An error made by Errorf keeps its cause: errors.Is finds the kind and the cause's
// own sentinels, errors.As its types; its text is the message; kinds inside the
// cause are not seen, so the error has one kind.
func TestErrorfKeepsCause(t *testing.T) {
	_, statErr := os.Stat("/nonexistent/berth-errors-test")
	err := backend.Errorf(backend.ErrNotFound, "sandbox s:1: reading its state: %w", statErr)
	if !errors.Is(err, backend.ErrNotFound) || backend.KindOf(err) != backend.ErrNotFound {
		t.Errorf("kind lost: Is %v, KindOf %v", errors.Is(err, backend.ErrNotFound), backend.KindOf(err))
	}
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, syscall.ENOENT) {
		t.Errorf("errors.Is does not find the cause's fs.ErrNotExist / ENOENT in %q", err)
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Path != "/nonexistent/berth-errors-test" {
		t.Errorf("errors.As(*fs.PathError) = %v (%+v)", errors.As(err, &pe), pe)
	}
	if want := "sandbox s:1: reading its state: " + statErr.Error(); err.Error() != want {
		t.Errorf("text %q, want %q", err, want)
	}

	rt := backend.Errorf(backend.ErrUnavailable, "docker: create: %w", &runtimeError{code: 503})
	var re *runtimeError
	if !errors.As(rt, &re) || re.code != 503 {
		t.Errorf("errors.As on the runtime's error type failed: %v", rt)
	}
	// Wrapped again by a caller, as the registry and the CLI do.
	outer := errors.Join(errors.New("opening session"), rt)
	if !errors.Is(outer, backend.ErrUnavailable) || !errors.As(outer, &re) {
		t.Errorf("kind or cause lost through a further wrap: %v", outer)
	}

	inner := backend.Errorf(backend.ErrNotFound, "no such image")
	err = backend.Errorf(backend.ErrUnavailable, "pull failed: %w", inner)
	if errors.Is(err, backend.ErrNotFound) || backend.KindOf(err) != backend.ErrUnavailable {
		t.Errorf("a kind inside the cause shows: Is(ErrNotFound) %v, KindOf %v", errors.Is(err, backend.ErrNotFound), backend.KindOf(err))
	}
	if !errors.Is(err, inner) {
		t.Errorf("the wrapped error itself is not found by errors.Is")
	}

	// Without %w nothing but the kind is wrapped, as before.
	flat := backend.Errorf(backend.ErrInvalid, "bad %v", statErr)
	if errors.Is(flat, fs.ErrNotExist) || !errors.Is(flat, backend.ErrInvalid) {
		t.Errorf("%%v wrapped its operand or lost the kind: %v", flat)
	}
}
