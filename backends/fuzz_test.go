package backends

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sh/berth/backend"
	pb "github.com/berth-sh/berth/backends/internal/driverpb"
	"github.com/berth-sh/berth/internal/rpcerr"
	"github.com/berth-sh/berth/internal/testsupport/fakewire"
)

// Fuzz targets of what the host reads from a driver plugin (docs/fuzzing.md):
// FuzzPluginMessages decodes fuzzed bytes as each message the host receives and
// converts them (convert.go); FuzzPluginCalls makes the Client's calls over a real
// gRPC connection to a fake plugin (internal/testsupport/fakewire) that answers with fuzzed
// frames and a fuzzed status. A hostile or broken plugin must get a clear error,
// never a panic, a hang or unbounded allocation.

// unmarshalDiscard decodes b into m, dropping unknown fields (which no conversion
// carries).
func unmarshalDiscard(b []byte, m proto.Message) error {
	return proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
}

// pluginMessages are the messages FuzzPluginMessages decodes, by the fuzzed byte.
var pluginMessages = []string{"info", "sandbox", "list", "schema", "progress", "result", "exec out"}

func FuzzPluginMessages(f *testing.F) {
	created := timestamppb.New(time.Date(2024, 1, 2, 3, 4, 5, 6, time.UTC))
	sb := &pb.Sandbox{Name: "b-1", Id: "c0ffee", State: "running", Labels: map[string]string{"berth.owner": "o", "": "\x00"}, CreatedAt: created, Adopted: true}
	for _, m := range []proto.Message{
		&pb.InfoResponse{Info: &pb.Info{Name: "fake", Version: "1", ProtocolVersions: []int32{1, 2, -1}, Protocol: 2,
			Capabilities: &pb.Capabilities{FsIsolation: "image", NetworkModes: []string{"none", ""}, Agent: "dial", Validate: true}}},
		&pb.InspectResponse{Sandbox: sb},
		&pb.InspectResponse{Sandbox: &pb.Sandbox{CreatedAt: &timestamppb.Timestamp{Seconds: -1 << 62, Nanos: 2e9}}},
		&pb.InspectResponse{Sandbox: &pb.Sandbox{CreatedAt: &timestamppb.Timestamp{}}},
		&pb.ListResponse{Sandboxes: []*pb.Sandbox{sb, {}, nil}},
		&pb.ConfigSchemaResponse{Fields: []*pb.ConfigField{{Name: "x", Type: "duration", Required: true}, {Name: "", Type: "map"}}},
		&pb.PullProgress{Layer: "sha256:1", Status: "Downloading", Current: 1 << 62, Total: -1},
		&pb.ExecResult{ExitCode: -1, Signal: 1 << 30, DurationNs: -5, Cwd: "/"},
		&pb.ExecOut{Msg: &pb.ExecOut_Result{Result: &pb.ExecResult{ExitCode: 256}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		for kind := range pluginMessages {
			f.Add(uint8(kind), b)
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		switch pluginMessages[int(kind)%len(pluginMessages)] {
		case "info":
			var m pb.InfoResponse
			if unmarshalDiscard(b, &m) != nil {
				return
			}
			info := infoFromPB(m.GetInfo())
			back := infoToPB(info)
			if m.Info == nil {
				m.Info = &pb.Info{}
			}
			if m.Info.Capabilities == nil {
				m.Info.Capabilities = &pb.Capabilities{}
			}
			if !proto.Equal(back, m.Info) {
				t.Fatalf("info %v reads back as %v", m.Info, back)
			}
		case "sandbox", "list":
			var m pb.ListResponse
			if unmarshalDiscard(b, &m) != nil {
				return
			}
			got := sandboxesFromPB(m.GetSandboxes())
			if len(got) != len(m.Sandboxes) {
				t.Fatalf("%d sandboxes from %d", len(got), len(m.Sandboxes))
			}
			for i, s := range got {
				w := m.Sandboxes[i]
				if !s.CreatedAt.IsZero() && s.CreatedAt.Location() != time.UTC {
					t.Fatalf("sandbox %v: created %v, not in UTC", w, s.CreatedAt)
				}
				if s.Labels != nil && len(s.Labels) == 0 {
					t.Fatalf("sandbox %v: an empty label map instead of nil", w)
				}
				if w.GetCreatedAt().CheckValid() != nil {
					continue // not a time: read as whatever time.Unix makes of it
				}
				if s.EndReason != backend.SanitizeEndMessage(s.EndReason) || s.EndMessage != backend.SanitizeEndMessage(s.EndMessage) {
					t.Fatalf("sandbox %v: end reason %q / message %q not cleaned", w, s.EndReason, s.EndMessage)
				}
				// The host cleans a plugin's end reason and message (SanitizeEndMessage):
				// what reads back is the cleaned text.
				if w != nil {
					w = proto.Clone(w).(*pb.Sandbox)
					w.EndReason, w.EndMessage = backend.SanitizeEndMessage(w.GetEndReason()), backend.SanitizeEndMessage(w.GetEndMessage())
				}
				if back := sandboxToPB(s); !proto.Equal(back, w) && !(w != nil && w.CreatedAt != nil && back.CreatedAt == nil && s.CreatedAt.IsZero()) {
					t.Fatalf("sandbox %v reads back as %v", w, back)
				}
			}
		case "schema":
			var m pb.ConfigSchemaResponse
			if unmarshalDiscard(b, &m) != nil {
				return
			}
			fields := configFieldsFromPB(m.GetFields())
			if back := configFieldsToPB(fields); len(back) != len(m.Fields) || !slices.EqualFunc(back, m.Fields, func(a, b *pb.ConfigField) bool {
				return proto.Equal(a, b) || b == nil && proto.Equal(a, &pb.ConfigField{})
			}) {
				t.Fatalf("schema %v reads back as %v", m.Fields, back)
			}
		case "progress":
			var m pb.PullProgress
			if unmarshalDiscard(b, &m) != nil {
				return
			}
			if back := progressToPB(progressFromPB(&m)); !proto.Equal(back, &m) {
				t.Fatalf("progress %v reads back as %v", &m, back)
			}
		case "result", "exec out":
			var m pb.ExecOut
			if unmarshalDiscard(b, &m) != nil {
				return
			}
			r := m.GetResult()
			if r == nil {
				r = &pb.ExecResult{}
			}
			if back := resultToPB(resultFromPB(r)); !proto.Equal(back, r) {
				t.Fatalf("result %v reads back as %v", r, back)
			}
		}
	})
}

// fakePlugin is one fake plugin per fuzz process, and a Client connected to it.
var fakePlugin struct {
	once   sync.Once
	srv    *fakewire.Server
	client *Client
	err    error
}

func startFakePlugin(t *testing.T) (*fakewire.Server, *Client) {
	fakePlugin.once.Do(func() {
		fakePlugin.srv = fakewire.NewServer(&pb.Driver_ServiceDesc)
		conn, err := grpc.NewClient("passthrough:///fake-plugin",
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return fakePlugin.srv.Dial(ctx) }))
		if err != nil {
			fakePlugin.err = err
			return
		}
		// A plugin process that has not exited (pid 0): errors are read from the
		// statuses alone.
		fakePlugin.client = &Client{path: "berth-driver-fake", logger: hclog.NewNullLogger(), pc: &plugin.Client{}, runner: &procRunner{},
			api: pb.NewDriverClient(conn), stderr: &tailRecorder{max: 2048}}
	})
	if fakePlugin.err != nil {
		t.Fatal(fakePlugin.err)
	}
	return fakePlugin.srv, fakePlugin.client
}

// pluginStatusSeeds are statuses a plugin might end a call with.
func pluginStatusSeeds() [][]byte {
	info := func(reason string) []*anypb.Any {
		a, err := anypb.New(&errdetails.ErrorInfo{Domain: rpcerr.Domain, Reason: reason})
		if err != nil {
			panic(err)
		}
		return []*anypb.Any{a}
	}
	return [][]byte{
		nil,
		fakewire.Marshal(&spb.Status{Code: int32(codes.NotFound), Message: "sandbox b-1 not found", Details: info("not_found")}),
		fakewire.Marshal(&spb.Status{Code: int32(codes.Unavailable), Message: "engine down", Details: info("conflict")}),
		fakewire.Marshal(&spb.Status{Code: int32(codes.Unknown), Message: "panic: boom", Details: []*anypb.Any{{TypeUrl: "type.googleapis.com/google.rpc.ErrorInfo", Value: []byte{0xff}}}}),
		fakewire.Marshal(&spb.Status{Code: int32(codes.Canceled), Message: "the driver gave up"}),
		fakewire.Marshal(&spb.Status{Code: -1, Message: "no such code"}),
	}
}

// The calls FuzzPluginCalls makes, by the fuzzed byte.
var pluginCalls = []string{"Info", "ConfigSchema", "Configure", "Create", "Inspect", "List", "Stop", "Remove", "Validate",
	"CopyIn", "CopyOut", "PullImage", "ImportImage", "Exec", "DialAgent"}

func FuzzPluginCalls(f *testing.F) {
	out := func(m *pb.ExecOut) []byte { return fakewire.Marshal(m) }
	started := out(&pb.ExecOut{Msg: &pb.ExecOut_Started{Started: &pb.ExecStarted{}}})
	stdout := out(&pb.ExecOut{Msg: &pb.ExecOut_Stdout{Stdout: []byte("out")}})
	stderr := out(&pb.ExecOut{Msg: &pb.ExecOut_Stderr{Stderr: []byte("err")}})
	result := out(&pb.ExecOut{Msg: &pb.ExecOut_Result{Result: &pb.ExecResult{ExitCode: 3, DurationNs: 5}}})
	sb := &pb.Sandbox{Name: "b-1", State: "running", Labels: map[string]string{"k": "v"}, CreatedAt: timestamppb.Now()}
	for _, frames := range [][][]byte{
		{fakewire.Marshal(&pb.InfoResponse{Info: &pb.Info{Name: "fake", ProtocolVersions: []int32{ProtocolVersion}}})},
		{fakewire.Marshal(&pb.ConfigSchemaResponse{Fields: []*pb.ConfigField{{Name: "x", Type: "string"}}})},
		{fakewire.Marshal(&pb.CreateResponse{Sandbox: sb})},
		{fakewire.Marshal(&pb.ListResponse{Sandboxes: []*pb.Sandbox{sb, {}}})},
		{fakewire.Marshal(&pb.PullProgress{Layer: "l", Status: "Downloading", Current: 1, Total: 2}), fakewire.Marshal(&pb.PullProgress{})},
		{fakewire.Marshal(&pb.CopyOutChunk{Data: []byte("tar")}), fakewire.Marshal(&pb.AgentData{Data: []byte("agent bytes")})},
		{fakewire.Marshal(&pb.ImportImageResponse{Refs: []string{"busybox:latest"}})},
		{stderr, started, stdout, result},
		{started, stdout},
		{stdout, result},
		{result},
		{started, result, stderr, {0xff}},
		{{0xff}},
		{},
	} {
		for call := range pluginCalls {
			for _, st := range pluginStatusSeeds() {
				f.Add(uint8(call), fakewire.Join(frames...), st)
			}
		}
	}
	f.Fuzz(func(t *testing.T, call uint8, framed, st []byte) {
		srv, c := startFakePlugin(t)
		frames, status := fakewire.Split(framed), fakewire.DecodeStatus(st)
		srv.Set(fakewire.Script{Frames: frames, Status: status})
		statusErr := fakewire.Err(status) != nil
		op := pluginCalls[int(call)%len(pluginCalls)]
		// check checks an error that the status may have caused (fromStatus): a
		// berth kind in the status survives.
		check := func(err error, fromStatus bool) {
			t.Helper()
			if err == nil || err.Error() == "" {
				t.Fatalf("%s: error %v", op, err)
			}
			if se := fakewire.Err(status); fromStatus && se != nil && rpcerr.FromPeer(se) {
				if kind := backend.KindOf(rpcerr.FromStatus(se)); !errors.Is(err, kind) {
					t.Fatalf("%s: the plugin's error says %v, the host's %q does not wrap it", op, kind, err)
				}
			}
		}
		ctx := context.Background()
		var err error
		done := make(chan struct{})
		timer := time.AfterFunc(time.Minute, func() {
			select {
			case <-done:
			default:
				panic(op + " did not return within a minute")
			}
		})
		defer timer.Stop()
		defer close(done)
		answer := []byte{}
		if len(frames) > 0 {
			answer = frames[0]
		}
		unary := func(m proto.Message) (ok bool) {
			t.Helper()
			decodeErr := proto.Unmarshal(answer, m)
			if (err != nil) != (statusErr || decodeErr != nil) {
				t.Fatalf("%s: %v (answer %x: %v, status %v)", op, err, answer, decodeErr, status)
			}
			if err != nil {
				check(err, decodeErr == nil)
			}
			return err == nil
		}
		switch op {
		case "Info":
			var info backend.Info
			info, err = c.Info(ctx)
			var m pb.InfoResponse
			if unary(&m) && (info.Name != m.GetInfo().GetName() || len(info.ProtocolVersions) != len(m.GetInfo().GetProtocolVersions())) {
				t.Fatalf("Info = %+v from %v", info, &m)
			}
		case "ConfigSchema":
			var fields []backend.ConfigField
			fields, err = c.ConfigSchema(ctx)
			var m pb.ConfigSchemaResponse
			if unary(&m) && len(fields) != len(m.Fields) {
				t.Fatalf("ConfigSchema = %+v from %v", fields, &m)
			}
		case "Configure":
			err = c.Configure(ctx, backend.DriverSetup{StateDir: "/s", Owner: "o"})
			unary(&pb.ConfigureResponse{})
		case "Create", "Inspect":
			var s backend.Sandbox
			if op == "Create" {
				s, err = c.Create(ctx, backend.CreateRequest{Spec: backend.SandboxSpec{Name: "b-1"}})
			} else {
				s, err = c.Inspect(ctx, "b-1")
			}
			var m pb.InspectResponse // the same fields as CreateResponse
			if unary(&m) && (s.Name != m.GetSandbox().GetName() || !s.CreatedAt.IsZero() && s.CreatedAt.Location() != time.UTC) {
				t.Fatalf("%s = %+v from %v", op, s, &m)
			}
		case "List":
			var ss []backend.Sandbox
			ss, err = c.List(ctx, map[string]string{"berth.owner": "o"})
			var m pb.ListResponse
			if unary(&m) && len(ss) != len(m.Sandboxes) {
				t.Fatalf("List = %+v from %v", ss, &m)
			}
		case "Stop":
			err = c.Stop(ctx, "b-1", time.Second)
			unary(&pb.StopResponse{})
		case "Remove":
			err = c.Remove(ctx, "b-1")
			unary(&pb.RemoveResponse{})
		case "Validate":
			err = c.Validate(ctx, backend.SandboxSpec{Name: "b-1"})
			unary(&pb.ValidateResponse{})
		case "CopyIn", "ImportImage":
			// A client stream: exactly one answer, or the call fails.
			var refs []string
			if op == "CopyIn" {
				err = c.CopyIn(ctx, "b-1", "/x", strings.NewReader("a tar stream"))
			} else {
				refs, err = c.ImportImage(ctx, strings.NewReader("an image archive"))
			}
			var m pb.ImportImageResponse
			decodeErr := proto.Unmarshal(answer, &m)
			if op == "CopyIn" {
				decodeErr = proto.Unmarshal(answer, &pb.CopyInResponse{})
			}
			if (err != nil) != (statusErr || decodeErr != nil || len(frames) != 1) {
				t.Fatalf("%s: %v (frames %x, status %v)", op, err, frames, status)
			}
			if err != nil {
				check(err, decodeErr == nil && len(frames) == 1)
			} else if op == "ImportImage" && len(refs) != len(m.Refs) {
				t.Fatalf("ImportImage = %v from %v", refs, &m)
			}
		case "CopyOut", "PullImage", "DialAgent":
			// What the host must pass on: the frames up to the first that is not
			// a message of the call.
			var w, want bytes.Buffer
			var progress, wantProgress []backend.PullProgress
			cut := false
			for _, fr := range frames {
				var e error
				switch op {
				case "CopyOut":
					var m pb.CopyOutChunk
					if e = proto.Unmarshal(fr, &m); e == nil {
						want.Write(m.Data)
					}
				case "PullImage":
					var m pb.PullProgress
					if e = proto.Unmarshal(fr, &m); e == nil {
						wantProgress = append(wantProgress, progressFromPB(&m))
					}
				case "DialAgent":
					var m pb.AgentData
					if e = proto.Unmarshal(fr, &m); e == nil {
						want.Write(m.Data)
					}
				}
				if e != nil {
					cut = true
					break
				}
			}
			switch op {
			case "CopyOut":
				err = c.CopyOut(ctx, "b-1", "/x", &w)
			case "PullImage":
				err = c.PullImage(ctx, "busybox", backend.PullMissing, func(p backend.PullProgress) { progress = append(progress, p) })
			case "DialAgent":
				var conn net.Conn
				if conn, err = c.DialAgent(ctx, "b-1"); err == nil {
					_, err = io.Copy(&w, conn)
					conn.Close()
				}
			}
			if !bytes.Equal(w.Bytes(), want.Bytes()) || !slices.Equal(progress, wantProgress) {
				t.Fatalf("%s: got %q %v, the plugin sent %q %v", op, w.Bytes(), progress, want.Bytes(), wantProgress)
			}
			if (err != nil) != (cut || statusErr) {
				t.Fatalf("%s: %v (a frame that is not a message: %v, status %v)", op, err, cut, status)
			}
			if err != nil {
				check(err, !cut)
			}
		case "Exec":
			var msgs []*pb.ExecOut
			cut := false
			for _, fr := range frames {
				var m pb.ExecOut
				if proto.Unmarshal(fr, &m) != nil {
					cut = true
					break
				}
				msgs = append(msgs, &m)
			}
			var stdout, stderr bytes.Buffer
			p, err := c.Exec(ctx, "b-1", backend.ExecRequest{Argv: []string{"true"}, Stdout: &stdout, Stderr: &stderr})
			var wantOut, wantErr []byte
			i := 0
			for ; i < len(msgs) && msgs[i].GetStarted() == nil; i++ {
				switch x := msgs[i].Msg.(type) {
				case *pb.ExecOut_Stdout:
					wantOut = append(wantOut, x.Stdout...)
				case *pb.ExecOut_Stderr:
					wantErr = append(wantErr, x.Stderr...)
				default:
					i = len(msgs) + 1 // neither output nor started: the start fails
				}
			}
			if i >= len(msgs) {
				if err == nil {
					t.Fatalf("Exec started on %v", msgs)
				}
				check(err, i == len(msgs) && !cut)
				return
			}
			if err != nil {
				t.Fatalf("Exec: %v, though the plugin sent started", err)
			}
			res, err := p.Wait()
			var want *pb.ExecResult
			for _, m := range msgs[i+1:] {
				switch x := m.Msg.(type) {
				case *pb.ExecOut_Stdout:
					wantOut = append(wantOut, x.Stdout...)
				case *pb.ExecOut_Stderr:
					wantErr = append(wantErr, x.Stderr...)
				case *pb.ExecOut_Result:
					if x.Result != nil {
						want = x.Result
					}
				}
			}
			if !bytes.Equal(stdout.Bytes(), wantOut) || !bytes.Equal(stderr.Bytes(), wantErr) {
				t.Fatalf("Exec: stdout %q stderr %q, the plugin sent %q and %q", stdout.Bytes(), stderr.Bytes(), wantOut, wantErr)
			}
			switch {
			case want == nil:
				if err == nil {
					t.Fatalf("Exec: Wait = %+v without a result from the plugin", res)
				}
				if !cut && !statusErr && !errors.Is(err, backend.ErrUnavailable) {
					t.Fatalf("Exec: a stream without a result: %v, want ErrUnavailable", err)
				}
				check(err, !cut)
			case cut || statusErr:
				// A result, then a broken stream or an error: the error wins.
				if err == nil {
					t.Fatalf("Exec: Wait = %+v, nil after a broken stream", res)
				}
			default:
				if err != nil || res != resultFromPB(want) {
					t.Fatalf("Exec: Wait = %+v, %v; the plugin's result was %v", res, err, want)
				}
			}
		}
	})
}
