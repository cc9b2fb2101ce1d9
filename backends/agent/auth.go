package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/berth-sh/berth/backend"
)

// TokenName is the file name, inside a sandbox's agent directory
// (backend.AgentFiles.Dir, host-owned and mounted read-only in containers), of the
// sandbox's agent token: 64 hex digits that PrepareSandbox writes once. The agent
// reads it when it starts and accepts only connections that present it, so a process
// that reaches the socket of another sandbox's agent (a mount that exposes it, a
// socket passed on) cannot use that agent without also reading that sandbox's agent
// directory. See docs/security.md for what this does and does not protect.
const TokenName = "token"

// tokenLen is the token's length in bytes (hex: twice as many digits).
const tokenLen = 32

// handshakeMagic starts both sides' lines of the connection handshake. Every
// connection (since agent protocol 3) begins, before HTTP/2, with the client's line
// "BERTH-AGENT 1 TOKEN\n" (1: the handshake's own version; TOKEN: the hex token, all
// zeros for none) and the agent's answer "BERTH-AGENT OK\n" or
// "BERTH-AGENT DENIED REASON\n". The protocol version is negotiated after it, by
// Hello.
const handshakeMagic = "BERTH-AGENT"

// handshakeVersion is the version of the handshake line.
const handshakeVersion = 1

// handshakeMax caps a handshake line, in bytes.
const handshakeMax = 256

// DefaultHandshakeTimeout bounds the agent's wait for a new connection's handshake
// line: a connection that sends nothing is closed after it.
const DefaultHandshakeTimeout = 10 * time.Second

// ReadToken reads the token of the agent directory dir (dir/TokenName), opened
// without following links. Errors: the file is missing (wraps fs.ErrNotExist), or it
// does not hold a token (ErrInvalid, naming the file and the remedy).
func ReadToken(dir string) ([]byte, error) { return readTokenFile(filepath.Join(dir, TokenName)) }

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
	tok, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(tok) != tokenLen {
		return nil, backend.Errorf(backend.ErrInvalid, "agent token %s is damaged (want %d hex digits); remove it and restart the sandbox (berth exec --recreate)", path, 2*tokenLen)
	}
	return tok, nil
}

// ensureToken creates dir/TokenName with a new random token unless it exists.
func ensureToken(dir string) error {
	path := filepath.Join(dir, TokenName)
	if _, err := ReadToken(dir); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		if rerr := os.Remove(path); rerr != nil {
			return err
		}
	}
	var tok [tokenLen]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return fmt.Errorf("agent token: %w", err)
	}
	tmp := tempName(dir, ".token.tmp-")
	// 0644: the agent may run as a user of its own (a user namespace); the token
	// guards the socket, and the state dir above it is the host user's alone.
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(tok[:])+"\n"), 0o644); err != nil {
		return fmt.Errorf("agent token: %w", err)
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("agent token: %w", err)
	}
	return nil
}

// clientHandshake sends the handshake line for token over c and reads the agent's
// answer, within ctx. Errors: the agent refused the token (ErrConflict), the peer is
// not a protocol-3 agent (ErrUnsupported: an older berth's agent closes the
// connection or answers with HTTP/2), or no answer before ctx ended (ErrTimeout).
func clientHandshake(ctx context.Context, c net.Conn, token []byte) error {
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
	if _, err := fmt.Fprintf(c, "%s %d %s\n", handshakeMagic, handshakeVersion, tok); err != nil {
		return handshakeErr(ctx, err)
	}
	line, err := readLine(c)
	if err != nil {
		return handshakeErr(ctx, err)
	}
	rest, ok := strings.CutPrefix(line, handshakeMagic+" ")
	switch {
	case !ok:
		return backend.Errorf(backend.ErrUnsupported, "the agent did not answer berth's handshake: it is an agent of an older berth (agent protocol 2 or less)")
	case rest == "OK":
		return nil
	}
	reason, _ := strings.CutPrefix(rest, "DENIED ")
	return backend.Errorf(backend.ErrConflict, "the agent refused the connection: %s", peerText(reason))
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
	return backend.Errorf(backend.ErrUnavailable, "agent handshake: %v", err)
}

// readLine reads one "\n"-terminated line of at most handshakeMax bytes, byte by
// byte, so that nothing after it (HTTP/2) is consumed.
func readLine(r io.Reader) (string, error) {
	var b [1]byte
	var line []byte
	for len(line) < handshakeMax {
		if _, err := r.Read(b[:]); err != nil {
			if err == io.EOF && len(line) > 0 {
				return string(line), nil
			}
			return "", err
		}
		if b[0] == '\n' {
			return string(line), nil
		}
		line = append(line, b[0])
	}
	return string(line), nil
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
	if len(f) != 3 || f[0] != handshakeMagic {
		return deny("not a berth handshake")
	}
	if f[1] != fmt.Sprint(handshakeVersion) {
		return deny(fmt.Sprintf("handshake version %s, this agent knows %d; use the same berth for the host and the agent (agent_path)", f[1], handshakeVersion))
	}
	if c.token != nil {
		got, err := hex.DecodeString(f[2])
		if err != nil || subtle.ConstantTimeCompare(got, c.token) != 1 {
			return deny("wrong token: this socket belongs to another sandbox or another berth installation")
		}
	}
	if _, err := fmt.Fprintf(conn, "%s OK\n", handshakeMagic); err != nil {
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
