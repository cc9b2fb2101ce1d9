package agent

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OOMCounterAuto, as ServeOptions.OOMCounter (--oom-counter auto), makes the agent
// find its own cgroup's OOM-kill counter (see findOOMCounter).
const OOMCounterAuto = "auto"

// oomWatch reads the OOM-kill counter of the agent's cgroup, so that an exec's result
// says whether the kernel killed a process of the sandbox for lack of memory while
// it ran (ExecResult.oom_killed). It needs no runtime call: the counter is a file,
// kept open and read again from its start (pread) before and after every exec, which
// costs one system call rather than an open, a read and a close of a cgroup file
// (7 % of the agent's CPU per exec of `true` before).
type oomWatch struct {
	f *os.File // nil when there is none
}

// newOOMWatch returns the watch for spec: "" (none), OOMCounterAuto or a counter
// file's path. A counter that cannot be read is no watch.
func newOOMWatch(spec string) oomWatch {
	path := spec
	if spec == OOMCounterAuto {
		path = findOOMCounter()
	}
	if path == "" {
		return oomWatch{}
	}
	f, err := os.Open(path)
	if err != nil {
		return oomWatch{}
	}
	w := oomWatch{f: f}
	if w.count() < 0 {
		f.Close()
		return oomWatch{}
	}
	return w
}

// on reports whether the watch has a counter.
func (w oomWatch) on() bool { return w.f != nil }

// count returns the counter's value, or -1 without one (or when it cannot be read).
func (w oomWatch) count() int64 {
	if w.f == nil {
		return -1
	}
	var buf [4096]byte
	n, err := w.f.ReadAt(buf[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return -1
	}
	return parseOOMCount(buf[:n])
}

// grew reports whether the counter is past before (a count from count).
func (w oomWatch) grew(before int64) bool {
	return before >= 0 && w.count() > before
}

// findOOMCounter finds the counter of the agent's own memory cgroup as the agent sees
// the cgroup filesystem: cgroup v1's memory.oom_control or cgroup v2's
// memory.events (see cgroupFiles). "" when there is none.
func findOOMCounter() string {
	for _, c := range cgroupFiles("memory", "memory.oom_control", "memory.events") {
		if readOOMCount(c) >= 0 {
			return c
		}
	}
	return ""
}

// cgroupFiles lists where the agent may find a file of its own cgroup for the
// controller v1ctl, in the order to try: cgroup v1's v1file in that controller's
// hierarchy, then cgroup v2's v2file; each first at the path /proc/self/cgroup names
// (the host's view, or a container that sees the whole hierarchy), then at the
// mount's root (a container's view of its own cgroup: runc mounts the container's
// cgroup there). Nil when /proc/self/cgroup cannot be read.
func cgroupFiles(v1ctl, v1file, v2file string) []string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	var v1, v2 []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2 = append(v2, filepath.Join("/sys/fs/cgroup", f[2], v2file), filepath.Join("/sys/fs/cgroup", v2file))
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			if ctl == v1ctl {
				v1 = append(v1, filepath.Join("/sys/fs/cgroup", v1ctl, f[2], v1file), filepath.Join("/sys/fs/cgroup", v1ctl, v1file))
			}
		}
	}
	return append(v1, v2...)
}

// readOOMCount returns the "oom_kill N" value of the counter file path, or -1 when
// path is empty or holds no such line.
func readOOMCount(path string) int64 {
	if path == "" {
		return -1
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	return parseOOMCount(b)
}

// parseOOMCount returns the "oom_kill N" value of a counter file's content b
// (cgroup v1's memory.oom_control, cgroup v2's memory.events), or -1 when it holds
// no such line.
func parseOOMCount(b []byte) int64 {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}
