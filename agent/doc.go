// Package agent is berth's exec agent and its client.
//
// The agent is a small gRPC server (wire code in package agentpb) that runs inside
// every sandbox: PID 1 of a container, or a detached supervisor on the host for the
// local driver. It owns every process started in the sandbox and gives every driver
// the same exec semantics:
//
//   - one reaper owns every wait (a wait4(-1) loop); processes are started with
//     syscall.ForkExec while the reaper's lock is held, so even an exit that comes
//     before the pid is registered is never lost, and orphans reparented to the agent
//     are reaped too (no zombies);
//   - every exec runs in its own session (setsid; a TTY exec gets the terminal as its
//     controlling terminal) with a marker in its environment (BERTH_EXEC; a job's is
//     BERTH_JOB), and "the exec's process tree" is every process of that session, every
//     process that still carries the marker in the environment it was started with
//     (whatever session or process group it moved to), and the descendants of all of
//     these; a process that left the session, dropped its marker (env -i) and lost its
//     parent before the kill saw it is not (tree.go says exactly what is);
//   - timeout, cancel and a client that disappears kill that tree, and nothing of
//     another exec or job: SIGTERM to all of it, SIGKILL after at most one second of
//     grace, repeated until none remains; the result is sent only after the tree is
//     gone. An exec whose leader exits by itself kills nothing: its background
//     processes live on;
//   - an exec returns when its leader exits, after the output already in the pipes
//     has been sent; output that background children write later is read and
//     discarded, so they never get SIGPIPE;
//   - signals sent to the agent (kill -TERM 1 from inside a container) are caught and
//     dropped; OS threads are made in advance and blocking system calls are capped,
//     so pids exhaustion in the sandbox cannot crash it.
//
// Clients reach the agent through a backend.Dialer; DialSocketDir is the dialer of
// the built-in drivers (a unix socket reached through /proc/self/fd, so no link
// planted in the socket directory is followed and the 108-byte socket path limit does
// not apply). Install and PrepareSandbox put the agent binary in place for a sandbox.
package agent

import "time"

// ProtocolVersion is the agent protocol version this package speaks. Clients accept
// ProtocolVersion and ProtocolVersion-1 (down to 3); the agent answers Hello with the
// highest version both sides speak. Version 2 added shell mode; version 3 added the
// connection handshake with the sandbox's token (TokenFileName), made shell mode
// (Shell) and background jobs (StartJob, ListJobs, JobLogs, KillJob) calls of their
// own, and lets the agent report OOM kills and its default exec user itself. An
// agent of protocol 2 or older does not answer the handshake: the client reports it
// as an agent of an older berth, which a restart of the sandbox replaces.
const ProtocolVersion = 3

// ChunkSize is the largest piece of output, stdin or copy data, in bytes, that one
// protocol message carries.
const ChunkSize = 32 << 10

// StreamWindow is the gRPC flow-control window, in bytes, set explicitly (no dynamic
// window growth) on both sides for every stream (InitialWindowSize) and for the whole
// connection (InitialConnWindowSize).
//
// It bounds how much output is buffered between a process in the sandbox and a reader
// that pauses: the kernel pipe (64 KiB by default) + one ChunkSize read held by the
// agent + gRPC's per-stream send quota in the agent (64 KiB) + StreamWindow bytes in
// flight or queued in the client + one ChunkSize chunk being written by the client:
// 448 KiB per output stream. Past that, the process's write(2) blocks. Stdin is bounded
// the same way in the other direction.
const StreamWindow = 256 << 10

// DefaultGrace is how long a process tree gets between SIGTERM and SIGKILL when an
// exec times out, is cancelled or loses its client, and the default of Shutdown.
const DefaultGrace = time.Second

// AgentEnvPrefix starts the environment variables that configure the agent itself;
// they are removed from the environment of every exec.
const AgentEnvPrefix = "BERTH_AGENT_"
