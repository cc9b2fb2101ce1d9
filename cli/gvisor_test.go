package cli

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

// TestGVisorExec is issue 18's done-when check: a rule with runtime = "runsc" runs
// `berth exec -s untrusted:1 -- uname -r` under gVisor's kernel, on docker and on
// containerd 2.x, while a rule without it, on the same driver, runs on the host's
// kernel; `berth config check` accepts the config and `berth drivers` lists runsc
// with gVisor's kernel. Under CI=true a missing runsc fails the test.
func TestGVisorExec(t *testing.T) {
	hostKernel, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, e *env) string // the driver block and the driver's name
	}{
		{"docker", func(t *testing.T, e *env) string {
			testimage.RequireEngine(t)
			return `driver = "docker"`
		}},
		{"containerd-2", func(t *testing.T, e *env) string {
			addr := testimage.RequireContainerd(t, "CONTAINERD2_ADDRESS")
			runsc := testimage.RequireRunsc(t)
			e.config = e.writeFile("block.hcl", fmt.Sprintf("driver \"containerd\" {\n  address   = %q\n  namespace = %q\n  runtimes  = { runsc = %q }\n}\n", addr, containerdCLINamespace, runsc))
			return `driver = "containerd"`
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			driver := c.setup(t, e)
			block := ""
			if e.config != "" {
				b, err := os.ReadFile(e.config)
				if err != nil {
					t.Fatal(err)
				}
				block = string(b)
			}
			e.config = e.writeFile("config.hcl", fmt.Sprintf("%s\nscope \"untrusted:*\" {\n  %s\n  image   = %q\n  runtime = \"runsc\"\n}\n\nscope \"*\" {\n  %s\n  image = %q\n}\n", block, driver, testimage.Ref, driver, testimage.Ref))
			t.Parallel()
			archive, err := testimage.Archive()
			if err != nil {
				t.Fatal(err)
			}
			drv := strings.Trim(strings.TrimPrefix(driver, "driver = "), `"`)
			if r := e.run("image", "import", "--driver", drv, e.writeFile("busybox.tar", string(archive))); r.code != 0 {
				t.Fatalf("image import: want exit 0\n%v", r)
			}
			if r := e.run("drivers"); r.code != 0 || !strings.Contains(r.stdout, "runtime=runsc(gvisor") {
				if strings.Contains(r.stdout, drv) && !strings.Contains(r.stdout, "runtime=runsc") {
					testimage.Missing(t, "driver "+drv+" offers no runtime runsc; "+testimage.RunscStartHint)
				}
				t.Fatalf("berth drivers: want runsc listed with kernel gvisor\n%v", r)
			}
			if r := e.run("config", "check"); r.code != 0 {
				t.Fatalf("config check: want exit 0\n%v", r)
			}
			r := e.run("exec", "-s", "untrusted:1", "--", "uname", "-r")
			if got := strings.TrimSpace(r.stdout); r.code != 0 || !strings.HasSuffix(got, "-gvisor") {
				t.Errorf("exec -s untrusted:1 -- uname -r: want gVisor's kernel (…-gvisor)\n%v", r)
			}
			r = e.run("exec", "-s", "trusted:1", "--", "uname", "-r")
			if got := strings.TrimSpace(r.stdout); r.code != 0 || got != strings.TrimSpace(string(hostKernel)) {
				t.Errorf("exec -s trusted:1 -- uname -r: want the host's kernel %s\n%v", hostKernel, r)
			}
		})
	}
}

// TestCapsSummaryRuntimes: `berth drivers` shows each runtime with its kernel, what
// it lacks beside the default runtime, and its own value of a key=value entry.
func TestCapsSummaryRuntimes(t *testing.T) {
	base := backend.Capabilities{FSIsolation: backend.FSIsolationImage, NetworkModes: []string{"none", "host"}, MemoryLimit: true, PidsLimit: true, TTY: true}
	gv := base
	gv.NetworkModes, gv.MemoryLimit, gv.PidsLimit = []string{"none"}, false, false
	base.Runtimes = []backend.RuntimeCapabilities{{Name: "runsc", Kernel: backend.KernelGVisor, Capabilities: gv}, {Name: "crun", Kernel: backend.KernelHost, Capabilities: base}}
	got := capsSummary(base)
	want := "fs=image,net=none|host,tty,memory,pids,runtime=runsc(gvisor;net=none;-memory;-pids),runtime=crun(host)"
	if got != want {
		t.Errorf("capsSummary = %q, want %q", got, want)
	}
}
