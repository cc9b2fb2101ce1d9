// Command tlocal is a third-party driver plugin for the CLI's tests, written the way
// a driver author writes one: the local driver under the name "tlocal", served with
// backends.Main (so it also answers "describe").
//
// Run under the name berth-driver-tdial it is the driver "tdial": the same local
// sandboxes, whose agents the host reaches only through the plugin
// (Capabilities.Agent = AgentDial, as the Kubernetes driver's), so every exec's
// stream runs through the plugin process.
package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/local"
)

type driver struct {
	*local.Driver
	name string
}

func (d driver) Info(ctx context.Context) (backend.Info, error) {
	info, err := d.Driver.Info(ctx)
	info.Name, info.Version = d.name, "0.0.1-test"
	if d.name == "tdial" {
		info.Capabilities.Agent = backend.AgentDial
	}
	return info, err
}

func main() {
	name := "tlocal"
	if filepath.Base(os.Args[0]) == "berth-driver-tdial" {
		name = "tdial"
	}
	os.Exit(backends.Main(driver{local.New(), name}))
}
