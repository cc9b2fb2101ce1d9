package docker_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/internal/containerutil"
)

// A sandbox without resources gets the default memory limit (swap equal), pids limit
// and CPU shares; memory = "unlimited" and a rule's cpu_shares are honoured.
func TestDefaultLimits(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, c := range []struct {
		name                 string
		res                  backend.Resources
		memory, shares, pids int64
	}{
		{"default", backend.Resources{}, containerutil.DefaultMemory(), backend.DefaultCPUShares, backend.DefaultPidsLimit},
		{"unlimited", backend.Resources{MemoryBytes: backend.UnlimitedMemory, CPUShares: 1024}, 0, 1024, backend.DefaultPidsLimit},
		{"set", backend.Resources{MemoryBytes: 64 << 20, Pids: 100}, 64 << 20, backend.DefaultCPUShares, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := conformance.SandboxName()
			req := f.request(name)
			req.Spec.Resources = c.res
			if _, err := f.d.Create(ctx, req); err != nil {
				t.Fatal(err)
			}
			info, err := f.api.ContainerInspect(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			r := info.HostConfig.Resources
			if r.Memory != c.memory || r.CPUShares != c.shares || r.PidsLimit == nil || *r.PidsLimit != c.pids {
				t.Errorf("memory %d cpu shares %d pids %v, want %d %d %d", r.Memory, r.CPUShares, r.PidsLimit, c.memory, c.shares, c.pids)
			}
			if c.memory > 0 && r.MemorySwap != c.memory {
				t.Errorf("memory+swap %d, want %d (no swap on top)", r.MemorySwap, c.memory)
			}
			if err := f.d.Remove(ctx, name); err != nil {
				t.Error(err)
			}
		})
	}
	if m := containerutil.DefaultMemory(); m <= 0 || m > backend.DefaultMemoryBytes {
		t.Errorf("DefaultMemory() = %d, want in (0, %d]", m, int64(backend.DefaultMemoryBytes))
	}
}
