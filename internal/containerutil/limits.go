package containerutil

import (
	"fmt"
	"syscall"

	"github.com/berth-sh/berth/backend"
)

// Limits are a container sandbox's cgroup limits: a spec's Resources checked and
// with the defaults applied (ResolveLimits).
type Limits struct {
	// MemoryBytes is the memory limit in bytes, swap set equal to it; 0 means none.
	MemoryBytes int64
	// NanoCPUs is the CPU quota in billionths of a CPU (Docker's NanoCPUs); 0 means
	// none.
	NanoCPUs int64
	// Pids is the pids limit.
	Pids int64
	// CPUShares is the relative CPU weight (Docker's CpuShares, OCI
	// linux.resources.cpu.shares).
	CPUShares int64
}

// MaxCPUShares is the largest CPU weight Docker and the OCI runtimes accept.
const MaxCPUShares = 262144

// ResolveLimits checks r and applies the defaults of the built-in container drivers:
// memory DefaultMemory() unless set (backend.UnlimitedMemory: none), pids
// backend.DefaultPidsLimit, CPU shares backend.DefaultCPUShares, no CPU quota. The
// error says which value is wrong and what it may be; callers wrap it in
// backend.ErrInvalid with the sandbox's name.
func ResolveLimits(r backend.Resources) (Limits, error) {
	switch {
	case r.CPUs < 0 || r.Pids < 0 || r.CPUShares < 0 || r.MemoryBytes < backend.UnlimitedMemory:
		return Limits{}, fmt.Errorf("resources must not be negative (cpus %v, memory %d, pids %d, cpu_shares %d); memory = \"unlimited\" asks for no memory limit", r.CPUs, r.MemoryBytes, r.Pids, r.CPUShares)
	case r.Pids > 0 && r.Pids < MinPids:
		return Limits{}, fmt.Errorf("pids %d is below the minimum of %d (berth's agent, PID 1, keeps some 30 threads made in advance, and each counts as a process); set resources.pids to at least %d, or leave it unset for the default %d", r.Pids, MinPids, MinPids, backend.DefaultPidsLimit)
	case r.MemoryBytes > 0 && r.MemoryBytes < MinMemoryBytes:
		return Limits{}, fmt.Errorf("memory %d bytes is below the minimum of %d MiB (Docker's)", r.MemoryBytes, MinMemoryBytes>>20)
	case r.CPUs > 0 && r.CPUs < 0.01:
		return Limits{}, fmt.Errorf("cpus %v is below the minimum of 0.01", r.CPUs)
	case r.CPUShares == 1 || r.CPUShares > MaxCPUShares:
		return Limits{}, fmt.Errorf("cpu_shares %d is outside 2..%d (1024 is an ordinary container's weight)", r.CPUShares, MaxCPUShares)
	}
	l := Limits{MemoryBytes: r.MemoryBytes, NanoCPUs: int64(r.CPUs * 1e9), Pids: r.Pids, CPUShares: r.CPUShares}
	switch l.MemoryBytes {
	case 0:
		l.MemoryBytes = DefaultMemory()
	case backend.UnlimitedMemory:
		l.MemoryBytes = 0
	}
	if l.Pids == 0 {
		l.Pids = backend.DefaultPidsLimit
	}
	if l.CPUShares == 0 {
		l.CPUShares = backend.DefaultCPUShares
	}
	return l, nil
}

// DefaultMemory is the memory limit of a sandbox whose spec sets none:
// backend.DefaultMemoryBytes, or half the memory of the machine berth runs on when
// that is less (so that the default always leaves the host room), never below
// MinMemoryBytes.
func DefaultMemory() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return backend.DefaultMemoryBytes
	}
	half := int64(si.Totalram) * int64(si.Unit) / 2
	return max(min(backend.DefaultMemoryBytes, half), MinMemoryBytes)
}
