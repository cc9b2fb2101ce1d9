package rpcerr

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/berth-sh/berth/backend"
)

// FuzzFromStatus decodes fuzzed bytes as the google.rpc.Status a peer (an agent, a
// driver plugin) ends a call with, and checks what FromStatus makes of it: an error
// for every code but OK, with a text, the status's message in it, the kind its berth
// ErrorInfo names (or its code's), and the same kind and code again through ToStatus
// (docs/fuzzing.md).
func FuzzFromStatus(f *testing.F) {
	detail := func(domain, reason string) *anypb.Any {
		a, err := anypb.New(&errdetails.ErrorInfo{Domain: domain, Reason: reason})
		if err != nil {
			f.Fatal(err)
		}
		return a
	}
	for _, st := range []*spb.Status{
		{Code: int32(codes.NotFound), Message: "sandbox b-1: not found", Details: []*anypb.Any{detail(Domain, "not_found")}},
		{Code: int32(codes.InvalidArgument), Message: "x", Details: []*anypb.Any{detail(Domain, "timeout"), detail(Domain, "conflict")}},
		{Code: int32(codes.Internal), Message: "x", Details: []*anypb.Any{detail("other.example", "not_found"), detail(Domain, "no_such_kind")}},
		{Code: int32(codes.Unknown), Message: "plain"},
		{Code: int32(codes.AlreadyExists), Message: "taken"},
		{Code: int32(codes.OutOfRange), Message: "offset"},
		{Code: int32(codes.Canceled), Message: "gone"},
		{Code: int32(codes.ResourceExhausted), Message: "big"},
		{Code: 1000, Message: "no such code"},
		{Code: int32(codes.Unavailable), Message: "down", Details: []*anypb.Any{{TypeUrl: "type.googleapis.com/google.rpc.ErrorInfo", Value: []byte{0xff}}}},
	} {
		b, err := proto.Marshal(st)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p spb.Status
		if proto.Unmarshal(b, &p) != nil {
			return
		}
		in := status.ErrorProto(&p)
		err := FromStatus(in)
		if codes.Code(p.Code) == codes.OK {
			if err != nil {
				t.Fatalf("FromStatus(OK) = %v", err)
			}
			return
		}
		if err == nil || err.Error() == "" {
			t.Fatalf("FromStatus(%v) = %q: an error needs a text", &p, err)
		}
		if !strings.Contains(err.Error(), p.Message) {
			t.Fatalf("FromStatus(%v) = %q, without the message", &p, err)
		}
		st := status.Convert(in)
		kind := detailKind(st)
		if kind == nil {
			kind = codeKind(st.Code())
		}
		if got := backend.KindOf(err); got != kind {
			t.Fatalf("FromStatus(%v) has kind %v, want %v", &p, got, kind)
		}
		if FromPeer(in) != (detailKind(st) != nil) {
			t.Fatalf("FromPeer(%v) = %v", &p, FromPeer(in))
		}
		if st.Code() == codes.Canceled && !errors.Is(err, context.Canceled) {
			t.Fatalf("FromStatus(%v) = %v does not wrap context.Canceled", &p, err)
		}
		// Back on the wire: the kind, and with it its code, survive.
		if kind != nil {
			again := status.Convert(ToStatus(err))
			if backend.KindOf(FromStatus(again.Err())) != kind || !FromPeer(again.Err()) {
				t.Fatalf("ToStatus(FromStatus(%v)) = %v lost the kind %v", &p, again.Proto(), kind)
			}
		}
	})
}
