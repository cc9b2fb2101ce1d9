package backends

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/berth-sh/berth/backend"
	pb "github.com/berth-sh/berth/backends/internal/driverpb"
)

// wire marshals and unmarshals m, as the connection does.
func wire[M proto.Message](t *testing.T, m M) M {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := m.ProtoReflect().New().Interface().(M)
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func check[T any](t *testing.T, what string, in, out T) {
	t.Helper()
	if !reflect.DeepEqual(in, out) {
		t.Errorf("%s did not round-trip:\n in  %+v\n out %+v", what, in, out)
	}
}

func TestRoundTrip(t *testing.T) {
	caps := backend.Capabilities{
		FSIsolation: backend.FSIsolationImage, PIDIsolation: true, NetworkModes: []string{"none", "bridge"},
		TTY: true, CPULimit: true, MemoryLimit: true, PidsLimit: true, DropCapabilities: true, Copy: true,
		StopStart: true, StopKeeps: backend.StopKeepsWorkdir, ExecUser: true, ImagePull: true, ImageImport: true, Config: true, Agent: backend.AgentSocket, AgentDial: true, Validate: true,
	}
	caps.Runtimes = []backend.RuntimeCapabilities{{Name: "runsc", Kernel: backend.KernelGVisor, Capabilities: backend.Capabilities{FSIsolation: backend.FSIsolationImage, NetworkModes: []string{"none"}, TTY: true}}}
	if reflect.ValueOf(caps).NumField() != 19 {
		t.Fatal("backend.Capabilities changed: update capsToPB/capsFromPB and this test")
	}
	info := backend.Info{Name: "docker", Version: "1.2.3", ProtocolVersions: []int{1, 2}, Protocol: 1, Capabilities: caps}
	check(t, "Info", info, infoFromPB(wire(t, infoToPB(info))))
	check(t, "zero Info", backend.Info{}, infoFromPB(wire(t, infoToPB(backend.Info{}))))
	check(t, "Capabilities", caps, capsFromPB(wire(t, capsToPB(caps))))

	spec := backend.SandboxSpec{
		Name: "b-1234abcd-0123456789abcdef", Image: "busybox:latest",
		Labels: map[string]string{backend.LabelOwner: "o", backend.LabelSession: "chat:1", "user": "x"},
		Env:    []string{"A=1", "B="}, EnvAllowlist: []string{"PATH", "TERM"},
		Workdir: "/work", User: "1000:1000",
		Mounts:         []backend.Mount{{Source: "/src", Target: "/dst", ReadOnly: true}, {Source: "/a", Target: "/b"}},
		Network:        "bridge",
		Resources:      backend.Resources{CPUs: 1.5, MemoryBytes: 512 << 20, Pids: 256},
		AllowHostPaths: true,
		Runtime:        "runsc",
		Pull:           backend.PullNever,
	}
	if reflect.ValueOf(spec).NumField() != 13 {
		t.Fatal("backend.SandboxSpec changed: update specToPB/specFromPB and this test")
	}
	check(t, "SandboxSpec", spec, specFromPB(wire(t, specToPB(spec))))
	check(t, "zero SandboxSpec", backend.SandboxSpec{}, specFromPB(wire(t, specToPB(backend.SandboxSpec{}))))

	create := backend.CreateRequest{Spec: spec, Agent: backend.AgentFiles{Binary: "/s/agent/berth-agent", Dir: "/s/agent", SocketDir: "/s/run", Static: true}}
	check(t, "CreateRequest", create, createFromPB(wire(t, createToPB(create))))

	sb := backend.Sandbox{
		Name: "b-1", ID: "abc123", State: backend.StateStopped,
		Labels:    map[string]string{"k": "v"},
		CreatedAt: time.Date(2026, 5, 4, 3, 2, 1, 123456789, time.UTC),
		Adopted:   true,
		EndReason: backend.EndOOMKilled, EndMessage: "the memory limit was reached",
	}
	if reflect.ValueOf(sb).NumField() != 8 {
		t.Fatal("backend.Sandbox changed: update sandboxToPB/sandboxFromPB and this test")
	}
	check(t, "Sandbox", sb, sandboxFromPB(wire(t, sandboxToPB(sb))))
	check(t, "zero Sandbox", backend.Sandbox{}, sandboxFromPB(wire(t, sandboxToPB(backend.Sandbox{}))))
	hostile := sandboxFromPB(&pb.Sandbox{EndReason: "OOM\x1b[2J\nKilled", EndMessage: strings.Repeat("x", 1000)})
	if hostile.EndReason != "OOM [2J Killed" || len(hostile.EndMessage) != backend.MaxEndMessage || !strings.HasSuffix(hostile.EndMessage, "...") {
		t.Errorf("a plugin's EndReason %q and EndMessage of %d bytes, want them cleaned and capped", hostile.EndReason, len(hostile.EndMessage))
	}
	local := sb
	local.CreatedAt = time.Date(2026, 5, 4, 3, 2, 1, 5, time.FixedZone("X", 3600))
	if got := sandboxFromPB(wire(t, sandboxToPB(local))); !got.CreatedAt.Equal(local.CreatedAt) {
		t.Errorf("CreatedAt %v, want the instant %v", got.CreatedAt, local.CreatedAt)
	}
	list := []backend.Sandbox{sb, {Name: "b-2", State: backend.StateRunning}}
	check(t, "[]Sandbox", list, sandboxesFromPB(wire(t, &pb.ListResponse{Sandboxes: sandboxesToPB(list)}).GetSandboxes()))

	req := backend.ExecRequest{
		Argv: []string{"sh", "-c", "echo hi"}, Env: []string{"X=1"}, Dir: "/tmp", User: "root",
		TTY: true, Size: backend.WindowSize{Rows: 24, Cols: 80}, Stdin: true, Timeout: 1500 * time.Millisecond,
	}
	if reflect.ValueOf(req).NumField() != 10 {
		t.Fatal("backend.ExecRequest changed: update execSetupToPB/execSetupFromPB and this test (writers stay local)")
	}
	name, back := execSetupFromPB(wire(t, execSetupToPB("sb", req)))
	if name != "sb" {
		t.Errorf("sandbox name %q", name)
	}
	check(t, "ExecRequest", req, back)

	res := backend.ExecResult{ExitCode: 137, Signal: 9, TimedOut: true, Canceled: true, OOMKilled: true, Duration: 1234567 * time.Microsecond, Cwd: "/tmp"}
	if reflect.ValueOf(res).NumField() != 7 {
		t.Fatal("backend.ExecResult changed: update resultToPB/resultFromPB and this test")
	}
	check(t, "ExecResult", res, resultFromPB(wire(t, resultToPB(res))))
	check(t, "zero ExecResult", backend.ExecResult{}, resultFromPB(wire(t, resultToPB(backend.ExecResult{}))))

	size := backend.WindowSize{Rows: 65535, Cols: 1}
	check(t, "WindowSize", size, sizeFromPB(wire(t, sizeToPB(size))))

	fields := []backend.ConfigField{{Name: "host", Type: "string", Required: true, Description: "engine"}, {Name: "t", Type: "duration"}}
	check(t, "[]ConfigField", fields, configFieldsFromPB(wire(t, &pb.ConfigSchemaResponse{Fields: configFieldsToPB(fields)}).GetFields()))

	setup := backend.DriverSetup{StateDir: "/state/drivers/local", Owner: "0123abcd", Config: []byte(`{"a":1}`)}
	check(t, "DriverSetup", setup, setupFromPB(wire(t, setupToPB(setup))))

	prog := backend.PullProgress{Layer: "sha256:ab", Status: "Downloading", Current: 10, Total: 100}
	check(t, "PullProgress", prog, progressFromPB(wire(t, progressToPB(prog))))
}
