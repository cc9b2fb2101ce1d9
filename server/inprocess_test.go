package server

// The files routes and the TTY through the server in this process, over a registry
// on the local driver (this test binary is the sandboxes' agent), so that go test
// -race sees the handlers; cli's tests run the same routes in a real berth
// serve.

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
	"github.com/berth-sh/berth/server/apiv1"
)

func TestMain(m *testing.M) {
	if agent.IsAgent() {
		os.Exit(agent.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// inProcess starts a server over a new registry on local in its own state dir.
func inProcess(t *testing.T) *httptest.Server {
	t.Helper()
	ctx := context.Background()
	reg, err := registry.Open(ctx, nil, registry.WithStateDir(t.TempDir()),
		registry.WithDriver(local.Name, func() backend.TerminalBackend { return local.New() }))
	if err != nil {
		t.Fatal(err)
	}
	s := New(reg)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		reg.RemoveSession(ctx, "s")
		s.Shutdown(ctx)
	})
	return ts
}

// A tar round trip and a file's bytes through the handlers.
func TestFilesInProcess(t *testing.T) {
	ts := inProcess(t)
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o750})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "d/f", Mode: 0o640, Size: 5})
	tw.Write([]byte("hello"))
	tw.Close()
	req, _ := http.NewRequest("PUT", ts.URL+"/v1/sessions/s/archive?path=.", &in)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != `{"entries":2,"bytes":5}`+"\n" {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	resp, err = http.Get(ts.URL + "/v1/sessions/s/archive?path=d")
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(resp.Body)
	var got []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		body, _ := io.ReadAll(tr)
		got = append(got, h.Name+" "+string(body))
	}
	resp.Body.Close()
	if strings.Join(got, ",") != "d/ ,d/f hello" {
		t.Errorf("download: %v", got)
	}
	resp, err = http.Get(ts.URL + "/v1/sessions/s/files?path=d/f")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello" || resp.Header.Get(apiv1.ModeHeader) != "0640" {
		t.Errorf("file: %d %q %v", resp.StatusCode, b, resp.Header)
	}
}

// A TTY through the handler: started first, output, a resize in order with stdin,
// a signal, the result last. The signal interrupts the read builtin, whose trap then
// runs at once (a sleep would race: a signal before it starts waits for its end).
func TestTTYInProcess(t *testing.T) {
	ts := inProcess(t)
	ctx := context.Background()
	u := "ws" + strings.TrimPrefix(ts.URL, "http") + "/v1/sessions/s/tty?argv=sh&argv=-c&argv=" +
		"stty+size%3B+read+x%3B+stty+size%3B+trap+%27exit+9%27+TERM%3B+echo+ready%3B+read+never&rows=10&cols=20"
	c, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	// The reader sends output and messages on in the order they came.
	outs := make(chan []byte, 64)
	msgs := make(chan apiv1.TTYMessage, 4)
	go func() {
		defer close(msgs)
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				outs <- b
				continue
			}
			var m apiv1.TTYMessage
			json.Unmarshal(b, &m)
			msgs <- m
		}
	}()
	if m := <-msgs; m.Type != "started" || m.Driver != "local" {
		t.Fatalf("first message %+v", m)
	}
	var out strings.Builder
	waitOut := func(s string) {
		for !strings.Contains(out.String(), s) {
			out.Write(<-outs)
		}
	}
	waitOut("10 20")
	c.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","rows":40,"cols":100}`))
	c.Write(ctx, websocket.MessageBinary, []byte("go\n"))
	waitOut("ready")
	if !strings.Contains(out.String(), "40 100") {
		t.Errorf("after the resize: %q", out.String())
	}
	c.Write(ctx, websocket.MessageText, []byte(`{"type":"signal","signal":"TERM"}`))
	m := <-msgs
	if m.Type != "result" || m.Result == nil || m.Result.ExitCode != 9 {
		t.Errorf("last message %+v (%+v)", m, m.Result)
	}
}
