// Command berth gives every terminal session its own execution environment on a runtime
// chosen per session scope in config: the host (local), Docker, containerd or a
// third-party driver plugin.
//
// The same binary is also re-executed as the local driver's plugin process (`berth
// driver serve local`, hidden) and, under the name berth-agent or as `berth agent
// ...` (hidden), as the exec agent inside every sandbox. The docker and containerd
// drivers are their own executables (cmd/berth-driver-docker,
// cmd/berth-driver-containerd), found beside this one, so that berth links no
// runtime SDK.
package main

import (
	"os"

	"github.com/berth-sh/berth/backends/agent"
	"github.com/berth-sh/berth/internal/phase"
	"github.com/berth-sh/berth/internal/sigstart" // catches SIGINT, SIGTERM, SIGHUP from the start
)

// Exit codes of berth itself; every other code is the command's.
const (
	exitTimeout  = 124 // the exec timed out (as timeout(1))
	exitInternal = 125 // berth itself failed or was used wrongly
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
	if os.Getenv(envTrace) != "" {
		phase.Enable()
		phase.Mark("main")
	}
	code := run(os.Args[1:])
	// A run that reached no command (help, a usage error) neither took nor released
	// the early signals: one that came meanwhile ends berth now, as it would have.
	sigstart.Release()
	phase.Report(os.Stderr)
	os.Exit(code)
}

// envTrace, when set, makes berth print when it reached each phase of its work to
// stderr at the end ("phase NAME UNIX-NANOS" lines; see internal/phase): a
// developer's setting, for the breakdown of a command's time.
const envTrace = "BERTH_TRACE"
