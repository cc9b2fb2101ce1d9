// Command berth-driver-bwrap is a berth driver that runs every sandbox in its own
// bubblewrap (bwrap) container, written only against berth's public driver SDK, as a
// third party would write one.
//
// Install it as an executable named berth-driver-bwrap in a directory of
// $BERTH_PLUGIN_PATH, in one of the config's plugin_dirs, or beside the berth binary,
// and use driver = "bwrap" in a scope rule. `berth-driver-bwrap describe` prints its
// name, version, protocol versions, capabilities and config schema as JSON.
package main

import (
	"os"

	"github.com/berth-sh/berth/backends"
)

func main() { os.Exit(backends.Main(New())) }
