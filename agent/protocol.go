package agent

import (
	"fmt"
	"slices"
)

// serverVersions are the protocol versions the agent speaks, highest first: N and
// N-1, so that a host one version behind still reaches a newer agent.
var serverVersions = clientVersions()

// minProtocol is the oldest protocol a Client speaks: agents before 3 know neither
// the connection handshake nor the typed shell and job calls, and are reported as
// agents of an older berth (restart the sandbox to give it the current agent).
const minProtocol = 3

// clientVersions are the protocol versions a Client accepts: N and N-1, down to
// minProtocol.
func clientVersions() []int {
	v := []int{ProtocolVersion}
	if ProtocolVersion-1 >= minProtocol {
		v = append(v, ProtocolVersion-1)
	}
	return v
}

// pickProtocol returns the highest version in both lists, or an error that names
// both lists when there is none.
func pickProtocol(client, server []int) (int, error) {
	best := 0
	for _, v := range client {
		if v > best && slices.Contains(server, v) {
			best = v
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("no common agent protocol version: the agent speaks %v, the client speaks %v; use the same berth version for the host and the agent binary (agent_path)", server, client)
	}
	return best, nil
}
