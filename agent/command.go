package agent

import (
	"path"

	"github.com/berth-sh/berth/backend"
)

// SandboxCommand returns the argv that starts the agent as the first process of a
// sandbox with its own root filesystem, in which the driver has mounted
// AgentFiles.Dir read-only at backend.AgentMountDir and AgentFiles.SocketDir at
// backend.SocketMountDir: the agent binary at its in-sandbox path, then
// "agent serve --socket-dir /.berth/run". The agent takes the sandbox's token
// from its environment (TokenEnv: put TokenEnvEntry there, not on the command
// line). extra is appended (for example "--log", FILE,
// "--exec-user", USER, "--oom-counter", "auto", or "--subreaper" when the agent is not
// PID 1 of its own PID namespace).
func SandboxCommand(extra ...string) []string {
	argv := []string{path.Join(backend.AgentMountDir, backend.AgentBinaryName), "agent", "serve", "--socket-dir", backend.SocketMountDir}
	return append(argv, extra...)
}

// HostCommand returns the argv that starts the agent of files on the host side of
// the mounts (a driver whose sandbox shares the host's paths): files.Binary, then
// "agent serve --socket-dir" files.SocketDir, then extra.
func HostCommand(files backend.AgentFiles, extra ...string) []string {
	argv := []string{files.Binary, "agent", "serve", "--socket-dir", files.SocketDir}
	return append(argv, extra...)
}
