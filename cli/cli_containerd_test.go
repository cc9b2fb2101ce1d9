package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

// containerdCLINamespace is the containerd namespace of the CLI tests: not the
// default "berth", so that they never see the user's sandboxes.
const containerdCLINamespace = "berth-cli-test"

// containerdConfig is a config whose "job:*" sessions run on the containerd at addr.
func containerdConfig(addr string) string {
	return fmt.Sprintf(`driver "containerd" {
  address   = %q
  namespace = %q
}

scope "job:*" {
  driver = "containerd"
  image  = %q
}
`, addr, containerdCLINamespace, testimage.Ref)
}

// TestContainerdCLI: with a rule that selects containerd, on each containerd version,
// `berth image import --driver containerd` loads the test image, `berth exec -s job:1`
// and `berth shell -s job:1` run in the containerd sandbox, and `berth conformance
// --driver containerd` (through the driver's own executable, berth-driver-containerd
// beside berth) imports its own image and passes, its registry cases included (their
// config carries the driver block, so they reach the same daemon and namespace) and
// retention/reconcile-leaves-others, whose clean-up runs the executable's hidden
// remove-unowned. With --in-process it is a usage error: containerd is not compiled
// into berth.
func TestContainerdCLI(t *testing.T) {
	for _, env := range testimage.ContainerdEnvs {
		t.Run(env, func(t *testing.T) {
			addr := testimage.RequireContainerd(t, env)
			t.Parallel()
			e := newEnv(t)
			e.config = e.writeFile("config.hcl", containerdConfig(addr))
			archive, err := testimage.Archive()
			if err != nil {
				t.Fatal(err)
			}
			path := e.writeFile("busybox.tar", string(archive))
			if r := e.run("image", "import", "--driver", "containerd", path); r.code != 0 || strings.TrimSpace(r.stdout) != testimage.Ref {
				t.Fatalf("image import: want exit 0 and %s on stdout\n%v", testimage.Ref, r)
			}

			host, _ := os.Hostname()
			r := e.run("exec", "-s", "job:1", "--", "sh", "-c", "echo in-sandbox; hostname; id -u; cat /proc/1/cmdline | tr '\\0' ' '")
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			if r.code != 0 || len(lines) != 4 || lines[0] != "in-sandbox" || lines[1] == host || lines[2] != "0" || !strings.Contains(lines[3], "berth-agent serve") {
				t.Errorf("exec -s job:1: want the sandbox's hostname (not %s), uid 0 and the agent as PID 1\n%v", host, r)
			}

			out, code := runShellPTY(t, e, "job:1", "echo shell-$((6*7)); exit 3\n")
			if code != 3 || !strings.Contains(out, "shell-42") {
				t.Errorf("shell -s job:1: exit %d, output %q; want exit 3 and shell-42", code, out)
			}

			// A seccomp profile file: config check reads it; a sandbox made with it
			// can still be removed once the file is gone (only a new one needs it).
			profile := e.writeFile("profile.json", `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}`)
			withProfile := e.writeFile("profile.hcl", strings.Replace(containerdConfig(addr), "namespace", "seccomp   = \""+profile+"\"\n  namespace", 1))
			e.must("--config", withProfile, "config", "check")
			if r := e.run("--config", withProfile, "exec", "-s", "job:p", "--", "mkdir", "/tmp/x"); r.code == 0 || !strings.Contains(r.stderr, "not permitted") {
				t.Errorf("mkdir under a profile that refuses it: want a failure with EPERM\n%v", r)
			}
			os.Remove(profile)
			if r := e.run("--config", withProfile, "config", "check"); r.code != 125 || !strings.Contains(r.stderr, profile) {
				t.Errorf("config check with the profile file gone: want 125 naming %s\n%v", profile, r)
			}
			// The running sandbox is still adopted (only a new one needs the file); a new
			// session's create fails naming it.
			e.must("--config", withProfile, "exec", "-s", "job:p", "--", "true")
			if r := e.run("--config", withProfile, "exec", "-s", "job:q", "--", "true"); r.code != 125 || !strings.Contains(r.stderr, profile) {
				t.Errorf("a new sandbox with the profile file gone: want 125 naming %s\n%v", profile, r)
			}
			e.must("--config", withProfile, "rm", "job:p")

			r = e.run("sessions", "--json")
			var rows []sessionRow
			if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 {
				t.Errorf("sessions --json: %v\n%v", err, r)
			} else if b, _ := json.Marshal(rows[0]); !strings.Contains(string(b), "containerd") {
				t.Errorf("sessions --json: the job:1 row does not name containerd: %s", b)
			}

			if r := e.run("conformance", "--driver", "containerd", "--in-process", "--run", "^exec/exit-code-43$"); r.code != 125 || !strings.Contains(r.stderr, "not compiled into berth") || !strings.Contains(r.stderr, "drop --in-process") {
				t.Errorf("conformance --driver containerd --in-process: want 125 saying containerd is not compiled into berth\n%v", r)
			}
			r = e.run("conformance", "--driver", "containerd", "--run", "^(exec/exit-code-43|isolation/network-none-only-lo|lifecycle/stop-create-adopts|isolation/sessions-isolated|retention/reconcile-leaves-others)$", "--json")
			var rep struct {
				Driver                  string
				Passed, Failed, Skipped int
			}
			if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
				t.Fatalf("conformance report: %v\n%v", err, r)
			}
			if r.code != 0 || rep.Driver != "containerd" || rep.Passed != 5 || rep.Failed != 0 || rep.Skipped != 0 {
				t.Errorf("conformance --driver containerd: report %+v, want containerd with every case passed\n%v", rep, r)
			}
		})
	}
}
