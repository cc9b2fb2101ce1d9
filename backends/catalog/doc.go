// Package catalog is the one catalog of the drivers that ship with berth (Builtins:
// each one's config name and how it is served out of process, Command) and the
// discovery of third-party driver executables, berth-driver-NAME (SearchPath,
// Discover, FindPlugin), with their sha256 pins (VerifySHA256). It links no plugin
// or gRPC code, so config reads the built-in names without the plugin host; package
// backends launches what it finds.
package catalog
