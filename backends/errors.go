package backends

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/driverpb"
)

// kindTable is the one mapping between backend error kinds and gRPC status
// codes; ToStatus documents it.
var kindTable = []struct {
	kind error
	code codes.Code
	name string
}{
	{backend.ErrNotFound, codes.NotFound, "not_found"},
	{backend.ErrConflict, codes.FailedPrecondition, "conflict"},
	{backend.ErrUnavailable, codes.Unavailable, "unavailable"},
	{backend.ErrUnsupported, codes.Unimplemented, "unsupported"},
	{backend.ErrInvalid, codes.InvalidArgument, "invalid"},
	{backend.ErrTimeout, codes.DeadlineExceeded, "timeout"},
}

// ToStatus converts a driver's error into a gRPC status error for the wire.
// An error that wraps a backend kind gets that kind's code, its full message
// (err.Error()) and a driverpb.ErrorDetail naming the kind:
//
//	backend.ErrNotFound    codes.NotFound           "not_found"
//	backend.ErrConflict    codes.FailedPrecondition "conflict"
//	backend.ErrUnavailable codes.Unavailable        "unavailable"
//	backend.ErrUnsupported codes.Unimplemented      "unsupported"
//	backend.ErrInvalid     codes.InvalidArgument    "invalid"
//	backend.ErrTimeout     codes.DeadlineExceeded   "timeout"
//
// ErrConflict is sent as FailedPrecondition rather than AlreadyExists because
// the kind covers both "the name is held by something not ours" and "the state
// does not allow the call" (an exec in a stopped sandbox); FailedPrecondition
// is gRPC's code for the general case. FromStatus also reads AlreadyExists and
// Aborted as ErrConflict, and OutOfRange as ErrInvalid.
//
// context.Canceled becomes codes.Canceled and context.DeadlineExceeded
// codes.DeadlineExceeded; an error that already is a gRPC status passes through;
// anything else becomes codes.Unknown with the message. nil stays nil.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if kind := backend.KindOf(err); kind != nil {
		for _, k := range kindTable {
			if k.kind != kind {
				continue
			}
			st := status.New(k.code, err.Error())
			if withDetail, derr := st.WithDetails(&driverpb.ErrorDetail{Kind: k.name}); derr == nil {
				st = withDetail
			}
			return st.Err()
		}
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, err.Error()).Err()
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, err.Error()).Err()
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	return status.New(codes.Unknown, err.Error()).Err()
}

// FromStatus converts a gRPC status error from the wire back into an error that
// wraps the backend kind, so errors.Is(err, backend.ErrNotFound) and friends
// hold on the host, with the status message as its text. The kind comes from
// the status's driverpb.ErrorDetail or, without one (a plugin not written in
// Go, or gRPC itself), from the code. codes.Canceled wraps context.Canceled.
// Other codes give a plain error with the message and the code's name. An error
// that is not a gRPC status is returned unchanged; nil and codes.OK give nil.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if st.Code() == codes.OK {
		return nil
	}
	kind := detailKind(st)
	if kind == nil {
		kind = codeKind(st.Code())
	}
	if kind != nil {
		return backend.Errorf(kind, "%s", st.Message())
	}
	if st.Code() == codes.Canceled {
		return &wrapError{msg: st.Message(), err: context.Canceled}
	}
	if st.Code() == codes.Unknown {
		return errors.New(st.Message())
	}
	return fmt.Errorf("%s (gRPC %s)", st.Message(), st.Code())
}

// detailKind returns the kind named by st's driverpb.ErrorDetail, or nil.
func detailKind(st *status.Status) error {
	for _, a := range st.Proto().GetDetails() {
		var d driverpb.ErrorDetail
		if !a.MessageIs(&d) || a.UnmarshalTo(&d) != nil {
			continue
		}
		for _, k := range kindTable {
			if k.name == d.Kind {
				return k.kind
			}
		}
	}
	return nil
}

// hasDetail reports whether err is a status that our server produced from a
// backend kind.
func hasDetail(err error) bool {
	st, ok := status.FromError(err)
	return ok && detailKind(st) != nil
}

// codeKind maps a bare code to a kind, or nil.
func codeKind(c codes.Code) error {
	switch c {
	case codes.AlreadyExists, codes.Aborted:
		return backend.ErrConflict
	case codes.OutOfRange:
		return backend.ErrInvalid
	}
	for _, k := range kindTable {
		if k.code == c {
			return k.kind
		}
	}
	return nil
}

// wrapError is an error with its own text that wraps another.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }
