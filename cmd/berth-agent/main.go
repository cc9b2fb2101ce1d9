// Command berth-agent is berth's exec agent alone: the same agent as `berth agent`
// (package agent), without the CLI, the registry and the drivers' SDKs
// linked in. Point config's agent_path at a static build of it to run it in every
// sandbox instead of the berth binary:
//
//	CGO_ENABLED=0 go build -o /usr/local/lib/berth/berth-agent ./cmd/berth-agent
//	agent_path = "/usr/local/lib/berth/berth-agent"
//
// It is about half the berth binary's size and, idle in a sandbox, uses ~1.5 MB less
// private memory (no package initialisation of the SDKs), which matters with
// hundreds of idle sandboxes (docs/performance.md, "Density"). Build it from the same
// checkout as berth: host and agent must speak a common agent protocol. It is
// installed under its content hash like any agent_path binary, so replacing it
// upgrades each sandbox's agent when the sandbox next starts.
//
// It takes the arguments of `berth agent` (with or without the leading "agent").
package main

import (
	"os"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/internal/sigstart"
	_ "github.com/berth-sh/berth/internal/sigstart/early" // catches SIGINT, SIGTERM, SIGHUP from the start
)

func main() {
	// As in cmd/berth-cli: a signal that came before the agent set up its own handling
	// stays caught, and so dropped, rather than given its default action.
	sigstart.Take()
	os.Exit(agent.Main(os.Args[1:]))
}
