package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
)

// Built by TestMain with CGO_ENABLED=0: berth (the host, and the agent binary the
// suite installs) and this driver as a plugin executable.
// berthBin is berth as users run it (the thin front); berthCLI is the full command
// line beside it, which is also the agent binary.
var berthBin, berthCLI, pluginBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "berth-driver-bwrap-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// berth's module directory: ../.. through the replace directive here, the
	// module cache in a driver repository that requires a berth release.
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/berth-sh/berth").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "finding berth's module:", err)
		return 1
	}
	berthBin = filepath.Join(dir, "bin", "berth")
	berthCLI = filepath.Join(dir, "bin", "berth-cli")
	pluginBin = filepath.Join(dir, "plugin", "berth-driver-bwrap")
	for _, b := range []struct {
		dir, out string
		pkgs     []string
	}{
		{strings.TrimSpace(string(root)), filepath.Join(dir, "bin") + "/", []string{"./cmd/berth", "./cmd/berth-cli"}},
		{".", pluginBin, []string{"."}},
	} {
		cmd := exec.Command("go", append([]string{"build", "-o", b.out}, b.pkgs...)...)
		cmd.Dir = b.dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", b.pkgs, err, out)
			return 1
		}
	}
	return m.Run()
}

// needBwrap skips when bubblewrap is missing, except in CI, where that fails.
func needBwrap(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("bwrap is not installed (apt-get install bubblewrap)")
		}
		t.Skip("bwrap is not installed (apt-get install bubblewrap)")
	}
}

func configured(t *testing.T) (*Driver, string) {
	t.Helper()
	d := New()
	owner := "bwraptest-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := d.Configure(context.Background(), backend.DriverSetup{StateDir: t.TempDir(), Owner: owner}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, owner
}

// TestConformance runs berth's whole suite against the driver in this process, as
// a driver author's own go test does.
func TestConformance(t *testing.T) {
	needBwrap(t)
	d, owner := configured(t)
	conformance.Run(t, d, conformance.Options{AgentBinary: berthCLI, Owner: owner})
}

// TestConformanceCLI runs `berth conformance --plugin` against the built plugin:
// every case passes or skips with a reason, and the JUnit report is valid XML.
func TestConformanceCLI(t *testing.T) {
	needBwrap(t)
	junit := filepath.Join(t.TempDir(), "report.xml")
	cmd := exec.Command(berthBin, "--state-dir", t.TempDir(), "conformance", "--plugin", pluginBin, "--json", "--junit", junit)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("berth conformance --plugin: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	var rep struct {
		Driver  string `json:"driver"`
		Passed  int    `json:"passed"`
		Failed  int    `json:"failed"`
		Skipped int    `json:"skipped"`
		Cases   []struct {
			Group, Name, Status, Reason string
		} `json:"cases"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout.String())
	}
	if rep.Driver != Name || rep.Failed != 0 || rep.Passed < 40 {
		t.Errorf("report: driver %q, %d passed, %d failed", rep.Driver, rep.Passed, rep.Failed)
	}
	isolationPassed := 0
	for _, c := range rep.Cases {
		switch {
		case c.Status == "skip" && c.Reason == "":
			t.Errorf("case %s/%s skipped without a reason", c.Group, c.Name)
		case c.Group == "resources" && c.Name == "unlimited-memory-accepted":
			// Every driver must accept a spec that asks for no limit.
			if c.Status != "pass" {
				t.Errorf("resources case %s: %s %s, want pass", c.Name, c.Status, c.Reason)
			}
		case c.Group == "resources" && c.Status != "skip":
			t.Errorf("resources case %s ran (%s), but the driver claims no resource limits", c.Name, c.Status)
		case c.Group == "isolation" && c.Status == "pass":
			isolationPassed++
		}
	}
	if isolationPassed < 7 {
		t.Errorf("only %d isolation cases passed", isolationPassed)
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var x struct {
		XMLName  xml.Name `xml:"testsuites"`
		Tests    int      `xml:"tests,attr"`
		Failures int      `xml:"failures,attr"`
	}
	if err := xml.Unmarshal(b, &x); err != nil || x.Failures != 0 || x.Tests != len(rep.Cases) {
		t.Errorf("JUnit report: %v, %+v (want %d tests, 0 failures)", err, x, len(rep.Cases))
	}
}

// berthEnv runs berth with a config and a state dir of the test's.
type berthEnv struct {
	t             *testing.T
	config, state string
}

func (e berthEnv) run(args ...string) (string, string, error) {
	cmd := exec.Command(berthBin, args...)
	cmd.Env = append(os.Environ(), "BERTH_CONFIG="+e.config, "BERTH_STATE_DIR="+e.state, "BERTH_PLUGIN_PATH=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// A scope rule with driver = "bwrap" runs `berth exec` through the plugin that
// berth discovers in plugin_dirs; the sandbox outlives the plugin process of each
// call (a background process started by one exec is there for the next), and
// `berth rm` ends it.
func TestExecThroughDiscoveredPlugin(t *testing.T) {
	needBwrap(t)
	dir := t.TempDir()
	e := berthEnv{t: t, config: filepath.Join(dir, "config.hcl"), state: filepath.Join(dir, "state")}
	cfg := fmt.Sprintf("plugin_dirs = [%q]\nscope \"t:*\" {\n  driver = \"bwrap\"\n}\nscope \"*\" {\n  driver = \"local\"\n}\n", filepath.Dir(pluginBin))
	if err := os.WriteFile(e.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := e.run("exec", "-s", "t:1", "--", "sh", "-c", `cat /proc/1/comm; echo "$HOME"; hostname; sleep 300 & echo $!`)
	if err != nil {
		t.Fatalf("berth exec -s t:1: %v\n%s%s", err, out, errOut)
	}
	f := strings.Fields(out)
	if len(f) != 4 || f[0] != backend.AgentBinaryName || f[1] != HomeDir || !strings.HasPrefix(f[2], "b-") {
		t.Fatalf("exec in the bwrap sandbox: want the agent as PID 1, HOME %s and the sandbox's host name; got %q", HomeDir, out)
	}
	bg := f[3]
	out, errOut, err = e.run("exec", "-s", "t:1", "--", "sh", "-c", "kill -0 "+bg+" && echo alive")
	if err != nil || out != "alive\n" {
		t.Errorf("the background sleep (pid %s in the sandbox) did not outlive the first call's plugin: %v %q %s", bg, err, out, errOut)
	}
	out, errOut, err = e.run("sessions", "--json")
	if err != nil || !strings.Contains(out, `"driver": "bwrap"`) && !strings.Contains(out, `"driver":"bwrap"`) {
		t.Errorf("sessions: %v %s %s", err, out, errOut)
	}
	// The sandbox's processes carry nothing of the host's; find its PID 1 on the host
	// through the driver's record, then remove the session and check it is gone.
	metas, _ := filepath.Glob(filepath.Join(e.state, "drivers", Name, "sandboxes", "*", "meta.json"))
	if len(metas) != 1 {
		t.Fatalf("want one sandbox record, got %v", metas)
	}
	b, err := os.ReadFile(metas[0])
	if err != nil {
		t.Fatal(err)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if !alive(m.InitPID, m.InitTicks) || !alive(m.BwrapPID, m.BwrapTicks) {
		t.Fatalf("the sandbox's bwrap (%d) or PID 1 (%d) is not running", m.BwrapPID, m.InitPID)
	}
	if out, errOut, err := e.run("rm", "t:1"); err != nil {
		t.Fatalf("berth rm t:1: %v %s %s", err, out, errOut)
	}
	if alive(m.InitPID, m.InitTicks) || alive(m.BwrapPID, m.BwrapTicks) {
		t.Errorf("after berth rm, the sandbox's bwrap (%d) or PID 1 (%d) still runs", m.BwrapPID, m.InitPID)
	}
}

// Stop ends the sandbox's bwrap through the agent; Create starts it again with the
// files of home kept; Remove deletes them.
func TestStopStartRemove(t *testing.T) {
	needBwrap(t)
	d, owner := configured(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin, err := agent.Install(t.TempDir(), berthCLI)
	if err != nil {
		t.Fatal(err)
	}
	files, err := agent.PrepareSandbox(filepath.Join(t.TempDir(), "sb"), bin)
	if err != nil {
		t.Fatal(err)
	}
	spec := backend.SandboxSpec{Name: "bw-stop", Labels: map[string]string{backend.LabelOwner: owner}}
	if _, err := d.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Remove(context.Background(), spec.Name) })
	run := func(script string) string {
		t.Helper()
		var out bytes.Buffer
		p, err := agent.Exec(ctx, files, backend.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Fatalf("%q: %v %+v", script, err, res)
		}
		return out.String()
	}
	run("echo kept > $HOME/f")
	dir, _ := d.sandboxDir(spec.Name)
	m, err := readMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx, spec.Name, 0); err != nil {
		t.Fatal(err)
	}
	if alive(m.InitPID, m.InitTicks) || alive(m.BwrapPID, m.BwrapTicks) {
		t.Errorf("after Stop, bwrap (%d) or PID 1 (%d) still runs", m.BwrapPID, m.InitPID)
	}
	if sb, err := d.Inspect(ctx, spec.Name); err != nil || sb.State != backend.StateStopped {
		t.Errorf("Inspect after Stop: %+v %v", sb, err)
	}
	if sb, err := d.Create(ctx, backend.CreateRequest{Spec: spec, Agent: files}); err != nil || !sb.Adopted || sb.State != backend.StateRunning {
		t.Fatalf("Create after Stop: %+v %v", sb, err)
	}
	if got := run("cat $HOME/f"); got != "kept\n" {
		t.Errorf("home after Stop and Create: %q", got)
	}
	if err := d.Remove(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("sandbox directory after Remove: %v", err)
	}
}

// What the driver cannot honour is refused with the fix, before anything starts.
func TestUnsupportedSpec(t *testing.T) {
	d, _ := configured(t)
	for _, c := range []struct {
		edit func(*backend.SandboxSpec)
		want string
	}{
		{func(s *backend.SandboxSpec) { s.Resources.MemoryBytes = 1 << 30 }, "resource limits are not supported"},
		{func(s *backend.SandboxSpec) { s.Image = "busybox" }, "remove image"},
		{func(s *backend.SandboxSpec) { s.User = "1000" }, "remove user"},
		{func(s *backend.SandboxSpec) { s.Network = "bridge" }, `use "none"`},
		{func(s *backend.SandboxSpec) { s.Mounts = []backend.Mount{{Source: "/", Target: "/host"}} }, "allow_host_paths"},
	} {
		spec := backend.SandboxSpec{Name: "bw-bad"}
		c.edit(&spec)
		_, err := d.Create(context.Background(), backend.CreateRequest{Spec: spec, Agent: backend.AgentFiles{Binary: "/x", Dir: "/x", SocketDir: "/x"}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("spec %+v: %v, want an error containing %q", spec, err, c.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	out, err := exec.Command(pluginBin, "describe").Output()
	if err != nil {
		t.Fatal(err)
	}
	var desc struct {
		Name             string                `json:"name"`
		ProtocolVersions []int                 `json:"protocol_versions"`
		Capabilities     backend.Capabilities  `json:"capabilities"`
		ConfigSchema     []backend.ConfigField `json:"config_schema"`
	}
	if err := json.Unmarshal(out, &desc); err != nil {
		t.Fatalf("describe: %v\n%s", err, out)
	}
	c := desc.Capabilities
	if desc.Name != Name || len(desc.ProtocolVersions) == 0 || c.MemoryLimit || c.PidsLimit || c.CPULimit || !c.PIDIsolation || !c.DropCapabilities || len(desc.ConfigSchema) != 2 {
		t.Errorf("describe: %s", out)
	}
}
