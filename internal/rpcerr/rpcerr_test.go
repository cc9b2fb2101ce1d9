package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sh/berth/backend"
)

// TestWireCodes pins the codes and detail names with literals, so that changing the
// table fails here: third-party plugins and older agents depend on these values.
func TestWireCodes(t *testing.T) {
	want := []struct {
		kind   error
		code   codes.Code
		reason string
	}{
		{backend.ErrNotFound, codes.NotFound, "not_found"},
		{backend.ErrConflict, codes.FailedPrecondition, "conflict"},
		{backend.ErrUnavailable, codes.Unavailable, "unavailable"},
		{backend.ErrUnsupported, codes.Unimplemented, "unsupported"},
		{backend.ErrInvalid, codes.InvalidArgument, "invalid"},
		{backend.ErrTimeout, codes.DeadlineExceeded, "timeout"},
	}
	if len(want) != len(backend.Kinds) {
		t.Fatalf("backend has %d kinds, this test pins %d: pin the new one", len(backend.Kinds), len(want))
	}
	for _, w := range want {
		err := fmt.Errorf("context: %w", backend.Errorf(w.kind, "sandbox b-1: %s", "why"))
		st, ok := status.FromError(ToStatus(err))
		if !ok || st.Code() != w.code {
			t.Errorf("%v: code %v, want %v", w.kind, st.Code(), w.code)
		}
		if st.Message() != err.Error() {
			t.Errorf("%v: message %q, want %q", w.kind, st.Message(), err.Error())
		}
		if got := reasonOf(st); got != w.reason {
			t.Errorf("%v: reason %q, want %q", w.kind, got, w.reason)
		}
		back := FromStatus(st.Err())
		if !errors.Is(back, w.kind) || back.Error() != err.Error() {
			t.Errorf("%v: round trip gave %v (%q)", w.kind, backend.KindOf(back), back)
		}
		if !FromPeer(st.Err()) {
			t.Errorf("%v: FromPeer false for a status made by ToStatus", w.kind)
		}
		// A peer that sends the bare code (no detail) still gets the kind across.
		if bare := FromStatus(status.Error(w.code, "bare")); !errors.Is(bare, w.kind) {
			t.Errorf("bare %v: kind %v, want %v", w.code, backend.KindOf(bare), w.kind)
		}
	}
}

func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(interface{ GetReason() string }); ok {
			return info.GetReason()
		}
	}
	return ""
}

func TestOtherErrors(t *testing.T) {
	for _, c := range []struct {
		in   error
		code codes.Code
	}{
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("waiting: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{errors.New("plain"), codes.Unknown},
		{status.Error(codes.ResourceExhausted, "big"), codes.ResourceExhausted},
	} {
		if got := status.Code(ToStatus(c.in)); got != c.code {
			t.Errorf("ToStatus(%v): %v, want %v", c.in, got, c.code)
		}
	}
	if ToStatus(nil) != nil || FromStatus(nil) != nil || FromStatus(status.Error(codes.OK, "")) != nil {
		t.Error("nil or OK did not stay nil")
	}
	if err := FromStatus(status.Error(codes.Canceled, "gone")); !errors.Is(err, context.Canceled) || err.Error() != "gone" {
		t.Errorf("Canceled: %v", err)
	}
	for code, kind := range map[codes.Code]error{codes.AlreadyExists: backend.ErrConflict, codes.Aborted: backend.ErrConflict, codes.OutOfRange: backend.ErrInvalid} {
		if err := FromStatus(status.Error(code, "x")); !errors.Is(err, kind) {
			t.Errorf("%v: kind %v, want %v", code, backend.KindOf(err), kind)
		}
	}
	if err := FromStatus(status.Error(codes.ResourceExhausted, "big")); backend.KindOf(err) != nil || err.Error() != "big (gRPC ResourceExhausted)" {
		t.Errorf("ResourceExhausted: %v", err)
	}
	plain := errors.New("not a status")
	if FromStatus(plain) != plain {
		t.Error("a non-status error was changed")
	}
	if FromPeer(status.Error(codes.Unavailable, "transport is closing")) {
		t.Error("FromPeer true for gRPC's own status")
	}
}

// KindName names every kind as the wire does, through wrapping, and nothing else.
func TestKindName(t *testing.T) {
	for _, k := range kinds {
		if got := KindName(fmt.Errorf("ctx: %w", backend.Errorf(k.kind, "x"))); got != k.name {
			t.Errorf("KindName of a wrapped %v = %q, want %q", k.kind, got, k.name)
		}
	}
	for _, err := range []error{nil, errors.New("plain"), context.Canceled} {
		if got := KindName(err); got != "" {
			t.Errorf("KindName(%v) = %q, want none", err, got)
		}
	}
}
