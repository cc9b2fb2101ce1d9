// Package backends is how berth reaches drivers out of process: the
// hashicorp/go-plugin (v1.8) handshake, protocol version 2 (ProtocolVersion)
// negotiated with VersionedPlugins over gRPC only (wire code in
// backends/internal/driverpb, generated from driver.proto there), Serve for driver
// plugin processes, Launch and Client for hosts. The catalog of built-in drivers
// (local served by the berth binary, docker, containerd and kubernetes by their own
// executables) and the discovery of berth-driver-NAME executables are package
// catalog (backends/catalog), which links no plugin code. Error kinds cross the wire as gRPC status codes through the one mapping
// in internal/rpcerr, shared with the agent protocol.
//
// A plugin process calls Serve with its backend.TerminalBackend. Serve never
// writes to stdout after the handshake line, logs go-hclog JSON on stderr (the
// host routes it into its own hclog.Logger, never into a command's output),
// reads nothing from stdin (it is /dev/null), and watches for its host's death:
// when the host goes away it cancels every in-flight call, so drivers kill the
// process trees of running execs, and exits.
//
// A host calls Launch, which starts the plugin in its own process group with
// stdin from /dev/null (so a terminal's SIGINT and keyboard never reach it),
// checks the handshake and returns a *Client that implements
// backend.TerminalBackend and the optional backend.Configurer, backend.Copier,
// backend.ImagePuller and backend.ImageImporter by forwarding each call.
//
// Exec is one bidirectional gRPC stream per process: setup, stdin chunks, stdin
// close, resizes and signals go in, in call order; started, stdout and stderr
// chunks and the result come out. The gRPC flow-control windows are fixed at
// WindowSize on both sides, so a host writer that blocks stops the process in
// the sandbox after at most MaxBufferedBytes of buffering in this bridge (plus
// whatever the driver itself holds).
package backends
