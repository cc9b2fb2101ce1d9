// Package agenttest serves stand-ins for berth's exec agent to tests of hosts and
// drivers: gRPC servers that speak the agent's real protocol (the generated code is
// internal to package agent) with answers a test chooses, as a sandbox that took its
// agent's socket over could. It is test support: no production code imports it.
package agenttest

import (
	"context"
	"net"
	"sync"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"google.golang.org/grpc"
)

// CopyOutAgent answers Hello with the highest protocol version the client offers
// (pid 1) and every CopyOut with the bytes of its last SetTar, sent as they are in
// 32 KiB chunks; every other method returns gRPC Unimplemented.
type CopyOutAgent struct {
	agentpb.UnimplementedAgentServer
	mu  sync.Mutex
	tar []byte
}

// SetTar sets what the next CopyOut sends: any bytes, a tar stream or not.
func (f *CopyOutAgent) SetTar(b []byte) {
	f.mu.Lock()
	f.tar = b
	f.mu.Unlock()
}

// Hello implements the agent's Hello.
func (f *CopyOutAgent) Hello(_ context.Context, req *agentpb.HelloRequest) (*agentpb.HelloResponse, error) {
	var v int32
	for _, x := range req.GetVersions() {
		v = max(v, x)
	}
	return &agentpb.HelloResponse{Versions: req.GetVersions(), Protocol: v, Pid: 1}, nil
}

// CopyOut implements the agent's CopyOut.
func (f *CopyOutAgent) CopyOut(_ *agentpb.CopyOutRequest, s agentpb.Agent_CopyOutServer) error {
	f.mu.Lock()
	b := f.tar
	f.mu.Unlock()
	for off := 0; off < len(b); off += 32 << 10 {
		if err := s.Send(&agentpb.CopyOutChunk{Data: b[off:min(off+32<<10, len(b))]}); err != nil {
			return err
		}
	}
	return nil
}

// Serve serves f on l (nil: an agent that implements no method at all, as a server
// that predates every protocol version looks) until the returned stop is called;
// stop closes l and every connection.
func Serve(l net.Listener, f *CopyOutAgent) (stop func()) {
	srv := grpc.NewServer()
	if f != nil {
		agentpb.RegisterAgentServer(srv, f)
	} else {
		agentpb.RegisterAgentServer(srv, agentpb.UnimplementedAgentServer{})
	}
	go srv.Serve(l)
	return srv.Stop
}
