package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sh/berth/agent/internal/agentpb"
	"github.com/berth-sh/berth/backend"
)

// TokenName is the file name of a sandbox's agent token inside its agent directory
// (backend.AgentFiles.Dir) as berth made it before agent tokens moved out of that
// directory (TokenFileName): that directory is mounted into the sandbox, so such a
// token is readable there. PrepareSandbox makes none any more; it narrows an existing
// one to mode 0600 and keeps it for the agent of the sandbox that was made with it,
// until the sandbox is recreated. It is also the token's key in a Kubernetes
// sandbox's Secret.
const TokenName = "token"

// TokenFileName is the file name of a sandbox's agent token: 64 hex digits and a
// newline, mode 0600, in the sandbox's directory beside (never inside) its agent
// directory, so no driver mounts it into the sandbox: TokenPath(AgentFiles.Dir).
// PrepareSandbox writes it once. The host presents it in the handshake of every
// connection to the agent, and the agent accepts only connections that present it
// (so a process that reaches the socket of another sandbox's agent cannot use that
// agent), having been given it at start through TokenEnv (container drivers), or by
// reading this file itself (the local driver, whose agent runs on the host). See
// docs/security.md for what this does and does not protect.
const TokenFileName = "agent-token"

// TokenEnv is the environment variable through which a driver hands its sandbox's
// agent the token (TokenEnvEntry): the agent reads it, makes itself non-dumpable and
// starts itself again without it before it starts any process (see
// reexecWithoutToken), so that no exec inherits it and neither the agent's
// /proc/PID/environ nor its /proc/PID/mem shows it to any process of the sandbox
// without CAP_SYS_PTRACE, root included. Drivers refuse it in a rule's env.
const TokenEnv = "BERTH_AGENT_TOKEN"

// tokenLen is the token's length in bytes (hex: twice as many digits).
const tokenLen = 32

// handshakeMagic starts both sides' lines of the connection handshake. Every
// connection (since agent protocol 3) begins, before HTTP/2, with the client's line
// and the agent's answer:
//
//   - version 2: "BERTH-AGENT 2 TOKEN VERSIONS\n" (TOKEN: the hex token, all zeros
//     for none; VERSIONS: the protocol versions the client speaks, comma-separated,
//     highest first), answered "BERTH-AGENT OK HELLO\n", HELLO being the agent's
//     HelloResponse (the protocol it chose, its pid, instance, OOM watch and exec
//     user) as unpadded base64url of its protobuf encoding: the answer to Hello, so
//     that a connection needs no Hello call before its first real one;
//   - version 1 (berth before the above; agents still accept it):
//     "BERTH-AGENT 1 TOKEN\n", answered "BERTH-AGENT OK\n"; the protocol version is
//     then negotiated by the Hello call;
//
// or, either way, "BERTH-AGENT DENIED REASON\n". An agent that knows only version 1
// denies a version-2 line as "not a berth handshake" (it has four fields): the
// client then connects again with version 1.
const handshakeMagic = "BERTH-AGENT"

// handshakeVersion is the version of the handshake line a client sends.
const handshakeVersion = 2

// handshakeMax caps the client's handshake line and a version-1 answer, in bytes.
const handshakeMax = 256

// answerMax caps a version-2 answer (the Hello answer in it), in bytes.
const answerMax = 1024

// DefaultHandshakeTimeout bounds the agent's wait for a new connection's handshake
// line: a connection that sends nothing is closed after it.
const DefaultHandshakeTimeout = 10 * time.Second

// TokenPath returns the path of the token of the sandbox whose agent directory is
// agentDir: TokenFileName in agentDir's parent (the sandbox's directory).
func TokenPath(agentDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(agentDir)), TokenFileName)
}

// ReadToken reads the token of the sandbox whose agent directory is dir: the file
// TokenPath(dir), or, for a sandbox prepared by an earlier berth, dir/TokenName;
// each opened without following links. Errors: neither file exists (wraps
// fs.ErrNotExist), or the file does not hold a token (ErrInvalid, naming the file
// and the remedy).
func ReadToken(dir string) ([]byte, error) {
	tok, err := readTokenFile(TokenPath(dir))
	if errors.Is(err, os.ErrNotExist) {
		if legacy, lerr := readTokenFile(filepath.Join(dir, TokenName)); !errors.Is(lerr, os.ErrNotExist) {
			return legacy, lerr
		}
	}
	return tok, err
}

// readTokenFile reads the token file path (see ReadToken).
func readTokenFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("agent token %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, handshakeMax))
	if err != nil {
		return nil, fmt.Errorf("agent token %s: %w", path, err)
	}
	return parseToken(path, string(b))
}

// parseToken decodes the hex token text read from src (a file, TokenEnv).
func parseToken(src, text string) ([]byte, error) {
	tok, err := hex.DecodeString(strings.TrimSpace(text))
	if err != nil || len(tok) != tokenLen {
		return nil, backend.Errorf(backend.ErrInvalid, "agent token %s is damaged (want %d hex digits); remove it and restart the sandbox (berth exec --recreate)", src, 2*tokenLen)
	}
	return tok, nil
}

// TokenEnvEntry returns "TokenEnv=TOKEN" for the sandbox whose agent directory is
// agentDir (ReadToken), for a driver to put in the environment of the sandbox's
// first process, the agent. Errors: those of ReadToken.
func TokenEnvEntry(agentDir string) (string, error) {
	tok, err := ReadToken(agentDir)
	if err != nil {
		return "", err
	}
	return TokenEnv + "=" + hex.EncodeToString(tok), nil
}

// ensureToken makes the token of the sandbox whose agent directory is agentDir,
// TokenPath(agentDir) (mode 0600), unless it exists: with the value of a token left
// in agentDir by an earlier berth (so the agent already running with it still
// accepts the host), which is narrowed to mode 0600, else with a new random one.
func ensureToken(agentDir string) error {
	path := TokenPath(agentDir)
	if _, err := readTokenFile(path); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		if rerr := os.Remove(path); rerr != nil {
			return err
		}
	}
	var tok []byte
	legacy := filepath.Join(agentDir, TokenName)
	if old, err := readTokenFile(legacy); err == nil {
		tok = old
		// Only the agent of the sandbox made with it needs it (as root in its
		// container: the owner, or DAC_OVERRIDE); best effort, as the host user
		// may not own it.
		os.Chmod(legacy, 0o600)
	} else {
		tok = make([]byte, tokenLen)
		if _, err := rand.Read(tok); err != nil {
			return fmt.Errorf("agent token: %w", err)
		}
	}
	tmp := tempName(filepath.Dir(path), ".agent-token.tmp-")
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(tok)+"\n"), 0o600); err != nil {
		return fmt.Errorf("agent token: %w", err)
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("agent token: %w", err)
	}
	return nil
}

// clientHandshake sends the handshake line for token and versions over c (version
// 2, or 1 when v1 is set) and reads the agent's answer, within ctx. It returns the
// connection to speak HTTP/2 on (c, reading first what the answer's read buffered)
// and the Hello answer that a version-2 answer carries (nil for a version-1
// answer). Errors: the agent refused the token (ErrConflict), the peer is not a
// protocol-3 agent (ErrUnsupported: an older berth's agent closes the connection or
// answers with HTTP/2), an answer that is not the agent's Hello (ErrUnsupported), no
// answer before ctx ended (ErrTimeout), or errOldHandshake: an agent that knows only
// version 1 denied the line.
func clientHandshake(ctx context.Context, c net.Conn, token []byte, versions []int, v1 bool) (net.Conn, *agentpb.HelloResponse, error) {
	// Closing the connection when ctx ends unblocks the handshake on any kind of
	// connection (a driver's stream has no deadlines); the caller closes it on
	// error anyway.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	// Without a token the line carries zeros: the line is then as long as with
	// one, longer than HTTP/2's 24-byte preface, so a server of an older berth
	// (which reads that preface first) sees a bad preface and closes at once.
	tok := strings.Repeat("0", 2*tokenLen)
	if len(token) > 0 {
		tok = hex.EncodeToString(token)
	}
	line := fmt.Sprintf("%s 1 %s\n", handshakeMagic, tok)
	if !v1 {
		vs := make([]string, len(versions))
		for i, v := range versions {
			vs[i] = strconv.Itoa(v)
		}
		line = fmt.Sprintf("%s %d %s %s\n", handshakeMagic, handshakeVersion, tok, strings.Join(vs, ","))
	}
	if _, err := io.WriteString(c, line); err != nil {
		return nil, nil, handshakeErr(ctx, err)
	}
	// The answer is read through a buffer that the connection keeps reading first:
	// HTTP/2 may follow it at once, and reading byte by byte would cost a system call
	// each.
	br := bufio.NewReaderSize(c, answerMax)
	answer, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, nil, backend.Errorf(backend.ErrUnsupported, "the agent's answer to berth's handshake is longer than %d bytes: not a berth agent", answerMax)
	case err != nil && !(errors.Is(err, io.EOF) && len(answer) > 0):
		return nil, nil, handshakeErr(ctx, err)
	}
	rest, ok := strings.CutPrefix(strings.TrimSuffix(string(answer), "\n"), handshakeMagic+" ")
	switch {
	case !ok:
		return nil, nil, backend.Errorf(backend.ErrUnsupported, "the agent did not answer berth's handshake: it is an agent of an older berth (agent protocol 2 or less)")
	case rest == "OK":
		return &bufConn{c, br}, nil, nil
	case strings.HasPrefix(rest, "OK ") && !v1:
		hello, err := decodeHello(strings.TrimPrefix(rest, "OK "))
		if err != nil {
			return nil, nil, err
		}
		return &bufConn{c, br}, hello, nil
	}
	reason, denied := strings.CutPrefix(rest, "DENIED ")
	if denied && !v1 && (reason == reasonNotHandshake || strings.HasPrefix(reason, "handshake version ")) {
		return nil, nil, errOldHandshake
	}
	return nil, nil, backend.Errorf(backend.ErrConflict, "the agent refused the connection: %s", peerText(reason))
}

// errOldHandshake says that the agent knows only version 1 of the handshake.
var errOldHandshake = errors.New("the agent knows only version 1 of berth's handshake")

// reasonNotHandshake is how an agent denies a line that is not a handshake.
const reasonNotHandshake = "not a berth handshake"

// encodeHello is the HELLO of a version-2 answer.
func encodeHello(h *agentpb.HelloResponse) (string, error) {
	b, err := proto.Marshal(h)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// decodeHello reads the HELLO of a version-2 answer (from the sandbox: hostile).
func decodeHello(s string) (*agentpb.HelloResponse, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	var h agentpb.HelloResponse
	if err == nil {
		err = proto.Unmarshal(b, &h)
	}
	if err != nil {
		return nil, backend.Errorf(backend.ErrUnsupported, "the agent's answer to berth's handshake does not hold a Hello answer (%w): not a berth agent of this protocol; recreate the sandbox (berth exec --recreate) to give it this berth's agent", err)
	}
	return &h, nil
}

// bufConn is a connection whose reads take first what r has buffered of it.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) {
	if c.r.Buffered() > 0 {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}

func handshakeErr(ctx context.Context, err error) error {
	switch {
	case backend.KindOf(err) != nil:
		return err // a driver's dial that failed, with its kind
	case ctx.Err() != nil:
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return backend.Errorf(backend.ErrTimeout, "the agent accepted the connection but did not answer berth's handshake in time (a paused or overloaded sandbox?)")
		}
		return fmt.Errorf("agent handshake: %w", ctx.Err())
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return backend.Errorf(backend.ErrUnsupported, "the agent closed the connection at berth's handshake: it is an agent of an older berth (agent protocol 2 or less)")
	}
	return backend.Errorf(backend.ErrUnavailable, "agent handshake: %w", err)
}

// readClientLine reads the client's handshake line in as few reads as it arrives
// in: the client sends nothing after it until the agent has answered, so whatever a
// read returns is the line (bytes after its "\n" are a protocol error).
func readClientLine(r io.Reader) (string, error) {
	buf := make([]byte, handshakeMax)
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			if i != n-1 {
				return "", errors.New("bytes after the handshake line before the answer")
			}
			return string(buf[:i]), nil
		}
		if err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("handshake line longer than %d bytes", handshakeMax)
}

// tokenCreds is the agent side of the handshake, as gRPC transport credentials: gRPC
// runs ServerHandshake for each new connection in a goroutine of its own, before
// HTTP/2, so a connection that never sends its line holds up no other.
type tokenCreds struct {
	token   []byte // nil: any token is accepted
	timeout time.Duration
	// hello answers Hello for a client of the given versions (the server's Hello
	// call), for the version-2 answer.
	hello func(client []int) *agentpb.HelloResponse
	peer  peerCheck
}

type tokenAuth struct{ credentials.CommonAuthInfo }

func (tokenAuth) AuthType() string { return "berth-token" }

func (c *tokenCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn.SetDeadline(time.Now().Add(c.timeout))
	defer conn.SetDeadline(time.Time{})
	line, err := readClientLine(conn)
	if err != nil {
		return nil, nil, fmt.Errorf("agent handshake: %w", err)
	}
	deny := func(reason string) (net.Conn, credentials.AuthInfo, error) {
		fmt.Fprintf(conn, "%s DENIED %s\n", handshakeMagic, reason)
		return nil, nil, fmt.Errorf("agent handshake: %s", reason)
	}
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != handshakeMagic {
		return deny(reasonNotHandshake)
	}
	switch {
	case f[1] == "1" && len(f) == 3, f[1] == "2" && len(f) == 4:
	case f[1] == "1" || f[1] == "2":
		return deny(reasonNotHandshake)
	default:
		return deny(fmt.Sprintf("handshake version %s, this agent knows 1 and %d; use the same berth for the host and the agent (agent_path)", peerText(f[1]), handshakeVersion))
	}
	// Before the token: a process of the sandbox that got hold of the token
	// (a sandbox made before tokens left its agent directory) is refused too.
	if why := c.peer.deny(conn); why != "" {
		return deny(why)
	}
	if c.token != nil {
		got, err := hex.DecodeString(f[2])
		if err != nil || subtle.ConstantTimeCompare(got, c.token) != 1 {
			return deny("wrong token: this socket belongs to another sandbox or another berth installation")
		}
	}
	answer := handshakeMagic + " OK\n"
	if f[1] == "2" {
		var client []int
		for _, v := range strings.Split(f[3], ",") {
			n, err := strconv.Atoi(v)
			if err != nil || len(client) == 16 {
				return deny("the handshake's protocol versions are not a list of numbers")
			}
			client = append(client, n)
		}
		hello, err := encodeHello(c.hello(client))
		if err != nil {
			return nil, nil, fmt.Errorf("agent handshake: %w", err)
		}
		answer = handshakeMagic + " OK " + hello + "\n"
	}
	if _, err := io.WriteString(conn, answer); err != nil {
		return nil, nil, fmt.Errorf("agent handshake: %w", err)
	}
	return conn, tokenAuth{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (c *tokenCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tokenCreds is the agent's side only")
}

func (c *tokenCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "berth-token"}
}

func (c *tokenCreds) Clone() credentials.TransportCredentials { cp := *c; return &cp }

func (c *tokenCreds) OverrideServerName(string) error { return nil }
