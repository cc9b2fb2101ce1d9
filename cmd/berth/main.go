// Command berth gives every terminal session its own execution environment on a runtime
// chosen per session scope in config: the host (local), Docker, containerd or a
// third-party driver plugin.
//
// The same binary is also re-executed as the built-in drivers' plugin process
// (`berth driver serve NAME`, hidden) and, under the name berth-agent or as
// `berth agent ...` (hidden), as the exec agent inside every sandbox.
package main

import (
	"os"
	"path/filepath"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/agent"
)

// Exit codes of berth itself; every other code is the command's.
const (
	exitTimeout  = 124 // the exec timed out (as timeout(1))
	exitInternal = 125 // berth itself failed or was used wrongly
)

func main() {
	// The agent runs as PID 1 in containers: dispatch before anything else is set up.
	if filepath.Base(os.Args[0]) == backend.AgentBinaryName {
		os.Exit(agent.Main(os.Args[1:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		os.Exit(agent.Main(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}
