// Package drivers is the in-process catalog of berth's built-in drivers: local,
// docker, containerd and kubernetes, each by its config name with its constructor. A Go program
// that runs them inside its own process (a library user's registry, a test) takes
// them from here:
//
//	for _, d := range drivers.Catalog {
//		opts = append(opts, registry.WithDriver(d.Name, d.New))
//	}
//
// and the driver executables built from this module (cmd/berth-driver-docker,
// cmd/berth-driver-containerd, cmd/berth-driver-kubernetes) serve their entry with backends.Main.
//
// Importing this package links every driver's runtime SDK (the Docker Engine client,
// containerd's client, client-go). The berth CLI therefore does not import it: it has only local
// in process, and runs docker and containerd as their own executables, which
// package catalog (backends/catalog) (catalog.Builtins) says how to find. Imports go one way:
// this package imports the drivers; no driver, and nothing of the CLI, imports it.
package drivers

import (
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/containerd"
	"github.com/berth-sh/berth/docker"
	"github.com/berth-sh/berth/kubernetes"
	"github.com/berth-sh/berth/local"
)

// Driver is one built-in driver.
type Driver struct {
	// Name is the driver's config name; it is also an entry of catalog.Builtins
	// and the Name its Info reports.
	Name string
	// New returns a new, unconfigured driver with its defaults (configure it with
	// backend.Configurer.Configure, or let a registry do so).
	New func() backend.TerminalBackend
}

// Catalog lists the built-in drivers in the order of catalog.Builtins. Do not modify
// it.
var Catalog = []Driver{
	{Name: local.Name, New: func() backend.TerminalBackend { return local.New() }},
	{Name: docker.Name, New: func() backend.TerminalBackend { return docker.New() }},
	{Name: containerd.Name, New: func() backend.TerminalBackend { return containerd.New() }},
	{Name: kubernetes.Name, New: func() backend.TerminalBackend { return kubernetes.New() }},
}

// Lookup returns the entry of Catalog called name, and whether there is one.
func Lookup(name string) (Driver, bool) {
	for _, d := range Catalog {
		if d.Name == name {
			return d, true
		}
	}
	return Driver{}, false
}
