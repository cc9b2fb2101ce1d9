package agent

import (
	"bytes"
	"errors"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// An exec's or a job's process tree, as a kill takes it.
//
// Every exec and every job runs in a session of its own, and its environment carries
// a marker, NAME=INSTANCE.N (execMarkerVar or jobMarkerVar, INSTANCE the agent's
// random instance id, N unique in the agent), which its descendants inherit. When an
// exec's timeout passes, it is cancelled or its client goes away, or a job is killed,
// killTree rescans /proc until none is left of the tree, which is every process that
//
//   - is in the exec's (job's) session;
//   - carries its marker in the environment it was started with (read from
//     /proc/PID/environ: its first maxEnvironScan bytes), whatever session or
//     process group it moved to (setsid, setpgid);
//   - descends (by parent pid, at a scan) from a process of the tree, so a child
//     whose parent is still there is taken even when it dropped the marker; or
//   - was taken at an earlier scan of the same kill (by pid and start time), even
//     when it has been reparented to the agent since.
//
// The agent reads another user's environment as that user (openEnviron): in a
// container it is root without CAP_SYS_PTRACE, which Linux requires to read the
// environment of a process of another user, and execs may run as any user.
//
// The limits: a process that left the session, dropped or overwrote its marker
// (`env -i`, a new environment at execve, its own memory rewritten) and whose parent
// had gone before a scan saw it, or whose environment the agent may not read (a
// setuid program, whose real and effective users differ, with an agent that lacks
// CAP_SYS_PTRACE), is not the tree's;
// it lives until the sandbox stops (Shutdown takes every descendant of the agent). A
// process that fakes another tree's marker only gets itself killed with that tree.
// Nothing else is taken: the marker names one exec or job, and the other rules start
// from the tree's own processes. Only a kill reads markers: when an exec's leader
// exits by itself, its background processes live on.

// execMarkerVar is set in every exec's environment (see the comment above).
const execMarkerVar = "BERTH_EXEC"

// jobMarkerVar is set in every job's environment (see the comment above).
const jobMarkerVar = "BERTH_JOB"

// maxEnvironScan bounds how much of a process's environment a kill reads looking for
// a marker, in bytes.
const maxEnvironScan = 256 << 10

// treeMarker returns a new marker NAME=INSTANCE.N of this agent for variable name.
func (s *server) treeMarker(name string, n uint64) string {
	return name + "=" + s.instance + "." + strconv.FormatUint(n, 10)
}

// withMarker returns env without any entry of marker's variable, with marker
// appended: a variable of that name in the agent's or the request's environment
// cannot hide the marker from the processes that read the first or the last entry
// of a name.
func withMarker(env []string, marker string) []string {
	k, _, _ := strings.Cut(marker, "=")
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if n, _, _ := strings.Cut(kv, "="); n != k {
			out = append(out, kv)
		}
	}
	return append(out, marker)
}

// procKey names one process: its pid and start time.
type procKey struct {
	pid   int
	start uint64
}

// treeOf returns killTree's selection of the tree of the exec or job whose session
// is sid and whose marker is marker (the rules in the comment above). The selection
// remembers what it took and what it read across the scans of one kill, so each
// process's environment is read once it says something: an environment that reads
// empty (a process between fork and execve, whose new image has not set it up yet)
// is read again at the next scan, never taken as unmarked for good: a fork bomb's
// child caught so escaped the kill once its parent died.
func (s *server) treeOf(sid int, marker string) func([]procInfo) []procInfo {
	want := []byte("\x00" + marker + "\x00")
	taken := map[procKey]bool{}
	marked := map[procKey]bool{}
	return func(all []procInfo) []procInfo {
		out := withDescendants(all, func(p procInfo) bool {
			k := procKey{p.pid, p.start}
			if p.sid == sid || taken[k] {
				return true
			}
			if p.state == 'Z' {
				return false // no environment left to read
			}
			m, ok := marked[k]
			if !ok {
				var sure bool
				s.blk.enter()
				m, sure = environHas(p.pid, want)
				s.blk.leave()
				if sure {
					marked[k] = m
				}
			}
			return m
		})
		for _, p := range out {
			taken[procKey{p.pid, p.start}] = true
		}
		return out
	}
}

// withDescendants returns the processes of all that root picks and every process
// that descends from one of them (by parent pid, within all), each once.
func withDescendants(all []procInfo, root func(procInfo) bool) []procInfo {
	children := map[int][]procInfo{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
	}
	picked := map[int]bool{}
	var out, stack []procInfo
	for _, p := range all {
		if !picked[p.pid] && root(p) {
			picked[p.pid] = true
			out = append(out, p)
			stack = append(stack, p)
		}
	}
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, c := range children[p.pid] {
			if !picked[c.pid] {
				picked[c.pid] = true
				out = append(out, c)
				stack = append(stack, c)
			}
		}
	}
	return out
}

// environHas reports whether the first maxEnvironScan bytes of process pid's
// environment hold want, a NUL-framed "\x00NAME=VALUE\x00" (the first entry is
// matched as if a NUL came before it). sure is false when the answer may change:
// the environment could not be opened or read nothing (a process between fork and
// execve reads empty; so does one that is exiting), or reading it failed midway.
func environHas(pid int, want []byte) (has, sure bool) {
	f, err := openEnviron(pid)
	if err != nil {
		return false, false
	}
	defer f.Close()
	keep := len(want) - 1
	buf := make([]byte, 32<<10+keep)
	buf[0] = 0
	have := 1 // bytes at the front of buf carried over: the NUL before the first entry
	for read := 0; read < maxEnvironScan; {
		n, err := f.Read(buf[have:min(len(buf), have+maxEnvironScan-read)])
		read += n
		if bytes.Contains(buf[:have+n], want) {
			return true, true
		}
		if err != nil || n == 0 {
			if read == 0 {
				return false, false // nothing to read yet (mid-execve), or gone
			}
			return err == io.EOF && bytes.HasSuffix(buf[:have+n], want[:len(want)-1]), err == io.EOF || err == nil
		}
		end := have + n
		have = min(keep, end)
		copy(buf, buf[end-have:end])
	}
	return false, true
}

// openEnviron opens /proc/PID/environ: as the agent, and when Linux refuses that
// (EACCES: the process is another user's and the agent lacks CAP_SYS_PTRACE, as in a
// container), again with this thread's filesystem user and group (setfsuid,
// setfsgid) set to the owner of /proc/PID, which is the process's effective user and
// group while it is dumpable: the ptrace access check of the open then sees the
// process's own user. The ids are set back before the thread is unlocked (setting
// them back cannot fail: the agent keeps CAP_SETUID and CAP_SETGID, which a
// filesystem id does not drop); were they ever left changed, the thread would stay
// locked to the calling goroutine, so that no other goroutine runs with them. Only
// the thread that opens changes ids: no thread is made (pids may be exhausted when a
// kill runs).
func openEnviron(pid int) (*os.File, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	f, err := os.Open(dir + "/environ")
	if !errors.Is(err, syscall.EACCES) {
		return f, err
	}
	fi, serr := os.Stat(dir)
	if serr != nil {
		return nil, err
	}
	sys, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || (sys.Uid == uint32(os.Geteuid()) && sys.Gid == uint32(os.Getegid())) {
		return nil, err
	}
	runtime.LockOSThread()
	prevG, _ := unix.SetfsgidRetGid(int(sys.Gid))
	prevU, _ := unix.SetfsuidRetUid(int(sys.Uid))
	f, err = os.Open(dir + "/environ")
	unix.SetfsuidRetUid(prevU)
	unix.SetfsgidRetGid(prevG)
	// The calls return the id before them whether or not they changed it; an id
	// that is not valid (-1) asks for the current one without a change.
	if u, _ := unix.SetfsuidRetUid(-1); u == prevU {
		if g, _ := unix.SetfsgidRetGid(-1); g == prevG {
			runtime.UnlockOSThread()
		}
	}
	return f, err
}
