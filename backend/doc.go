// Package backend is berth's driver contract: the TerminalBackend interface that every
// runtime driver (local, docker, containerd, third-party plugins) implements, and the
// types that cross it: sandbox specs and status, exec requests and results,
// capabilities, typed errors and label keys.
//
// The package follows the shape of database/sql/driver: a small required interface
// (TerminalBackend) plus optional interfaces that a host finds by type assertion:
//
//   - Configurer: the driver takes a `driver "NAME" {}` block (ConfigSchema,
//     Configure) and its state dir;
//   - Execer: plain execs through the driver, for drivers whose sandboxes run no
//     berth agent (Capabilities.Agent AgentNone);
//   - Copier: copy in and out through the driver, for the same drivers;
//   - AgentDialer: the host reaches a sandbox's agent through a stream the driver
//     opens (required with Capabilities.Agent AgentDial);
//   - Validator: a spec is checked as Create would, without creating anything;
//   - ImagePuller, ImageImporter: images are pulled, or loaded from an archive;
//   - Forwarder: the value stands for a driver elsewhere (the plugin client) and
//     has every method; its Info says which the driver behind it implements.
//
// Capabilities carries what a host cannot see in a type (isolation, limits, network
// modes, how the agent is reached) as the driver declares it, and the flags that
// restate an interface (Config, Copy, ImagePull, ImageImport, AgentDial, Validate),
// which InfoOf derives from the driver's type in one place, so that one Info
// call, here or across the plugin protocol, tells a host everything. Policy (session names, scope rules, retention, the state store) lives in the
// registry package above; a driver only creates, finds, stops and removes sandboxes
// and runs execs in them.
//
// backend imports nothing of the project and only the standard library.
package backend
