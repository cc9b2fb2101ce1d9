// Package catalog is the one catalog of the drivers that ship with berth (Builtins:
// each one's config name and how it is served out of process, Command) and the
// discovery of third-party driver executables, berth-driver-NAME (SearchPath,
// Discover, FindPlugin), with their sha256 pins (VerifySHA256), and the
// constructors of the drivers a program links (Register, Linked: each built-in
// driver's package registers itself in its init, as database/sql drivers do). It links no plugin
// or gRPC code, so config reads the built-in names without the plugin host; package
// backends launches what it finds.
package catalog
