// Command agentmain is the agent as a stand-alone program, for the package's tests.
package main

import (
	"os"

	"github.com/berth-sh/berth/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:])) }
