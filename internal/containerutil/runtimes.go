package containerutil

import (
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/berth-sh/berth/backend"
)

// Capabilities are the capabilities of a sandbox of the built-in container drivers
// (docker, containerd) under the engine's default runtime (runc), with networkModes
// (copied) as their network modes: an image's own filesystem, its own PIDs, TTY, CPU,
// memory and pids limits, dropped capabilities, stop and start, exec users, and the
// agent reached by its socket. The flags that restate an optional interface (copy,
// image pull and import, config, Validate) are derived by backend.InfoOf.
func Capabilities(networkModes []string) backend.Capabilities {
	return backend.Capabilities{
		FSIsolation:      backend.FSIsolationImage,
		PIDIsolation:     true,
		NetworkModes:     slices.Clone(networkModes),
		TTY:              true,
		Agent:            backend.AgentSocket, // the host reaches the agent itself
		CPULimit:         true,
		MemoryLimit:      true,
		PidsLimit:        true,
		DropCapabilities: true,
		StopStart:        true,
		ExecUser:         true,
	}
}

// IsGVisor reports whether an OCI runtime is gVisor's runsc, by the name it is
// registered under or the base name of its binary (or wrapper): "runsc", or one
// that starts with "runsc" ("runsc-berth", "runsc-systrap"). A runtime is told
// apart by name because neither Docker Engine nor the runc shim says what a
// runtime binary is; docs/gvisor.md asks that runsc be registered so.
func IsGVisor(name, path string) bool {
	return strings.HasPrefix(name, "runsc") || strings.HasPrefix(filepath.Base(path), "runsc")
}

// RuntimeCaps returns the Capabilities.Runtimes entry of the OCI runtime name
// (whose binary or wrapper is path, "" when unknown) on a driver whose sandboxes
// otherwise have base. A runtime other than gVisor is taken to share the host's
// kernel as runc does and gets base. gVisor (IsGVisor) gets base with what it
// lacks turned off, each for a reason measured on runsc (docs/gvisor.md):
//
//   - MemoryLimit off: the limit is the host cgroup's, charged to the whole
//     sandbox (the Sentry and its memory file), and gVisor has no OOM killer of
//     its own, so at the limit the host kills the Sentry, taking the agent and every
//     process with it, rather than one exec ending with 137 and an OOM flag;
//   - PidsLimit off: gVisor's own pids controller is not fed from the OCI spec's
//     pids limit, and the host cgroup's counts the Sentry's threads, not the
//     sandbox's processes, so a fork bomb is not held to the limit.
//
// The copy of base shares no slices with it.
func RuntimeCaps(base backend.Capabilities, name, path string) backend.RuntimeCapabilities {
	c := base
	c.Runtimes = nil
	c.NetworkModes = slices.Clone(base.NetworkModes)
	rc := backend.RuntimeCapabilities{Name: name, Kernel: backend.KernelHost}
	if IsGVisor(name, path) {
		rc.Kernel = backend.KernelGVisor
		c.MemoryLimit = false
		c.PidsLimit = false
	}
	rc.Capabilities = c
	return rc
}

// RuntimesCaps returns the Capabilities.Runtimes of a driver whose engine knows the
// runtimes in paths (name → binary path, "" when unknown), without the default
// runtime dflt, sorted by name: RuntimeCaps of each.
func RuntimesCaps(base backend.Capabilities, paths map[string]string, dflt string) []backend.RuntimeCapabilities {
	names := make([]string, 0, len(paths))
	for n := range paths {
		if n != dflt {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []backend.RuntimeCapabilities
	for _, n := range names {
		out = append(out, RuntimeCaps(base, n, paths[n]))
	}
	return out
}
