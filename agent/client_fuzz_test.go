package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/rpcerr"
	"github.com/berth-sh/berth/internal/testsupport/fakewire"
)

// Fuzz targets of the agent client against a hostile agent (docs/fuzzing.md): a
// server in this process (internal/testsupport/fakewire) answers berth's handshake and every
// call with fuzzed bytes, which the client reads over a real gRPC connection.
// FuzzAgentConnect fuzzes the handshake answer (with the Hello answer in it, or
// without, and then the Hello call's answer); FuzzAgentCalls the
// frames and the status of exec, shell, job and copy calls on one connection.

// fakeAgentCreds is a fake agent's side of berth's handshake: it reads the client's
// line and answers with what answer holds; unless that starts with the OK line, the
// connection is closed after it.
type fakeAgentCreds struct{ answer *atomic.Pointer[[]byte] }

func (c fakeAgentCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetDeadline(time.Time{})
	if _, err := readClientLine(conn); err != nil {
		return nil, nil, err
	}
	answer := *c.answer.Load()
	if _, err := conn.Write(answer); err != nil {
		return nil, nil, err
	}
	if line, _, ended := bytes.Cut(answer, []byte("\n")); !ended || !bytes.Equal(line, []byte(handshakeMagic+" OK")) && !bytes.HasPrefix(line, []byte(handshakeMagic+" OK ")) {
		return nil, nil, errors.New("fake agent: handshake refused")
	}
	return conn, tokenAuth{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (fakeAgentCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("server side only")
}
func (fakeAgentCreds) Info() credentials.ProtocolInfo            { return credentials.ProtocolInfo{} }
func (c fakeAgentCreds) Clone() credentials.TransportCredentials { return c }
func (fakeAgentCreds) OverrideServerName(string) error           { return nil }

// fakeAgent is one fake agent per fuzz process, and a client connected to it.
var fakeAgent struct {
	once   sync.Once
	srv    *fakewire.Server
	answer atomic.Pointer[[]byte]
	client *Client
	err    error
}

var okAnswer = []byte(handshakeMagic + " OK\n")

// helloAnswer is a version-2 handshake answer carrying the Hello answer hello.
func helloAnswer(hello []byte) []byte {
	return []byte(handshakeMagic + " OK " + base64.RawURLEncoding.EncodeToString(hello) + "\n")
}

// goodHello is a Hello answer the client accepts.
var goodHello = fakewire.Marshal(&agentpb.HelloResponse{Versions: []int32{ProtocolVersion}, Protocol: ProtocolVersion, Pid: 1, Instance: "fuzz"})

func startFakeAgent(t *testing.T) (*fakewire.Server, *Client) {
	fakeAgent.once.Do(func() {
		fakeAgent.answer.Store(&okAnswer)
		fakeAgent.srv = fakewire.NewServer(&agentpb.Agent_ServiceDesc, grpc.Creds(fakeAgentCreds{&fakeAgent.answer}))
		fakeAgent.srv.Set(fakewire.Script{Frames: [][]byte{goodHello}})
		fakeAgent.client, fakeAgent.err = NewClient(context.Background(), fakeAgent.srv.Dial)
	})
	if fakeAgent.err != nil {
		t.Fatalf("connecting to the fake agent: %v", fakeAgent.err)
	}
	return fakeAgent.srv, fakeAgent.client
}

// statusSeeds are google.rpc.Status messages a hostile agent might end a call with.
func statusSeeds() [][]byte {
	info := func(domain, reason string) *anypb.Any {
		a, err := anypb.New(&errdetails.ErrorInfo{Domain: domain, Reason: reason})
		if err != nil {
			panic(err)
		}
		return a
	}
	return [][]byte{
		nil,
		fakewire.Marshal(&spb.Status{Code: int32(codes.NotFound), Message: "no such job", Details: []*anypb.Any{info(rpcerr.Domain, "not_found")}}),
		fakewire.Marshal(&spb.Status{Code: int32(codes.InvalidArgument), Message: "bad", Details: []*anypb.Any{info(rpcerr.Domain, "timeout")}}),
		fakewire.Marshal(&spb.Status{Code: int32(codes.Unknown), Message: "wrong domain", Details: []*anypb.Any{info("evil", "not_found"), {TypeUrl: "x", Value: []byte{0xff}}}}),
		fakewire.Marshal(&spb.Status{Code: int32(codes.Unavailable), Message: "gone"}),
		fakewire.Marshal(&spb.Status{Code: int32(codes.Canceled)}),
		fakewire.Marshal(&spb.Status{Code: 999, Message: "no such code"}),
	}
}

// printable fails t when err's text holds a control or format character (an escape
// sequence, a line break, a bidi override): a hostile agent's text must not reach
// the terminal raw.
func printable(t *testing.T, what string, err error) {
	t.Helper()
	if r, ok := unprintable(err.Error()); ok {
		t.Fatalf("%s: the error holds the control character %q from the agent: %q", what, r, err)
	}
}

// unprintable returns the first control, format or line/paragraph separator
// character of s.
func unprintable(s string) (rune, bool) {
	for _, r := range s {
		if unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
			return r, true
		}
	}
	return 0, false
}

// checkKind fails t when st names a berth kind that err lost.
func checkKind(t *testing.T, what string, err error, st *spb.Status) {
	t.Helper()
	se := fakewire.Err(st)
	if se == nil || !rpcerr.FromPeer(se) {
		return
	}
	if kind := backend.KindOf(rpcerr.FromStatus(se)); !errors.Is(err, kind) {
		t.Fatalf("%s: the agent's error says %v, the client's %q does not wrap it", what, kind, err)
	}
}

func FuzzAgentConnect(f *testing.F) {
	for _, s := range []struct {
		answer []byte
		hello  []byte
	}{
		{okAnswer, goodHello},
		{okAnswer, fakewire.Marshal(&agentpb.HelloResponse{Protocol: ProtocolVersion - 1, Instance: "old", OomWatch: true, ExecUser: "1000"})},
		{okAnswer, fakewire.Marshal(&agentpb.HelloResponse{Protocol: 99})},
		{okAnswer, fakewire.Marshal(&agentpb.HelloResponse{Protocol: -1, Pid: -5})},
		{okAnswer, nil},
		{okAnswer, []byte{0xff, 0xff}},
		{[]byte(handshakeMagic + " DENIED wrong token\n"), nil},
		{[]byte(handshakeMagic + " OK"), goodHello},
		{[]byte(handshakeMagic + " OK\ngarbage before HTTP/2"), goodHello},
		{helloAnswer(goodHello), nil},
		{helloAnswer(fakewire.Marshal(&agentpb.HelloResponse{Protocol: ProtocolVersion - 1, Instance: "old", OomWatch: true, ExecUser: "1000"})), nil},
		{helloAnswer(fakewire.Marshal(&agentpb.HelloResponse{Versions: []int32{99}})), nil},
		{helloAnswer(fakewire.Marshal(&agentpb.HelloResponse{Protocol: 99})), nil},
		{helloAnswer([]byte{0xff, 0xff}), nil},
		{[]byte(handshakeMagic + " OK !!not-base64\n"), nil},
		{[]byte(handshakeMagic + " DENIED not a berth handshake\n"), nil},
		{[]byte(handshakeMagic + " OK " + strings.Repeat("A", 2000) + "\n"), nil},
		{[]byte("HTTP/1.1 400 Bad Request\r\n\r\n"), nil},
		{[]byte(strings.Repeat("A", 300)), nil},
		{nil, nil},
	} {
		for _, st := range statusSeeds() {
			f.Add(s.answer, s.hello, st)
		}
	}
	f.Fuzz(func(t *testing.T, answer, hello, st []byte) {
		srv, _ := startFakeAgent(t)
		fakeAgent.answer.Store(&answer)
		status := fakewire.DecodeStatus(st)
		srv.Set(fakewire.Script{Frames: [][]byte{hello}, Status: status})
		defer func() {
			fakeAgent.answer.Store(&okAnswer)
			srv.Set(fakewire.Script{Frames: [][]byte{goodHello}})
		}()
		var c *Client
		err := bounded(t, "NewClient", func() (err error) {
			c, err = NewClient(context.Background(), srv.Dial, WithHelloTimeout(20*time.Second))
			return err
		})
		line, _, _ := bytes.Cut(answer[:min(len(answer), answerMax)], []byte("\n"))
		// A version-2 answer carries the Hello answer; the client accepts it when it
		// is a HelloResponse choosing a version the client speaks.
		payload, v2 := strings.CutPrefix(string(line), handshakeMagic+" OK ")
		var inAnswer *agentpb.HelloResponse
		if v2 {
			if b, err := base64.RawURLEncoding.DecodeString(payload); err == nil {
				var resp agentpb.HelloResponse
				if proto.Unmarshal(b, &resp) == nil && resp.Protocol > 0 && slices.Contains(clientVersions(), int(resp.Protocol)) {
					inAnswer = &resp
				}
			}
		}
		if err != nil {
			if inAnswer != nil {
				t.Fatalf("NewClient refused the good Hello answer %v in the handshake answer: %v", inAnswer, err)
			}
			printable(t, "NewClient", err)
			if backend.KindOf(err) == nil {
				t.Fatalf("NewClient: %q has no kind", err)
			}
			if string(line) == handshakeMagic+" OK" && len(answer) == len(okAnswer) {
				// The handshake passed: Hello's answer was refused.
				var resp agentpb.HelloResponse
				if fakewire.Err(status) == nil && proto.Unmarshal(hello, &resp) == nil && slices.Contains(clientVersions(), int(resp.Protocol)) {
					t.Fatalf("NewClient refused the good Hello answer %v: %v", &resp, err)
				}
				checkKind(t, "Hello", err, status)
			}
			return
		}
		defer c.Close()
		resp := inAnswer
		switch {
		case resp != nil:
		case string(line) != handshakeMagic+" OK":
			t.Fatalf("NewClient accepted the handshake answer %q", answer)
		default:
			resp = &agentpb.HelloResponse{}
			if err := proto.Unmarshal(hello, resp); err != nil {
				t.Fatalf("NewClient accepted the Hello answer %x, which is not a HelloResponse: %v", hello, err)
			}
		}
		if !slices.Contains(clientVersions(), c.Protocol()) || c.Protocol() != int(resp.Protocol) || c.Instance() != resp.Instance ||
			c.PID() != int(resp.Pid) || c.ExecUser() != resp.ExecUser || c.WatchesOOM() != resp.OomWatch {
			t.Fatalf("NewClient: protocol %d instance %q pid %d user %q oom %v from %v", c.Protocol(), c.Instance(), c.PID(), c.ExecUser(), c.WatchesOOM(), resp)
		}
	})
}

// The calls FuzzAgentCalls makes, by the fuzzed byte's value modulo their number.
var agentCalls = []string{"exec", "shell", "job logs", "copy out", "job list", "job start", "copy in", "job kill", "agent shutdown"}

// decodeAll reads frames as messages of new's type up to the first one that is not
// one; cut says whether there was such a frame (the client's call fails there).
func decodeAll[M proto.Message](frames [][]byte, newM func() M) (msgs []M, cut bool) {
	for _, f := range frames {
		m := newM()
		if proto.Unmarshal(f, m) != nil {
			return msgs, true
		}
		msgs = append(msgs, m)
	}
	return msgs, false
}

func FuzzAgentCalls(f *testing.F) {
	out := func(m *agentpb.ExecOutput) []byte { return fakewire.Marshal(m) }
	started := out(&agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Started{Started: &agentpb.ExecStarted{ExecId: 1, Pid: 2}}})
	result := out(&agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Result{Result: &agentpb.ExecResult{ExitCode: 3, Signal: 9, DurationNs: -1, Cwd: "/\x1b[2J"}}})
	stdout := out(&agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Stdout{Stdout: []byte("hello\n")}})
	stderr := out(&agentpb.ExecOutput{Msg: &agentpb.ExecOutput_Stderr{Stderr: []byte("oops\n")}})
	logs := func(m *agentpb.JobLogsOutput) []byte { return fakewire.Marshal(m) }
	job := &agentpb.Job{Id: "j1", Session: "main", Argv: []string{"sleep", "1"}, Pid: 7, Running: true, StartedNs: 1, EndedNs: -1, LogBytes: -1, DroppedBytes: 1 << 62}
	for _, frames := range [][][]byte{
		{started, stdout, stderr, result},
		{started, result, stdout, result},
		{started, stdout},
		{stdout, started, result},
		{result},
		{started, {0xff}},
		{},
		{{}},
		{logs(&agentpb.JobLogsOutput{Msg: &agentpb.JobLogsOutput_Gap{Gap: &agentpb.JobLogsGap{Dropped: -5}}}), logs(&agentpb.JobLogsOutput{Msg: &agentpb.JobLogsOutput_Data{Data: []byte("log")}}),
			logs(&agentpb.JobLogsOutput{Msg: &agentpb.JobLogsOutput_End{End: &agentpb.JobLogsEnd{Offset: -1, Ended: true, ExitCode: 300}}})},
		{logs(&agentpb.JobLogsOutput{Msg: &agentpb.JobLogsOutput_Data{Data: []byte("no end")}})},
		{fakewire.Marshal(&agentpb.CopyOutChunk{Data: []byte("tar bytes")}), fakewire.Marshal(&agentpb.CopyOutChunk{})},
		{fakewire.Marshal(&agentpb.ListJobsResponse{Jobs: []*agentpb.Job{job, {}}})},
		{fakewire.Marshal(job)},
	} {
		for call := range agentCalls {
			for _, st := range statusSeeds() {
				f.Add(uint8(call), fakewire.Join(frames...), st)
			}
		}
	}
	f.Fuzz(func(t *testing.T, call uint8, framed, st []byte) {
		srv, c := startFakeAgent(t)
		frames, status := fakewire.Split(framed), fakewire.DecodeStatus(st)
		srv.Set(fakewire.Script{Frames: frames, Status: status})
		defer srv.Set(fakewire.Script{Frames: [][]byte{goodHello}})
		statusErr := fakewire.Err(status) != nil
		op := agentCalls[int(call)%len(agentCalls)]
		// check checks an error; fromStatus says that the status ended the call
		// (no frame before it made the client give up).
		check := func(err error, fromStatus bool) {
			t.Helper()
			printable(t, op, err)
			if fromStatus {
				checkKind(t, op, err, status)
			}
			if status.GetMessage() == "" && strings.Count(err.Error(), op+":") > 1 {
				t.Fatalf("%s: the error names the call more than once: %q", op, err)
			}
		}
		ctx := context.Background()
		switch op {
		case "exec", "shell":
			msgs, cut := decodeAll(frames, func() *agentpb.ExecOutput { return &agentpb.ExecOutput{} })
			var stdout, stderr bytes.Buffer
			var p backend.Process
			err := bounded(t, op, func() (err error) {
				if op == "exec" {
					p, err = c.Exec(ctx, backend.ExecRequest{Argv: []string{"true"}, Stdout: &stdout, Stderr: &stderr})
				} else {
					p, err = c.Shell(ctx, ShellRequest{Command: "true", Session: "s", Stdout: &stdout, Stderr: &stderr})
				}
				return err
			})
			if len(msgs) == 0 || msgs[0].GetStarted() == nil {
				if err == nil {
					t.Fatalf("%s started on %v (frames %x)", op, msgs, frames)
				}
				check(err, len(msgs) == 0 && !cut)
				return
			}
			if err != nil {
				t.Fatalf("%s: %v, though the agent sent started first", op, err)
			}
			var res backend.ExecResult
			err = bounded(t, op+" Wait", func() (err error) { res, err = p.Wait(); return err })
			// Wait returns at the first result, with the output before it; what an
			// agent sends after it reaches nobody.
			var wantOut, wantErr []byte
			var want *agentpb.ExecResult
			for _, m := range msgs[1:] {
				if want != nil {
					break
				}
				switch x := m.Msg.(type) {
				case *agentpb.ExecOutput_Stdout:
					wantOut = append(wantOut, x.Stdout...)
				case *agentpb.ExecOutput_Stderr:
					wantErr = append(wantErr, x.Stderr...)
				case *agentpb.ExecOutput_Result:
					want = x.Result
				}
			}
			if !bytes.Equal(stdout.Bytes(), wantOut) || !bytes.Equal(stderr.Bytes(), wantErr) {
				t.Fatalf("%s: stdout %q stderr %q, the agent sent %q and %q", op, stdout.Bytes(), stderr.Bytes(), wantOut, wantErr)
			}
			if want == nil {
				if err == nil {
					t.Fatalf("%s: Wait returned %+v without a result from the agent", op, res)
				}
				if !cut && !statusErr && !errors.Is(err, backend.ErrUnavailable) {
					t.Fatalf("%s: an exec ended without a result: %v, want ErrUnavailable", op, err)
				}
				check(err, !cut)
				return
			}
			if err != nil || res.ExitCode != int(want.ExitCode) || res.Signal != int(want.Signal) || res.Cwd != want.Cwd || res.Duration != time.Duration(want.DurationNs) {
				t.Fatalf("%s: Wait = %+v, %v; the agent's result was %v", op, res, err, want)
			}
		case "job logs":
			msgs, cut := decodeAll(frames, func() *agentpb.JobLogsOutput { return &agentpb.JobLogsOutput{} })
			var w bytes.Buffer
			var end JobLogsEnd
			err := bounded(t, op, func() (err error) {
				end, err = c.JobLogs(ctx, JobLogsRequest{Session: "s", ID: "j"}, &w)
				return err
			})
			var want bytes.Buffer
			var wantEnd *agentpb.JobLogsEnd
			for _, m := range msgs {
				if wantEnd != nil {
					break
				}
				switch x := m.Msg.(type) {
				case *agentpb.JobLogsOutput_Gap:
					fmt.Fprintf(&want, "[... %d bytes dropped ...]\n", x.Gap.Dropped)
				case *agentpb.JobLogsOutput_Data:
					want.Write(x.Data)
				case *agentpb.JobLogsOutput_End:
					wantEnd = x.End
				}
			}
			if !bytes.Equal(w.Bytes(), want.Bytes()) {
				t.Fatalf("%s: wrote %q, the agent sent %q", op, w.Bytes(), want.Bytes())
			}
			if wantEnd == nil {
				if err == nil {
					t.Fatalf("%s: returned %+v without an end from the agent", op, end)
				}
				if !cut && !statusErr && !errors.Is(err, backend.ErrUnavailable) {
					t.Fatalf("%s: a log ended without its end: %v, want ErrUnavailable", op, err)
				}
				check(err, !cut)
				return
			}
			if err != nil || end != (JobLogsEnd{Offset: wantEnd.Offset, Ended: wantEnd.Ended, ExitCode: int(wantEnd.ExitCode), Signal: int(wantEnd.Signal)}) {
				t.Fatalf("%s: %+v, %v; the agent's end was %v", op, end, err, wantEnd)
			}
		case "copy out":
			msgs, cut := decodeAll(frames, func() *agentpb.CopyOutChunk { return &agentpb.CopyOutChunk{} })
			var w bytes.Buffer
			err := bounded(t, op, func() error { return c.CopyOut(ctx, "/x", &w) })
			var want []byte
			for _, m := range msgs {
				want = append(want, m.Data...)
			}
			if !bytes.Equal(w.Bytes(), want) {
				t.Fatalf("%s: wrote %q, the agent sent %q", op, w.Bytes(), want)
			}
			if (err != nil) != (cut || statusErr) {
				t.Fatalf("%s: %v (a frame that is no chunk: %v, status %v)", op, err, cut, status)
			}
			if err != nil {
				check(err, !cut)
			}
		default:
			// Unary calls and CopyIn: the first frame is the answer.
			answer := []byte{}
			if len(frames) > 0 {
				answer = frames[0]
			}
			var err error
			var jobs []Job
			var m proto.Message
			switch op {
			case "job list":
				m = &agentpb.ListJobsResponse{}
				err = bounded(t, op, func() (err error) { jobs, err = c.AllJobs(ctx); return err })
			case "job start":
				m = &agentpb.Job{}
				err = bounded(t, op, func() error {
					j, err := c.StartJob(ctx, StartJobRequest{Session: "s", Argv: []string{"true"}})
					jobs = []Job{j}
					return err
				})
			case "copy in":
				m = &agentpb.CopyInResponse{}
				err = bounded(t, op, func() error { return c.CopyIn(ctx, "/x", strings.NewReader("a tar stream")) })
			case "job kill":
				m = &agentpb.KillJobResponse{}
				err = bounded(t, op, func() error { return c.KillJob(ctx, "s", "j") })
			case "agent shutdown":
				m = &agentpb.ShutdownResponse{}
				err = bounded(t, op, func() error { return c.Shutdown(ctx, time.Second) })
			}
			decodeErr := proto.Unmarshal(answer, m)
			// CopyIn's answer comes on a stream: exactly one message, or the
			// call fails (its status is then not read).
			violation := op == "copy in" && len(frames) != 1
			if (err != nil) != (statusErr || decodeErr != nil || violation) {
				t.Fatalf("%s: %v (answer %x: %v, status %v)", op, err, answer, decodeErr, status)
			}
			if err != nil {
				check(err, !violation && decodeErr == nil)
				return
			}
			var want []*agentpb.Job
			switch m := m.(type) {
			case *agentpb.ListJobsResponse:
				want = m.Jobs
			case *agentpb.Job:
				want = []*agentpb.Job{m}
			}
			if len(jobs) != len(want) {
				t.Fatalf("%s: %d jobs, the agent sent %d", op, len(jobs), len(want))
			}
			for i, j := range jobs {
				w := want[i]
				if j.ID != w.Id || j.PID != int(w.Pid) || j.ExitCode != int(w.ExitCode) || !j.Started.Equal(time.Unix(0, w.StartedNs)) ||
					j.Started.Location() != time.UTC || j.Ended.IsZero() != (w.EndedNs == 0) || j.LogBytes != w.LogBytes {
					t.Fatalf("%s: job %+v from %v", op, j, w)
				}
			}
		}
	})
}
