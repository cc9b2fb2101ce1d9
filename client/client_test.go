package client_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/client"
	"github.com/berth-sh/berth/internal/testsupport/benchutil"
	"github.com/berth-sh/berth/internal/testsupport/testbin"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/server/apiv1"
)

// stateDir is the state dir of the berth serve that TestMain starts (on the
// built-in default config: every session on the local driver); its socket is
// stateDir/berth.sock (client.SocketName).
var stateDir string

// TestMain builds berth, starts `berth serve` on a state dir of its own, runs the
// tests and examples against it, removes their sessions and stops it.
func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	defer testbin.Cleanup()
	bin, err := testbin.Berth()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "berth-client-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	stateDir = filepath.Join(tmp, "state")
	serve := exec.Command(bin, "serve")
	serve.Env = benchutil.CLIEnv(filepath.Join(tmp, "xdg"), "BERTH_STATE_DIR="+stateDir)
	var stderr bytes.Buffer
	serve.Stderr = &stderr
	if err := serve.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	exited := make(chan struct{})
	go func() { serve.Wait(); close(exited) }()
	defer func() {
		serve.Process.Signal(syscall.SIGTERM)
		<-exited
	}()
	c, err := client.New(filepath.Join(stateDir, client.SocketName))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	up := testwait.For(context.Background(), 0, func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		_, err := c.Status(context.Background())
		return err == nil
	})
	select {
	case <-exited:
		up = false
	default:
	}
	if !up {
		fmt.Fprintf(os.Stderr, "berth serve did not answer its status call:\n%s", stderr.String())
		return 1
	}
	code := m.Run()
	rows, _ := c.Sessions(context.Background())
	for _, r := range rows {
		c.RemoveSession(context.Background(), r.Session)
	}
	return code
}

// A Go program connects to the berth serve of a state dir, runs a command in
// session chat:42 and reads its output, then removes the session's sandbox.
func Example() {
	ctx := context.Background()
	c, err := client.New(filepath.Join(stateDir, client.SocketName)) // or "https://HOST:PORT", client.WithToken(...)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	res, stdout, _, err := c.Run(ctx, "chat:42", "echo", "hello from chat:42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s(exit %d)\n", stdout, res.ExitCode)
	if err := c.RemoveSession(ctx, "chat:42"); err != nil {
		log.Fatal(err)
	}
	// Output:
	// hello from chat:42
	// (exit 0)
}

func newClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New("unix://" + filepath.Join(stateDir, client.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// New refuses an address it cannot use, naming the address and the fix, before any
// connection.
func TestNewRefuses(t *testing.T) {
	for addr, want := range map[string]string{
		"relative/berth.sock":      "unknown scheme",
		"unix://relative":          "absolute path",
		"tcp://0.0.0.0:8080":       "http://127.0.0.1:8080",
		"http://10.1.2.3:80":       "plain http only to a loopback IP",
		"http://example.com:80":    "plain http only to a loopback IP",
		"https://h:1/v1/x":         "nothing after the port",
		"ftp://127.0.0.1:21":       "unknown scheme",
		"https://user@h:1":         "nothing after the port",
		"http://127.0.0.1:1?x=1":   "nothing after the port",
		"unix://host/berth.sock":   "absolute path",
		"http://[::1]:9":           "",
		"https://berth.example:1":  "",
		"http://127.0.0.1:9":       "",
		"/run/berth/berth.sock":    "",
		"unix:///run/x/berth.sock": "",
	} {
		_, err := client.New(addr)
		switch {
		case want == "" && err != nil:
			t.Errorf("New(%q): %v, want a client", addr, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), addr) || !errors.Is(err, backend.ErrInvalid)):
			t.Errorf("New(%q) = %v, want ErrInvalid naming the address and %q", addr, err, want)
		}
	}
	if _, err := client.New("/x", client.WithToken("a\nb")); err == nil {
		t.Error("WithToken accepted a token with a line break")
	}
	if _, err := client.New("/x", client.WithTLSConfig(nil)); err == nil {
		t.Error("WithTLSConfig accepted nil")
	}
}

// The typed calls against a real berth serve: a command's output, exit code and
// placement, the session in Sessions and Explain, a streamed exec with stdin, a file
// copied in and out, a job's logs, stop and remove; the daemon's error answers are
// *APIError with their kind.
func TestCalls(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	const s = "client-test:1"
	st, err := c.Status(ctx)
	if err != nil || filepath.Clean(st.StateDir) != filepath.Clean(stateDir) || st.PID == 0 {
		t.Fatalf("Status = %+v, %v; want the daemon of %s", st, err, stateDir)
	}
	res, out, errOut, err := c.Run(ctx, s, "sh", "-c", "echo out; echo err >&2; exit 3")
	if err != nil || res.ExitCode != 3 || string(out) != "out\n" || string(errOut) != "err\n" || res.Driver != "local" || res.Session != s {
		t.Fatalf("Run = %+v %q %q %v", res, out, errOut, err)
	}
	rows, err := c.Sessions(ctx)
	if err != nil || !hasSession(rows, s) {
		t.Errorf("Sessions = %+v, %v; want %s", rows, err, s)
	}
	if ex, err := c.Explain(ctx, s); err != nil || ex.Driver != "local" {
		t.Errorf("Explain = %+v, %v", ex, err)
	}
	if ds, err := c.Drivers(ctx); err != nil || len(ds) == 0 {
		t.Errorf("Drivers = %+v, %v", ds, err)
	}

	// A streamed exec reads its stdin from Write and ends at CloseStdin.
	var stdout bytes.Buffer
	p, err := c.Exec(ctx, s, backend.ExecRequest{Argv: []string{"cat"}, Stdin: true, Stdout: &stdout, Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if p.Started() == nil || p.Started().Session != s {
		t.Errorf("Started = %+v", p.Started())
	}
	io.WriteString(p, "via stdin\n")
	p.CloseStdin()
	if r, err := p.Wait(); err != nil || r.ExitCode != 0 || stdout.String() != "via stdin\n" {
		t.Errorf("cat: %+v %v %q", r, err, stdout.String())
	}

	// CopyIn a tar, CopyOut the file back.
	dir := string(bytes.TrimSpace(mustRun(t, c, s, "mktemp", "-d")))
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	tw.WriteHeader(&tar.Header{Name: "f.txt", Mode: 0o644, Size: 5, Typeflag: tar.TypeReg})
	tw.Write([]byte("hello"))
	tw.Close()
	if err := c.CopyIn(ctx, s, dir, &in, 0); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if err := c.CopyOut(ctx, s, dir+"/f.txt", &back); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&back)
	if h, err := tr.Next(); err != nil || h.Name != "f.txt" {
		t.Fatalf("CopyOut's tar: %+v %v", h, err)
	}
	if b, _ := io.ReadAll(tr); string(b) != "hello" {
		t.Errorf("CopyOut's file = %q", b)
	}
	// A hostile stream is refused whole, naming the entry.
	var evil bytes.Buffer
	tw = tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "../escape", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	var ae *client.APIError
	if err := c.CopyIn(ctx, s, dir, &evil, 0); !errors.As(err, &ae) || !strings.Contains(err.Error(), "escape") {
		t.Errorf("CopyIn of ../escape: %v, want an APIError naming the entry", err)
	}

	// A job's output comes back through JobLogs, with its end.
	j, err := c.StartJob(ctx, s, apiv1.JobStartRequest{Argv: []string{"sh", "-c", "echo job-out; exit 4"}})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	end, err := c.JobLogs(ctx, s, j.ID, 0, true, func(ev apiv1.LogEvent) error {
		logs.Write(ev.Data)
		return nil
	})
	if err != nil || !end.Ended || end.ExitCode != 4 || logs.String() != "job-out\n" {
		t.Errorf("JobLogs = %+v %v %q", end, err, logs.String())
	}
	if jobs, err := c.Jobs(ctx, s); err != nil || len(jobs) != 1 || jobs[0].ID != j.ID {
		t.Errorf("Jobs = %+v, %v", jobs, err)
	}

	// Errors are the daemon's answers, with their kinds.
	if err := c.KillJob(ctx, s, "no-such-job"); !errors.As(err, &ae) || ae.Info.Kind != "not_found" {
		t.Errorf("KillJob of an unknown job: %v, want an APIError of kind not_found", err)
	}
	if _, _, _, err := c.Run(ctx, "bad name!", "true"); !errors.As(err, &ae) || ae.Info.Kind != "invalid" {
		t.Errorf("Run in a bad session name: %v, want an APIError of kind invalid", err)
	}
	if err := c.StopSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	if rows, err := c.Sessions(ctx); err != nil || hasSession(rows, s) {
		t.Errorf("Sessions after RemoveSession = %+v, %v", rows, err)
	}
}

// A daemon that takes no connection is a *GoneError that says so.
func TestGone(t *testing.T) {
	c, err := client.New(filepath.Join(t.TempDir(), "berth.sock"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Status(context.Background())
	var ge *client.GoneError
	if !errors.As(err, &ge) || !ge.Dial || !strings.Contains(err.Error(), "takes no connection") || !client.Refused(err) {
		t.Errorf("Status of no daemon: %v, want a GoneError of the dial", err)
	}
}

func mustRun(t *testing.T, c *client.Client, session string, argv ...string) []byte {
	t.Helper()
	res, out, errOut, err := c.Run(context.Background(), session, argv...)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v: %+v %v %s", argv, res, err, errOut)
	}
	return out
}

func hasSession(rows []apiv1.Session, name string) bool {
	for _, r := range rows {
		if r.Session == name {
			return true
		}
	}
	return false
}

// TestLoopback: only loopback IP literals, with or without a port, are loopback; a
// name (localhost included) and any other address are not.
func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7878": true, "127.1.2.3:1": true, "[::1]:7878": true, "127.0.0.1": true, "[::1]": true, "::1": true,
		"localhost:7878": false, "10.0.0.1:7878": false, "[::2]:1": false, "example.com": false, "": false,
	} {
		if got := client.Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
