package agent

import (
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A container driver hands the agent its token in the environment of the
// container's first process (TokenEnv), the one way every runtime offers that puts
// nothing in the sandbox's files. Removing the variable from the Go runtime's copy
// (os.Unsetenv) does not change the kernel's copy: /proc/PID/environ shows the
// environment block the process was started with for as long as the process lives.
// So the agent starts itself again first (reexecWithoutToken): the same executable,
// the same arguments plus --token-fd, the environment less TokenEnv, and the token on
// a pipe it reads and closes. The new program's environment block never held the
// token, and the old one went with the old program's memory. No other process of the
// sandbox exists yet: they all come from the agent, after it serves.
//
// Its memory still holds the token (it checks every connection against it), which
// /proc/PID/mem would show to the processes that may ptrace it: its own user, root
// in a container included. The agent makes itself non-dumpable (hideSelf), after
// which only a process with CAP_SYS_PTRACE may read its memory, environment, file
// descriptors and the like; berth's containers drop that capability.

// tokenFDFlag is the flag through which the agent started again reads its token.
const tokenFDFlag = "--token-fd"

// reexecWithoutToken starts the running executable (os.Executable, else
// /proc/self/exe) again in this process with argv, the environment less TokenEnv, and argv's flags followed by
// tokenFDFlag naming a pipe that holds tok (hex and a newline). It returns only when
// it could not (the caller then serves as it is, its environment block still
// holding the token: see hideSelf).
func reexecWithoutToken(argv []string, tok []byte) error {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("pipe: %w", err)
	}
	defer unix.Close(p[0])
	// 65 bytes: far below a pipe's capacity, so the write does not block.
	_, err := unix.Write(p[1], []byte(hex.EncodeToString(tok)+"\n"))
	unix.Close(p[1])
	if err != nil {
		return fmt.Errorf("pipe: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETFD, 0); err != nil {
		return fmt.Errorf("pipe: %w", err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, TokenEnv+"=") {
			env = append(env, kv)
		}
	}
	args := append(append([]string(nil), argv...), tokenFDFlag, strconv.Itoa(p[0]))
	// By its path, so that the process's name (/proc/PID/comm, what ps shows) stays
	// the executable's, not "exe"; /proc/self/exe when that path is gone.
	if self, err := os.Executable(); err == nil {
		unix.Exec(self, args, env)
	}
	err = unix.Exec("/proc/self/exe", args, env)
	return fmt.Errorf("starting %s again without $%s: %w", argv[0], TokenEnv, err)
}

// readTokenFD reads the token from the pipe fd that reexecWithoutToken made, and
// closes it.
func readTokenFD(fd int) ([]byte, error) {
	src := fmt.Sprintf("on %s %d", tokenFDFlag, fd)
	f := os.NewFile(uintptr(fd), "token-fd")
	if f == nil {
		return nil, fmt.Errorf("agent token %s: not open", src)
	}
	defer f.Close()
	unix.CloseOnExec(fd)
	b, err := io.ReadAll(io.LimitReader(f, handshakeMax))
	if err != nil {
		return nil, fmt.Errorf("agent token %s: %w", src, err)
	}
	return parseToken(src, string(b))
}

// hideSelf makes the agent non-dumpable (PR_SET_DUMPABLE 0): Linux (and gVisor)
// then give its /proc/PID/mem, environ, maps, fd and the like only to processes
// with CAP_SYS_PTRACE, not to its own user (root in a container). The processes it
// starts are dumpable again once they exec a program (as Linux sets it at execve).
// The local driver's agents stay dumpable: their token is in a file of their own
// user anyway, and the local driver finds them by their environment.
func hideSelf() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("PR_SET_DUMPABLE: %w", err)
	}
	return nil
}
