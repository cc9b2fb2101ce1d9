package conformance

import (
	"errors"
	"path/filepath"
	"sync"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

// DefaultPrepareAgent returns the PrepareAgent that Options uses when it has none: it
// installs binary (a static berth) into stateDir with agent.Install, once per state
// dir, and prepares stateDir/sandboxes/NAME with agent.PrepareSandbox, the layout the
// registry uses. It is safe for concurrent use. An empty binary makes every call fail
// with an error that says to set Options.AgentBinary.
func DefaultPrepareAgent(binary string) func(stateDir, sandboxName string) (backend.AgentFiles, error) {
	var mu sync.Mutex
	installed := map[string]agent.Binary{}
	return func(stateDir, sandboxName string) (backend.AgentFiles, error) {
		if binary == "" {
			return backend.AgentFiles{}, errors.New("conformance: Options.AgentBinary is empty: set it to a static berth-cli, berth's full binary (CGO_ENABLED=0 go build -o DIR/ ./cmd/berth-cli), or set Options.PrepareAgent")
		}
		mu.Lock()
		bin, ok := installed[stateDir]
		if !ok {
			var err error
			bin, err = agent.Install(stateDir, binary)
			if err != nil {
				mu.Unlock()
				return backend.AgentFiles{}, err
			}
			installed[stateDir] = bin
		}
		mu.Unlock()
		return agent.PrepareSandbox(filepath.Join(stateDir, "sandboxes", sandboxName), bin)
	}
}
