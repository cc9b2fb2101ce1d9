package agent

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
)

// A fatal start-up error goes to the log file too, not only to stderr (which is
// /dev/null under containerd).
func TestStartErrorInLog(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, backend.AgentSocketName), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "agent.log")
	cmd := exec.Command(agentBin, "serve", "--socket-dir", dir, "--log", logPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		t.Fatal("the agent started beside a file in the way of its socket")
	}
	b, _ := os.ReadFile(logPath)
	if !strings.Contains(string(b), "is not a socket") {
		t.Errorf("agent log %q lacks the start-up error (stderr: %q)", b, stderr.String())
	}
}

// When the Go runtime itself dies (here: it cannot make the threads it makes in
// advance, under a pids limit far below containerutil.MinPids), its report is in the
// log file, not only on stderr.
func TestRuntimeCrashInLog(t *testing.T) {
	procs := filepath.Join(pidsCgroup(t, 12), "cgroup.procs")
	dir := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "agent.log")
	// The shell moves itself into the cgroup, then becomes the agent, so every thread
	// of the agent counts against the limit from the start.
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$1" && exec "$2" serve --socket-dir "$3" --log "$4"`, "sh", procs, agentBin, dir, logPath)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		t.Fatal("the agent served under a pids limit of 12")
	}
	if !strings.Contains(stderr.String(), "fatal error") {
		t.Skipf("the agent did not die in the Go runtime (stderr %q)", stderr.String())
	}
	// The runtime copies its report from the stack trace on ("fatal error: ..." and
	// the line before it go to stderr only).
	b, _ := os.ReadFile(logPath)
	if !strings.Contains(string(b), "runtime stack:") || !strings.Contains(string(b), "runtime.newosproc") {
		t.Errorf("agent log %q lacks the runtime's crash report (stderr: %.300q)", b, stderr.String())
	}
}
