package backends

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/internal/driverpb"
)

// ProtocolVersion is the plugin protocol version this package serves and speaks:
// the go-plugin VersionedPlugins key, equal to backend.ProtocolVersion. A host
// and a plugin that share no version fail the handshake with an error naming both.
const ProtocolVersion = backend.ProtocolVersion

// PluginName is the name of the one plugin in every protocol version's
// go-plugin PluginSet.
const PluginName = "driver"

// Handshake is the go-plugin handshake shared by berth and every driver plugin.
// The cookie is not a secret; it only stops a plugin binary that is run by hand
// from waiting for a host (go-plugin then prints a hint and exits 1).
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "BERTH_DRIVER_PLUGIN",
	MagicCookieValue: "d5c1a9f3e0b84e6f9a2c7b1d4e8f0a36",
}

// Flow control and message sizes of the exec, copy and import streams.
const (
	// WindowSize is the gRPC HTTP/2 flow-control window in bytes, set explicitly
	// (grpc.InitialWindowSize and grpc.InitialConnWindowSize, which also turn off
	// gRPC's dynamic BDP window growth) on both the host and the plugin side, for
	// every stream and for the connection: 256 KiB.
	WindowSize = 256 << 10

	// ChunkSize is the largest payload in bytes of one stdin, stdout, stderr,
	// copy or import message: 32 KiB. Larger writes are split.
	ChunkSize = 32 << 10

	// grpcWriteQuota is grpc-go's per-stream send queue (defaultWriteQuota in
	// google.golang.org/grpc/internal/transport): a Send blocks once this many
	// bytes wait for flow-control window.
	grpcWriteQuota = 64 << 10

	// MaxBufferedBytes bounds, in bytes, the exec output that this bridge holds
	// between the driver's writer (ExecRequest.Stdout/Stderr in the plugin) and a
	// host writer that has stopped accepting: one WindowSize in flight on the
	// connection, grpc-go's 64 KiB send queue, the chunk that overshoots that
	// queue, and the chunk the host's receive goroutine is writing: 384 KiB.
	// Once that much is buffered, the driver's Write blocks, so the process in the
	// sandbox blocks after this much plus the driver's own buffering (for the
	// local driver through the agent: a 64 KiB pipe, one 32 KiB read chunk and the
	// agent's own window). Nothing grows with the output.
	MaxBufferedBytes = WindowSize + grpcWriteQuota + 2*ChunkSize
)

// Environment variables that Launch sets for the plugin process.
const (
	// envHostPID carries the host's pid, so Serve can tell when its host has gone
	// even if the host died before Serve set its parent-death signal.
	envHostPID = "BERTH_DRIVER_HOST_PID"
	// envLogLevel carries the host logger's level, so the plugin does not produce
	// lines that the host drops.
	envLogLevel = "BERTH_DRIVER_LOG_LEVEL"
)

// pluginSets returns the VersionedPlugins of both sides: protocol 1 with one
// gRPC plugin. srv is nil on the host.
func pluginSets(srv *server) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion: {PluginName: &driverPlugin{srv: srv}},
	}
}

// driverPlugin is the go-plugin GRPCPlugin of protocol 1.
type driverPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	srv *server
}

// GRPCServer registers the driver service (plugin side).
func (p *driverPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	p.srv.registered()
	driverpb.RegisterDriverServer(s, p.srv)
	return nil
}

// GRPCClient returns the host's handle on the service.
func (p *driverPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return &dispensed{api: driverpb.NewDriverClient(conn)}, nil
}

// dispensed is what the host's Dispense returns.
type dispensed struct {
	api driverpb.DriverClient
}
