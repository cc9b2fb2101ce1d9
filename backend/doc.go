// Package backend is berth's driver contract: the TerminalBackend interface that every
// runtime driver (local, docker, containerd, third-party plugins) implements, and the
// types that cross it: sandbox specs and status, exec requests and results,
// capabilities, typed errors and label keys.
//
// The package follows the shape of database/sql/driver: a small required interface
// plus optional interfaces (Configurer, Copier, ImagePuller, ImageImporter), each also
// announced in Capabilities so a host can learn what a driver supports with one Info
// call. Policy (session names, scope rules, retention, the state store) lives in the
// registry package above; a driver only creates, finds, stops and removes sandboxes
// and runs execs in them.
//
// backend imports nothing of the project and only the standard library.
package backend
