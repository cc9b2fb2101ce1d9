// Package rpcerr is the one mapping between berth's error kinds (package backend) and
// gRPC status codes, used by both of berth's wire protocols: the driver plugin
// protocol (package backends) and the agent protocol (package agent).
// Servers return backend errors from their handlers and install the interceptors
// (ServerOptions), which turn them into statuses; clients turn a status back into a
// backend error with FromStatus. Nothing else in the project builds a status code.
//
// On the wire an error that wraps a kind is a status with the kind's code, the
// error's whole text as message, and a google.rpc.ErrorInfo detail (the gRPC rich
// error model) with Domain "berth.sh" and the kind's name as Reason, so the kind
// survives even where two kinds could share a code.
package rpcerr

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sh/berth/backend"
)

// Domain is the ErrorInfo domain of berth's error details.
const Domain = "berth.sh"

// kinds is the table: a kind, its code and its name (ErrorInfo.Reason).
//
//	backend.ErrNotFound    codes.NotFound           "not_found"
//	backend.ErrConflict    codes.FailedPrecondition "conflict"
//	backend.ErrUnavailable codes.Unavailable        "unavailable"
//	backend.ErrUnsupported codes.Unimplemented      "unsupported"
//	backend.ErrInvalid     codes.InvalidArgument    "invalid"
//	backend.ErrTimeout     codes.DeadlineExceeded   "timeout"
//
// ErrConflict is FailedPrecondition rather than AlreadyExists because the kind covers
// both "the name is held by something not ours" and "the state does not allow the
// call"; FailedPrecondition is gRPC's code for the general case.
var kinds = []struct {
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

// KindName returns the name of the backend kind that err wraps ("not_found",
// "conflict", "unavailable", "unsupported", "invalid", "timeout": the table above,
// the names the wire carries), or "" when it wraps none. berth serve's HTTP API
// names kinds the same way.
func KindName(err error) string {
	if kind := backend.KindOf(err); kind != nil {
		for _, k := range kinds {
			if k.kind == kind {
				return k.name
			}
		}
	}
	return ""
}

// ToStatus converts err into a gRPC status error for the wire. An error that wraps a
// backend kind gets the kind's code (see the table in the package doc), its whole text
// as message and the ErrorInfo detail naming the kind. context.Canceled becomes
// codes.Canceled and context.DeadlineExceeded codes.DeadlineExceeded (without a kind);
// an error that already is a gRPC status passes through unchanged; anything else is
// codes.Unknown with its text. nil stays nil.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if kind := backend.KindOf(err); kind != nil {
		for _, k := range kinds {
			if k.kind == kind {
				st := status.New(k.code, err.Error())
				if d, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: Domain, Reason: k.name}); derr == nil {
					st = d
				}
				return st.Err()
			}
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

// FromStatus converts a gRPC status error into an error that wraps the backend kind,
// with the status message as its text (an empty one says so and names the code), so errors.Is(err, backend.ErrNotFound) holds on
// the client. The kind comes from the ErrorInfo detail or, without one (a peer not
// written with this package, or gRPC itself: a broken connection is Unavailable),
// from the code; AlreadyExists and Aborted read as ErrConflict, OutOfRange as
// ErrInvalid. codes.Canceled wraps context.Canceled. Other codes give a plain error
// with the message and the code's name. An error that is not a status is returned
// unchanged; nil and codes.OK give nil.
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
	msg := st.Message()
	if msg == "" {
		// The peer said nothing: the code is all there is to say.
		msg = fmt.Sprintf("the peer's error has no message (gRPC %s)", st.Code())
	}
	switch {
	case kind != nil:
		return backend.Errorf(kind, "%s", msg)
	case st.Code() == codes.Canceled:
		return &wrapError{msg: msg, err: context.Canceled}
	case st.Code() == codes.Unknown || st.Message() == "":
		return errors.New(msg)
	}
	return fmt.Errorf("%s (gRPC %s)", msg, st.Code())
}

// FromPeer reports whether err is a status that a berth server made from a backend
// kind (it carries berth's ErrorInfo), as opposed to one made by gRPC itself (a
// broken connection, an unknown method).
func FromPeer(err error) bool {
	st, ok := status.FromError(err)
	return ok && detailKind(st) != nil
}

// detailKind returns the kind that st's berth ErrorInfo names, or nil.
func detailKind(st *status.Status) error {
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != Domain {
			continue
		}
		for _, k := range kinds {
			if k.name == info.GetReason() {
				return k.kind
			}
		}
	}
	return nil
}

// codeKind maps a bare code to a kind, or nil.
func codeKind(c codes.Code) error {
	switch c {
	case codes.AlreadyExists, codes.Aborted:
		return backend.ErrConflict
	case codes.OutOfRange:
		return backend.ErrInvalid
	}
	for _, k := range kinds {
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

// ServerOptions returns the gRPC server options that pass every handler's error
// through ToStatus, unary and streaming calls alike, so handlers return backend
// errors and never build statuses themselves.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			return resp, ToStatus(err)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return ToStatus(h(srv, ss))
		}),
	}
}
