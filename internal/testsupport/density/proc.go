package density

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Proc is what one host process costs: its threads, resident memory and open
// descriptors.
type Proc struct {
	// PID is the process's host pid.
	PID int
	// PPID is its parent's host pid.
	PPID int
	// Threads is /proc/PID/status's Threads.
	Threads int
	// RSS is VmRSS, in bytes: every resident page the process maps, shared or not.
	RSS int64
	// Pss is the proportional set size from /proc/PID/smaps_rollup, in bytes: each
	// shared page counted as its size divided by the processes that map it, so the
	// Pss of all processes adds up to the memory they use together.
	Pss int64
	// FDs is the number of open file descriptors (entries of /proc/PID/fd).
	FDs int
}

// ReadProc reads pid's figures from /proc. Errors: the process is gone, or its
// files cannot be read (not root).
func ReadProc(pid int) (Proc, error) {
	p := Proc{PID: pid}
	dir := "/proc/" + strconv.Itoa(pid)
	st, err := os.ReadFile(dir + "/status")
	if err != nil {
		return p, err
	}
	for _, line := range strings.Split(string(st), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "PPid":
			p.PPID, _ = strconv.Atoi(f[0])
		case "Threads":
			p.Threads, _ = strconv.Atoi(f[0])
		case "VmRSS":
			kb, _ := strconv.ParseInt(f[0], 10, 64)
			p.RSS = kb << 10
		}
	}
	roll, err := os.ReadFile(dir + "/smaps_rollup")
	if err != nil {
		return p, err
	}
	if kb, ok := field(roll, "Pss:"); ok {
		p.Pss = kb << 10
	}
	fds, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return p, err
	}
	p.FDs = len(fds)
	return p, nil
}

// field returns the number after the line prefix key in a /proc file of
// "Key: N kB" lines.
func field(b []byte, key string) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, err := strconv.ParseInt(f[0], 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

// MemAvailable returns the host's MemAvailable from /proc/meminfo, in bytes.
func MemAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	kb, ok := field(b, "MemAvailable:")
	if !ok {
		return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
	}
	return kb << 10, nil
}

// HostThreads returns the number of threads of every process on the host (the
// entries of every /proc/PID/task), which kernel.pid_max bounds.
func HostThreads() int {
	tasks, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*")
	return len(tasks)
}

// LoadAvg returns the first three fields of /proc/loadavg ("1.20 0.90 0.70"), or ""
// when it cannot be read.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// MemCgroupUsage returns the memory use of pid's memory cgroup, in bytes:
// memory.usage_in_bytes under cgroup v1, memory.current under v2. Errors: the
// process is gone, or it has no memory cgroup that can be read.
func MemCgroupUsage(pid int) (int64, error) {
	path, v2, err := memCgroup(pid)
	if err != nil {
		return 0, err
	}
	file := filepath.Join("/sys/fs/cgroup/memory", path, "memory.usage_in_bytes")
	if v2 {
		file = filepath.Join("/sys/fs/cgroup", path, "memory.current")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// memCgroup returns pid's memory cgroup path from /proc/PID/cgroup: the v1 memory
// controller's line, else the v2 ("0::") line with v2 set.
func memCgroup(pid int) (path string, v2 bool, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", false, err
	}
	unified := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "memory" {
				return f[2], false, nil
			}
		}
		if f[0] == "0" && f[1] == "" {
			unified = f[2]
		}
	}
	if unified != "" {
		return unified, true, nil
	}
	return "", false, fmt.Errorf("pid %d has no memory cgroup", pid)
}

// ContainerInits maps each container id in ids to the host pid of its first process
// (PID 1 in its pid namespace: berth's agent), found by scanning /proc for processes
// whose memory cgroup path ends in the id and whose innermost pid (NSpid) is 1. Ids
// whose process is not found are missing from the map.
func ContainerInits(ids []string) map[string]int {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	found := map[string]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		path, _, err := memCgroup(pid)
		if err != nil {
			continue
		}
		id := cgroupID(path)
		if !want[id] {
			continue
		}
		st, err := os.ReadFile(d + "/status")
		if err != nil {
			continue
		}
		if nsPid(st) == 1 {
			found[id] = pid
		}
	}
	return found
}

// cgroupID returns the container id that a container's cgroup path ends in: the last
// element (cgroupfs: /docker/ID, /NAMESPACE/ID), or the id of a systemd scope
// (/system.slice/docker-ID.scope).
func cgroupID(path string) string {
	base := filepath.Base(path)
	if s, ok := strings.CutSuffix(base, ".scope"); ok {
		if i := strings.LastIndex(s, "-"); i >= 0 {
			return s[i+1:]
		}
		return s
	}
	return base
}

// nsPid returns the last field of the NSpid line of a /proc/PID/status (the pid in
// the process's innermost pid namespace), or 0.
func nsPid(status []byte) int {
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[len(f)-1])
				return n
			}
		}
	}
	return 0
}
