package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"unicode"

	"github.com/coder/websocket"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/server/apiv1"
)

// FuzzExecRequest feeds any body to the exec handler's decoding and checks
// (readJSON, then ExecRequest.check): it never panics; a refusal is an error of the
// HTTP layer, invalid (or too_large past the limit), with a printable message; an
// accepted body is exactly one of a plain exec and a shell-mode command, with
// environment entries NAME=VALUE (NAME non-empty, without '='), no NUL anywhere, no
// negative cap and no timeout below zero.
func FuzzExecRequest(f *testing.F) {
	for _, seed := range []string{
		`{"argv":["sh","-c","echo hi; exit 3"]}`,
		`{"command":"cd /tmp && export X=1","env":{"A":"b"},"cwd":"/","timeout":"30s","max_output":0}`,
		`{"argv":["cat"],"stdin":"x","stdin_base64":"eA=="}`,
		`{"argv":["cat"],"stdin_base64":"AAEC/w==","recreate":true,"user":"1000"}`,
		`{"argv":["true"],"argz":1}`, `{"argv":"true"}`, `{"argv":["true"]} {}`, `{}`, ``, `[`,
		`{"argv":["tr\u0000ue"]}`, `{"argv":["true"],"env":{"A=B":"c"}}`, `{"argv":["true"],"timeout":"-1s"}`,
		`{"argv":[""],"max_output":-1}`, `{"command":"   "}`, `{"command":"x","user":"root"}`,
	} {
		f.Add([]byte(seed))
	}
	s := New(nil, WithMaxRequestBody(4096))
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "http://berth/v1/sessions/s/exec", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		var req apiv1.ExecRequest
		err := s.readJSON(httptest.NewRecorder(), r, &req)
		var c *execCall
		if err == nil {
			c, err = checkExec(&req)
		}
		if err != nil {
			var he *httpError
			if !errors.As(err, &he) || (he.kind != "invalid" && he.kind != apiv1.KindTooLarge) {
				t.Fatalf("refusal %v (%T) is not invalid or too_large", err, err)
			}
			if he.kind == apiv1.KindTooLarge && len(body) <= 4096 {
				t.Fatalf("a %d-byte body refused as too large", len(body))
			}
			for _, r := range err.Error() {
				if !unicode.IsPrint(r) {
					t.Fatalf("refusal %q holds %U", err, r)
				}
			}
			return
		}
		if (len(c.argv) > 0) == c.shell || (c.shell && strings.TrimSpace(c.command) == "") || (!c.shell && c.argv[0] == "") {
			t.Fatalf("accepted %q as %+v: want exactly one of argv and a command", body, c)
		}
		for _, kv := range c.env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				t.Fatalf("accepted env entry %q", kv)
			}
		}
		for _, v := range append(append(append([]string{}, c.argv...), c.env...), c.command, c.cwd, c.user) {
			if strings.ContainsRune(v, 0) {
				t.Fatalf("accepted a NUL in %q", v)
			}
		}
		if c.timeout < 0 || (c.max != nil && *c.max < 0) || (c.shell && c.user != "") {
			t.Fatalf("accepted %+v", c)
		}
	})
}

// FuzzExecBody feeds any bytes, as the input events of a streamed exec request (the
// body after its first line), to the reader that serve runs for it (input.read),
// with a line limit of fuzzLineLimit bytes. It checks: the reader reads the body to
// its end (so that the handler never returns while it reads); a refusal is invalid
// or too_large, names its input event and is printable; the stdin that reaches the
// command (the spool) is a prefix of the stdin events' data before the first eof,
// all of it when nothing was refused, and then ends (EOF); nothing after an eof
// ever reaches it; signals passed on are 1 to 64.
func FuzzExecBody(f *testing.F) {
	ev := func(s string) string {
		return `{"event":"stdin","data":"` + base64.StdEncoding.EncodeToString([]byte(s)) + `"}` + "\n"
	}
	for _, seed := range []string{
		ev("hello\n") + `{"event":"eof"}` + "\n",
		ev("one") + `{"event":"eof"}` + "\n" + ev("two"),
		ev("a") + `{"event":"signal","signal":2}` + "\n" + `{"event":"cancel"}` + "\n" + ev("b"),
		ev("a") + "hello\n" + ev("b"),
		ev("partial") + `{"event":"stdin","data":"eA=="}`,
		ev("x") + `{"event":"stdin","data":"` + strings.Repeat("QUFB", 100) + `"}` + "\n" + ev("y"),
		`{"event":"signal","signal":65}` + "\n", `{"event":"bogus"}` + "\n", `{"event":"stdin","data":"!!"}` + "\n",
		`{"event":"stdin","data":"eA==","extra":1}` + "\n", `{"event":"stdin","data":"eA=="} {}` + "\n", "\n\n", "\r\n", " ", "null\n",
		`{"event":"eof"}` + "\r\n" + `{"event":"eof"}` + "\n",
	} {
		f.Add([]byte(seed))
	}
	dir := f.TempDir() // spool files are unlinked as they are made
	f.Fuzz(func(t *testing.T, body []byte) {
		cancelled := false
		in := startInput(bufio.NewReaderSize(bytes.NewReader(body), 64), fuzzLineLimit, newSpool(dir, MaxStdinBuffered), func() { cancelled = true })
		<-in.done
		defer in.sp.Close()
		if in.bodyErr != nil {
			t.Fatalf("a body that ends cleanly ended with %v", in.bodyErr)
		}
		bad := in.badEvent()
		if bad != nil {
			var he *httpError
			if !errors.As(bad, &he) || (he.kind != "invalid" && he.kind != apiv1.KindTooLarge) || !strings.HasPrefix(he.Error(), "input event ") {
				t.Fatalf("refusal %v (%T): want invalid or too_large, naming its event", bad, bad)
			}
			for _, r := range bad.Error() {
				if !unicode.IsPrint(r) {
					t.Fatalf("refusal %q holds %U", bad, r)
				}
			}
			if !cancelled {
				t.Fatalf("refusal %v did not cancel the call", bad)
			}
		}
		// What reached the command: the spool's bytes.
		in.sp.mu.Lock()
		n, eof := in.sp.w, in.sp.eof
		in.sp.mu.Unlock()
		got := make([]byte, n)
		if _, err := io.ReadFull(in.sp, got); err != nil {
			t.Fatalf("reading the %d spooled bytes: %v", n, err)
		}
		if bad == nil && !eof {
			t.Fatalf("a body read whole without a refusal did not end the stdin")
		}
		if eof {
			if k, err := in.sp.Read(make([]byte, 1)); k != 0 || err != io.EOF {
				t.Fatalf("read past the stdin's end: %d, %v; want EOF", k, err)
			}
		}
		// A lenient reading of the same lines: stdin data up to the first eof.
		var want []byte
		for _, line := range bytes.Split(body, []byte("\n")) {
			var e apiv1.Event
			if json.Unmarshal(bytes.TrimSuffix(line, []byte("\r")), &e) != nil || e.Event == apiv1.InputEOF {
				break
			}
			if e.Event == apiv1.InputStdin {
				want = append(want, e.Data...)
			}
		}
		if !bytes.HasPrefix(want, got) || (bad == nil && !bytes.Equal(got, want)) {
			t.Fatalf("the command got %q; want %q (or a prefix of it after the refusal %v)", got, want, bad)
		}
		for len(in.signals) > 0 {
			if sig := <-in.signals; sig < 1 || sig > 64 {
				t.Fatalf("signal %d passed on", sig)
			}
		}
	})
}

// fuzzLineLimit is FuzzExecBody's longest event line and FuzzTTYFrames' largest
// message: small, so that the fuzzer meets the limit.
const fuzzLineLimit = 512

// FuzzTTYFrames sends any sequence of WebSocket messages (ttyFrames decodes the
// fuzzer's bytes into them) to a TTY's reader of client messages (ttyConn.readLoop)
// over a real WebSocket, its read limit fuzzLineLimit bytes, against a process that
// records what it is sent. It checks: the reader ends with the client gone or an
// invalid error with a printable message; what the process got is, in order, the
// binary messages' bytes as its stdin and one resize, signal (1 to 64), eof or
// cancel for each accepted text message, as a lenient reading of the messages
// gives them; the reader stops at the first message it refuses (nothing after it
// is applied), and it refuses every message that the lenient reading cannot apply.
func FuzzTTYFrames(f *testing.F) {
	for _, seed := range [][]ttyFrame{
		{{false, "ls\n"}, {true, `{"type":"resize","rows":40,"cols":100}`}, {false, "x"}, {true, `{"type":"eof"}`}},
		{{true, `{"type":"signal","signal":"INT"}`}, {true, `{"type":"signal","signal":"15"}`}, {true, `{"type":"cancel"}`}},
		{{true, `{"type":"signal","signal":"NOPE"}`}, {false, "after"}},
		{{true, `{"type":"resize","rows":0,"cols":1}`}}, {{true, `{"type":"eof"} {}`}}, {{true, `{"type":"eof","x":1}`}},
		{{true, `{"type":"started"}`}}, {{true, ``}}, {{true, `null`}}, {{false, ""}, {false, strings.Repeat("b", fuzzLineLimit+1)}},
		{{true, `{"type":"resize","rows":70000,"cols":1}`}}, {{true, `{"type":"signal","signal":"-1"}`}},
	} {
		f.Add(encodeTTYFrames(seed))
	}
	type outcome struct {
		ops []ttyOp
		err error
	}
	results := make(chan outcome, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		conn.SetReadLimit(fuzzLineLimit)
		p := &recordingProcess{}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		t := &ttyConn{conn: conn, ctx: ctx, ready: make(chan struct{}), cancel: func() { p.add(ttyOp{kind: "cancel"}) }}
		err = t.readLoop(p)
		results <- outcome{p.ops, err}
	}))
	defer ts.Close()
	url := "ws" + strings.TrimPrefix(ts.URL, "http")
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := ttyFrames(data)
		ctx := context.Background()
		c, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, fr := range frames {
			typ := websocket.MessageBinary
			if fr.text {
				typ = websocket.MessageText
			}
			if c.Write(ctx, typ, []byte(fr.data)) != nil {
				break // the server has stopped reading
			}
		}
		c.CloseNow()
		res := <-results
		var he *httpError
		switch {
		case errors.Is(res.err, errClientGone):
		case errors.As(res.err, &he) && he.kind == "invalid":
			for _, r := range he.Error() {
				if !unicode.IsPrint(r) {
					t.Fatalf("refusal %q holds %U", he, r)
				}
			}
		default:
			t.Fatalf("the reader ended with %v (%T); want the client gone or invalid", res.err, res.err)
		}
		// The lenient reading, until the first message it cannot apply.
		var want []ttyOp
		stopped, tooBig := false, false
		for _, fr := range frames {
			if len(fr.data) > fuzzLineLimit {
				tooBig = true
				break
			}
			if !fr.text {
				if len(fr.data) > 0 {
					want = appendWrite(want, []byte(fr.data))
				}
				continue
			}
			var m apiv1.TTYMessage
			if json.Unmarshal([]byte(fr.data), &m) != nil {
				stopped = true
				break
			}
			op := ttyOp{kind: m.Type}
			switch m.Type {
			case "resize":
				if m.Rows == 0 || m.Cols == 0 {
					stopped = true
				}
				op.rows, op.cols = m.Rows, m.Cols
			case "signal", "eof", "cancel":
			default:
				stopped = true
			}
			if stopped {
				break
			}
			want = append(want, op)
		}
		if len(res.ops) > len(want) {
			t.Fatalf("the process got %+v; the messages give only %+v", res.ops, want)
		}
		for i, op := range res.ops {
			w := want[i]
			last := i == len(res.ops)-1
			switch {
			case op.kind != w.kind, op.rows != w.rows || op.cols != w.cols,
				op.kind == "write" && !(bytes.Equal(op.data, w.data) || (last && bytes.HasPrefix(w.data, op.data))),
				op.kind == "signal" && (op.sig < 1 || op.sig > 64):
				t.Fatalf("the process's op %d is %+v; the messages give %+v", i, op, w)
			}
		}
		if stopped && !tooBig && he == nil {
			t.Fatalf("a message the reader must refuse was not refused (%v); the process got %+v", res.err, res.ops)
		}
		if !stopped && !tooBig && he == nil && len(res.ops) != len(want) {
			t.Fatalf("the process got %+v; want %+v", res.ops, want)
		}
	})
}

// ttyFrame is one WebSocket message of FuzzTTYFrames.
type ttyFrame struct {
	text bool
	data string
}

// ttyFrames decodes a fuzz input: each message is two header bytes (bit 0 of the
// first: text, else binary; its other bits and the second byte: the length, up to
// 32767) and that many bytes (fewer at the input's end).
func ttyFrames(b []byte) []ttyFrame {
	var out []ttyFrame
	for len(b) >= 2 {
		n := min(int(b[0]>>1)<<8|int(b[1]), len(b)-2)
		out = append(out, ttyFrame{text: b[0]&1 == 1, data: string(b[2 : 2+n])})
		b = b[2+n:]
	}
	return out
}

// encodeTTYFrames is ttyFrames' inverse, for seeds.
func encodeTTYFrames(frames []ttyFrame) []byte {
	var b []byte
	for _, fr := range frames {
		h := byte(len(fr.data)>>8) << 1
		if fr.text {
			h |= 1
		}
		b = append(append(b, h, byte(len(fr.data))), fr.data...)
	}
	return b
}

// ttyOp is one call a recordingProcess got (consecutive writes merged).
type ttyOp struct {
	kind       string // write, resize, signal, eof, cancel
	data       []byte
	rows, cols uint16
	sig        int
}

// appendWrite adds b to ops as a write, merged into a write just before it.
func appendWrite(ops []ttyOp, b []byte) []ttyOp {
	if n := len(ops); n > 0 && ops[n-1].kind == "write" {
		ops[n-1].data = append(ops[n-1].data, b...)
		return ops
	}
	return append(ops, ttyOp{kind: "write", data: append([]byte(nil), b...)})
}

// recordingProcess is a backend.Process that records what it is sent.
type recordingProcess struct {
	mu  sync.Mutex
	ops []ttyOp
}

func (p *recordingProcess) add(op ttyOp) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ops = append(p.ops, op)
}

func (p *recordingProcess) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ops = appendWrite(p.ops, b)
	return len(b), nil
}

func (p *recordingProcess) CloseStdin() error { p.add(ttyOp{kind: "eof"}); return nil }

func (p *recordingProcess) Resize(s backend.WindowSize) error {
	p.add(ttyOp{kind: "resize", rows: s.Rows, cols: s.Cols})
	return nil
}

func (p *recordingProcess) Signal(sig int) error { p.add(ttyOp{kind: "signal", sig: sig}); return nil }

func (p *recordingProcess) Wait() (backend.ExecResult, error) { return backend.ExecResult{}, nil }
