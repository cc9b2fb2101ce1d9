package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
)

// An agent started with a token accepts only connections that present it: no
// token and a wrong token are refused as a conflict naming why, the right one
// (read from the agent directory as the host does) works.
func TestTokenHandshake(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "agent")
	os.Mkdir(dir, 0o755)
	if err := ensureToken(dir); err != nil {
		t.Fatal(err)
	}
	tok, err := ReadToken(dir)
	if err != nil || len(tok) != tokenLen {
		t.Fatalf("ReadToken: %x %v", tok, err)
	}
	// ensureToken keeps an existing token.
	if err := ensureToken(dir); err != nil {
		t.Fatal(err)
	}
	if again, _ := ReadToken(dir); !bytes.Equal(again, tok) {
		t.Fatal("ensureToken replaced an existing token")
	}
	a := &testAgent{sockDir: deepDir(t), logPath: filepath.Join(t.TempDir(), "agent.log"), exited: make(chan struct{}),
		extra: []string{"--token-file", TokenPath(dir)}, opts: []ClientOption{WithToken(tok)}}
	a.start(t)
	ctx := testCtx(t)
	for name, opts := range map[string][]ClientOption{
		"none":  nil,
		"wrong": {WithToken(bytes.Repeat([]byte{7}, tokenLen))},
	} {
		_, err := NewClient(ctx, DialSocketDir(a.sockDir), opts...)
		if !errors.Is(err, backend.ErrConflict) || !strings.Contains(err.Error(), "token") {
			t.Errorf("%s token: %v, want ErrConflict about the token", name, err)
		}
	}
	c, err := NewClient(ctx, DialSocketDir(a.sockDir), WithTokenFrom(dir))
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	defer c.Close()
	if out, _, _ := run(t, c, sh("echo in")); out != "in\n" {
		t.Errorf("exec with the token: %q", out)
	}
	if c.Instance() == "" || c.PID() != a.pid {
		t.Errorf("Hello: instance %q pid %d, want an instance and pid %d", c.Instance(), c.PID(), a.pid)
	}
	// A damaged token file is reported as such, naming the remedy.
	bad := filepath.Join(t.TempDir(), "agent")
	os.Mkdir(bad, 0o755)
	os.WriteFile(TokenPath(bad), []byte("xyz\n"), 0o600)
	if _, err := ReadToken(bad); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "--recreate") {
		t.Errorf("damaged token: %v", err)
	}
}

// A token that an earlier berth left in the agent directory (mounted into the
// sandbox) is still what the host presents, so the agent that runs with it keeps
// working; ensureToken copies its value beside the agent directory and narrows the
// old file to mode 0600.
func TestLegacyTokenMigrated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "agent")
	os.Mkdir(dir, 0o755)
	legacy := filepath.Join(dir, TokenName)
	old := bytes.Repeat([]byte{0xab}, tokenLen)
	if err := os.WriteFile(legacy, []byte(hex.EncodeToString(old)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if tok, err := ReadToken(dir); err != nil || !bytes.Equal(tok, old) {
		t.Fatalf("ReadToken of a legacy agent dir: %x %v", tok, err)
	}
	if err := ensureToken(dir); err != nil {
		t.Fatal(err)
	}
	if tok, err := readTokenFile(TokenPath(dir)); err != nil || !bytes.Equal(tok, old) {
		t.Errorf("token beside the agent dir: %x %v, want the legacy token's value", tok, err)
	}
	if fi, err := os.Stat(legacy); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("legacy token: %v %v, want mode 0600", fi.Mode(), err)
	}
}

// The agent takes its token from $BERTH_AGENT_TOKEN and removes it from the
// environment of everything it starts, and from its own /proc/PID/environ.
func TestTokenFromEnvNotInherited(t *testing.T) {
	tok := bytes.Repeat([]byte{0x5a}, tokenLen)
	a := &testAgent{sockDir: deepDir(t), logPath: filepath.Join(t.TempDir(), "agent.log"), exited: make(chan struct{}),
		opts: []ClientOption{WithToken(tok)}}
	a.start(t, TokenEnv+"="+hex.EncodeToString(tok))
	ctx := testCtx(t)
	if _, err := NewClient(ctx, DialSocketDir(a.sockDir)); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("without the token: %v, want ErrConflict", err)
	}
	c, err := NewClient(ctx, DialSocketDir(a.sockDir), WithToken(tok))
	if err != nil {
		t.Fatalf("with the token from the environment: %v", err)
	}
	defer c.Close()
	if out, _, _ := run(t, c, sh("env; echo end")); strings.Contains(out, TokenEnv) || strings.Contains(out, hex.EncodeToString(tok)) || !strings.HasSuffix(out, "end\n") {
		t.Errorf("an exec's environment holds the token: %q", out)
	}
	// Nor does the kernel's copy of the agent's own environment, which it had
	// started with: it started again (the same process) without it.
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", a.pid)); err != nil || bytes.Contains(env, []byte(hex.EncodeToString(tok))) || bytes.Contains(env, []byte(TokenEnv+"=")) {
		t.Errorf("the agent's /proc/PID/environ: %v, holds the token: %q", err, env)
	}
	if argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", a.pid)); err != nil || !bytes.Contains(argv, []byte(tokenFDFlag)) {
		t.Errorf("the agent's command line %q (%v) has no %s: it did not start again", argv, err, tokenFDFlag)
	}
	// Started again by its path, it keeps its name (what ps shows).
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", a.pid)); err != nil || !strings.HasPrefix(filepath.Base(agentBin), strings.TrimSpace(string(comm))) {
		t.Errorf("the agent's name %q (%v), want that of %s", comm, err, agentBin)
	}
	// A damaged token in the environment keeps the agent from starting.
	cmd := exec.Command(agentBin, "serve", "--socket-dir", deepDir(t))
	cmd.Env = append(os.Environ(), TokenEnv+"=xyz")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), TokenEnv) {
		t.Errorf("agent with a damaged $%s: %v %q", TokenEnv, err, out)
	}
}

// A gRPC server that does not know berth's handshake (an agent of protocol 2, made
// by an older berth) is reported as such, not as a hang or a generic failure.
func TestOlderAgentReported(t *testing.T) {
	dir := t.TempDir()
	lis, err := net.Listen("unix", filepath.Join(dir, backend.AgentSocketName))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	agentpb.RegisterAgentServer(gs, agentpb.UnimplementedAgentServer{})
	go gs.Serve(lis)
	defer gs.Stop()
	_, err = NewClient(testCtx(t), DialSocketDir(dir))
	if !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), "older berth") {
		t.Fatalf("older agent: %v, want ErrUnsupported saying it is an older berth's", err)
	}
}

// The agent answers a version-2 handshake line with its Hello answer, and a
// version-1 line (a berth of before that answer, talking to a running agent) as
// such a berth expects: "BERTH-AGENT OK" alone.
func TestHandshakeVersions(t *testing.T) {
	a := startAgent(t)
	answer := func(line string) string {
		t.Helper()
		c, err := DialSocketDir(a.sockDir)(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, line); err != nil {
			t.Fatal(err)
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return got
	}
	zeros := strings.Repeat("0", 2*tokenLen)
	if got := answer(handshakeMagic + " 1 " + zeros + "\n"); got != handshakeMagic+" OK\n" {
		t.Errorf("version 1: answer %q", got)
	}
	got := answer(fmt.Sprintf("%s 2 %s %d\n", handshakeMagic, zeros, ProtocolVersion))
	payload, ok := strings.CutPrefix(strings.TrimSuffix(got, "\n"), handshakeMagic+" OK ")
	if !ok {
		t.Fatalf("version 2: answer %q", got)
	}
	hello, err := decodeHello(payload)
	if err != nil || hello.Protocol != ProtocolVersion || int(hello.Pid) != a.pid || hello.Instance == "" {
		t.Errorf("version 2: Hello answer %v, %v; want protocol %d, pid %d", hello, err, ProtocolVersion, a.pid)
	}
	for _, line := range []string{
		handshakeMagic + " 2 " + zeros + "\n",       // no versions
		handshakeMagic + " 2 " + zeros + " 3,x\n",   // not numbers
		handshakeMagic + " 1 " + zeros + " 3\n",     // version 1 with versions
		handshakeMagic + " 9 " + zeros + " 3\n",     // an unknown version
		handshakeMagic + " 2 " + zeros + " 3 4 5\n", // too many fields
	} {
		if got := answer(line); !strings.HasPrefix(got, handshakeMagic+" DENIED ") {
			t.Errorf("%q: answer %q, want DENIED", line, got)
		}
	}
}

// v1OnlyCreds is the agent's side of the handshake as berth's agents made it before
// the version-2 answer: a line of three fields, version 1, answered "OK" alone.
type v1OnlyCreds struct {
	tokenCreds
	dials *atomic.Int32
}

func (c *v1OnlyCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c.dials.Add(1)
	line, err := readClientLine(conn)
	if err != nil {
		return nil, nil, err
	}
	f := strings.Fields(line)
	reason := ""
	switch {
	case len(f) != 3 || f[0] != handshakeMagic:
		reason = "not a berth handshake"
	case f[1] != "1":
		reason = "handshake version " + f[1] + ", this agent knows 1; use the same berth for the host and the agent (agent_path)"
	}
	if reason != "" {
		fmt.Fprintf(conn, "%s DENIED %s\n", handshakeMagic, reason)
		return nil, nil, errors.New(reason)
	}
	fmt.Fprintf(conn, "%s OK\n", handshakeMagic)
	return conn, tokenAuth{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

// A client reaches an agent that knows only version 1 of the handshake (a sandbox
// started by an older berth, still running) on a second connection, and learns the
// protocol from the Hello call.
func TestHandshakeVersion1Agent(t *testing.T) {
	dir := t.TempDir()
	lis, err := net.Listen("unix", filepath.Join(dir, backend.AgentSocketName))
	if err != nil {
		t.Fatal(err)
	}
	s, err := newServer(log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int32
	gs := grpc.NewServer(grpc.Creds(&v1OnlyCreds{dials: &dials}))
	agentpb.RegisterAgentServer(gs, s)
	go gs.Serve(lis)
	defer gs.Stop()
	c, err := NewClient(testCtx(t), DialSocketDir(dir))
	if err != nil {
		t.Fatalf("version-1 agent: %v", err)
	}
	defer c.Close()
	if c.Protocol() != ProtocolVersion || c.PID() != os.Getpid() || c.Instance() != s.instance {
		t.Errorf("version-1 agent: protocol %d pid %d instance %q, want %d, %d, %q", c.Protocol(), c.PID(), c.Instance(), ProtocolVersion, os.Getpid(), s.instance)
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d connections, want 2 (version 2 denied, then version 1)", n)
	}
}

// A listener that accepts and never answers (a paused sandbox, something squatting
// on the socket) is caught by the hello timeout: whenever the deadline passes, the
// outcome is ErrTimeout naming it, since nothing ever answers.
func TestHelloTimeout(t *testing.T) {
	dir := t.TempDir()
	lis, err := net.Listen("unix", filepath.Join(dir, backend.AgentSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // never read, never answered
		}
	}()
	_, err = NewClient(context.Background(), DialSocketDir(dir), WithHelloTimeout(50e6))
	if !errors.Is(err, backend.ErrTimeout) || !strings.Contains(err.Error(), "50ms") {
		t.Errorf("silent listener: %v, want ErrTimeout naming the 50ms hello timeout", err)
	}
	lis.Close()
	<-done
	for _, c := range held {
		c.Close()
	}
}

// The agent's default exec user applies to execs, shell calls and jobs that name
// none, and Hello reports it.
func TestDefaultExecUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run execs as another user")
	}
	a := &testAgent{sockDir: deepDir(t), logPath: filepath.Join(t.TempDir(), "agent.log"), exited: make(chan struct{}),
		extra: []string{"--exec-user", "65534:65534"}}
	a.start(t)
	c, err := NewClient(testCtx(t), DialSocketDir(a.sockDir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ExecUser() != "65534:65534" {
		t.Errorf("Hello exec user %q", c.ExecUser())
	}
	if out, _, _ := run(t, c, backend.ExecRequest{Argv: []string{"id", "-u"}, Dir: "/"}); out != "65534\n" {
		t.Errorf("default user: id -u = %q", out)
	}
	if out, _, _ := run(t, c, backend.ExecRequest{Argv: []string{"id", "-u"}, Dir: "/", User: "0"}); out != "0\n" {
		t.Errorf("explicit user 0: id -u = %q", out)
	}
	if out, _, _ := shellRun(t, c, ShellRequest{Command: "id -u", Session: "s", Dir: "/"}); out != "65534\n" {
		t.Errorf("shell: id -u = %q", out)
	}
}

// With an OOM-kill counter, a result says OOMKilled exactly when the counter grew
// during the exec. The counter here is a plain file the exec itself bumps, which is
// what the kernel does to memory.events or memory.oom_control.
func TestOOMCounter(t *testing.T) {
	counter := filepath.Join(t.TempDir(), "memory.events")
	os.WriteFile(counter, []byte("oom 0\noom_kill 0\n"), 0o666)
	a := &testAgent{sockDir: deepDir(t), logPath: filepath.Join(t.TempDir(), "agent.log"), exited: make(chan struct{}),
		extra: []string{"--oom-counter", counter}}
	a.start(t)
	c, err := NewClient(testCtx(t), DialSocketDir(a.sockDir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.WatchesOOM() {
		t.Fatal("Hello says the agent does not watch OOM kills")
	}
	if _, _, res := run(t, c, sh("true")); res.OOMKilled {
		t.Error("OOMKilled without a kill")
	}
	if _, _, res := run(t, c, sh("printf 'oom 1\\noom_kill 1\\n' > "+counter+"; exit 137")); !res.OOMKilled || res.ExitCode != 137 {
		t.Errorf("counter grew: %+v, want OOMKilled", res)
	}
	// Without a counter, Hello says so.
	b := startAgent(t)
	if b.c.WatchesOOM() {
		t.Error("an agent without --oom-counter says it watches OOM kills")
	}
}

func TestReadOOMCount(t *testing.T) {
	dir := t.TempDir()
	v1 := filepath.Join(dir, "memory.oom_control")
	os.WriteFile(v1, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 0o644)
	v2 := filepath.Join(dir, "memory.events")
	os.WriteFile(v2, []byte("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n"), 0o644)
	none := filepath.Join(dir, "none")
	os.WriteFile(none, []byte("under_oom 0\n"), 0o644)
	for path, want := range map[string]int64{v1: 3, v2: 2, none: -1, "": -1, filepath.Join(dir, "missing"): -1} {
		if got := readOOMCount(path); got != want {
			t.Errorf("readOOMCount(%q) = %d, want %d", path, got, want)
		}
	}
	if got := findOOMCounter(); got != "" && readOOMCount(got) < 0 {
		t.Errorf("findOOMCounter: %q holds no oom_kill counter", got)
	}
}
