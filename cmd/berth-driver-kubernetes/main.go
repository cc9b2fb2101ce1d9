// Command berth-driver-kubernetes serves berth's kubernetes driver (package
// kubernetes) as a plugin: berth launches it through go-plugin for every command
// that needs the driver, as it launches third-party drivers. It is its own
// executable so that the berth binary links no client-go (whose package
// initialisation would otherwise slow every berth command); berth looks for it
// beside itself first, then in the plugin search path ($BERTH_PLUGIN_PATH,
// plugin_dirs). Build it static, beside berth:
//
//	CGO_ENABLED=0 go build -o DIR/ ./cmd/...
//
// `berth-driver-kubernetes describe` prints the driver's name, version, protocol
// versions, capabilities and config schema as JSON (see backends.Main).
package main

import (
	"os"

	"github.com/berth-sh/berth/backends"
	"github.com/berth-sh/berth/kubernetes"
)

func main() { os.Exit(backends.Main(kubernetes.New())) }
