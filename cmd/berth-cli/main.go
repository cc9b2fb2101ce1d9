// Command berth-cli is berth's full command line (package cli's commands):
// the berth executable is a thin front (cmd/berth) that runs a plain `berth exec`
// through a running berth serve itself and hands every other command line to this
// one, found beside it, in its own place (execve).
//
// The same binary is also re-executed as the local driver's plugin process (`berth
// driver serve local`, hidden) and, under the name berth-agent or as `berth agent
// ...` (hidden), as the exec agent inside every sandbox: it is the berth binary of
// package registry (registry.WithBerthBinary), the default agent_path. The docker,
// containerd and kubernetes drivers are their own executables
// (cmd/berth-driver-NAME), and so is the HTTP API's server (cmd/berth-serve, which
// `berth serve` runs), found beside this one, so that it links no runtime SDK and
// no Prometheus and starts fast.
package main

import (
	"os"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/cli"
	"github.com/berth-sh/berth/internal/sigstart"
	_ "github.com/berth-sh/berth/internal/sigstart/early" // catches SIGINT, SIGTERM, SIGHUP from the start
)

func main() {
	// The agent runs as PID 1 in containers: dispatch before anything else is set up.
	if agent.IsAgent() {
		// The agent catches and drops these signals itself (it must stay up, as a
		// container's PID 1 too): one that came before it has set that up is kept
		// caught here, and so dropped, rather than given its default action.
		sigstart.Take()
		os.Exit(agent.Main(os.Args[1:]))
	}
	os.Exit(cli.Main(os.Args[1:]))
}
