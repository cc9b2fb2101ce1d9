// Package fakewire is a gRPC server for fuzz tests that plays a hostile peer: every
// method of the service it serves answers with the same script, raw message bytes
// sent as they are (valid protobuf or not) and then a status, so that a client's
// whole decoding, gRPC's and its own, meets whatever the fuzzer made. It serves the
// fuzz targets of the agent client (agent) and of the plugin client
// (backends); see docs/fuzzing.md.
package fakewire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
)

// Script is what every call of a Server answers: Frames, each sent as one message
// (a unary call sends the first, or an empty message when there is none), then
// Status (nil or OK: the call succeeds).
type Script struct {
	Frames [][]byte
	Status *spb.Status
}

// Frame is one message on the wire, as raw bytes.
type Frame []byte

// Split cuts b into frames: each is a uvarint length followed by that many bytes
// (the last one takes what is left when b runs short).
func Split(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 {
			return append(out, b)
		}
		b = b[k:]
		if n > uint64(len(b)) {
			n = uint64(len(b))
		}
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

// Join is Split's inverse, for seeds.
func Join(frames ...[]byte) []byte {
	var out []byte
	for _, f := range frames {
		out = binary.AppendUvarint(out, uint64(len(f)))
		out = append(out, f...)
	}
	return out
}

// Marshal returns m's wire bytes, for seeds.
func Marshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// DecodeStatus reads b as a google.rpc.Status; bytes that are not one read as OK.
func DecodeStatus(b []byte) *spb.Status {
	var st spb.Status
	if proto.Unmarshal(b, &st) != nil {
		return nil
	}
	return &st
}

// Err is the error a handler returns for st: nil for nil or OK.
func Err(st *spb.Status) error {
	if st == nil || codes.Code(st.GetCode()) == codes.OK {
		return nil
	}
	return status.ErrorProto(st)
}

// Server serves one service with a Script.
type Server struct {
	Listener *bufconn.Listener
	srv      *grpc.Server

	mu     sync.Mutex
	script Script
}

// NewServer serves every method of desc (HandlerType and the methods' handlers are
// replaced) on an in-memory listener, with opts (say, transport credentials). Stop
// it when done.
func NewServer(desc *grpc.ServiceDesc, opts ...grpc.ServerOption) *Server {
	s := &Server{Listener: bufconn.Listen(1 << 20)}
	d := grpc.ServiceDesc{ServiceName: desc.ServiceName, HandlerType: (*any)(nil), Metadata: desc.Metadata}
	for _, m := range desc.Methods {
		d.Methods = append(d.Methods, grpc.MethodDesc{MethodName: m.MethodName, Handler: s.unary})
	}
	for _, st := range desc.Streams {
		st.Handler = s.stream(st.ClientStreams, st.ServerStreams)
		d.Streams = append(d.Streams, st)
	}
	s.srv = grpc.NewServer(append(opts, grpc.ForceServerCodec(rawCodec{}))...)
	s.srv.RegisterService(&d, struct{}{})
	go s.srv.Serve(s.Listener)
	return s
}

// Set makes sc the script of the calls from now on.
func (s *Server) Set(sc Script) {
	s.mu.Lock()
	s.script = sc
	s.mu.Unlock()
}

func (s *Server) current() Script {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.script
}

// Dial connects to the server (a dialer for grpc.WithContextDialer and the like).
func (s *Server) Dial(ctx context.Context) (net.Conn, error) { return s.Listener.DialContext(ctx) }

// Stop stops the server.
func (s *Server) Stop() { s.srv.Stop() }

func (s *Server) unary(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	var req Frame
	if err := dec(&req); err != nil {
		return nil, err
	}
	sc := s.current()
	if err := Err(sc.Status); err != nil {
		return nil, err
	}
	if len(sc.Frames) == 0 {
		return &Frame{}, nil
	}
	f := Frame(sc.Frames[0])
	return &f, nil
}

func (s *Server) stream(clientStreams, serverStreams bool) grpc.StreamHandler {
	return func(_ any, stream grpc.ServerStream) error {
		// A bidi call gets its first message only (its client waits for answers
		// before it sends more); a client stream is read to its end.
		for {
			var req Frame
			err := stream.RecvMsg(&req)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			if !clientStreams || serverStreams {
				break
			}
		}
		sc := s.current()
		for _, f := range sc.Frames {
			fr := Frame(f)
			if err := stream.SendMsg(&fr); err != nil {
				return err
			}
		}
		return Err(sc.Status)
	}
}

// rawCodec sends and receives Frames as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*Frame)
	if !ok {
		return nil, fmt.Errorf("fakewire: cannot marshal %T", v)
	}
	return *f, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*Frame)
	if !ok {
		return fmt.Errorf("fakewire: cannot unmarshal into %T", v)
	}
	*f = append(Frame(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }
