package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-sh/berth/backend"
)

// probeTimeout bounds each of a probe's attempts (dial, handshake, Hello, exec).
const probeTimeout = 30 * time.Second

// probeAddr is one address an agent listens on: a socket directory or a TCP address.
type probeAddr struct{ socketDir, tcp string }

func (a probeAddr) String() string {
	if a.tcp != "" {
		return "tcp " + a.tcp
	}
	return "socket " + filepath.Join(a.socketDir, backend.AgentSocketName)
}

// probe is `berth agent probe`: what a process of a sandbox can do with the agents it
// finds, for the conformance suite's check that a sandbox's users cannot use their
// agent. It tries the addresses given (--socket-dir, --tcp), or else finds every
// agent of its PID namespace from their command lines
// (/proc/PID/cmdline: "serve --socket-dir DIR [--listen-tcp ADDR]", readable by every
// user), connects to each address, presents the token read from stdin
// (--token-stdin; none otherwise) and runs argv as --user, and prints one line per
// address on stdout: "ADDR: ran: exit N" (the agent ran it), "ADDR: refused: WHY"
// (the agent refused the connection or the exec) or "ADDR: unreachable: WHY" (no
// connection). It returns 0 when it found an agent to try, 1 when none, 2 for a
// usage error.
func probe(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("berth agent probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tokenStdin := fs.Bool("token-stdin", false, "read the token to present from stdin (64 hex digits)")
	user := fs.String("user", "", "user to run the command as")
	socketDir := fs.String("socket-dir", "", "try only the agent socket in this directory")
	tcpAddr := fs.String("tcp", "", "try only this TCP address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	argv := fs.Args()
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "usage: berth agent probe [--token-stdin] [--user USER] [--socket-dir DIR] [--tcp ADDR] -- COMMAND [ARG...]")
		return 2
	}
	var token []byte
	if *tokenStdin {
		line, err := bufio.NewReader(io.LimitReader(stdin, handshakeMax)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintf(stderr, "berth agent probe: reading the token: %v\n", err)
			return 2
		}
		if token, err = parseToken("on stdin", line); err != nil {
			fmt.Fprintf(stderr, "berth agent probe: %v\n", err)
			return 2
		}
	}
	var addrs []probeAddr
	if *socketDir != "" {
		addrs = append(addrs, probeAddr{socketDir: *socketDir})
	}
	if *tcpAddr != "" {
		addrs = append(addrs, probeAddr{tcp: *tcpAddr})
	}
	if len(addrs) == 0 {
		addrs = findAgents("/proc")
	}
	if len(addrs) == 0 {
		fmt.Fprintln(stderr, "berth agent probe: no agent found in /proc/*/cmdline")
		return 1
	}
	for _, a := range addrs {
		fmt.Fprintf(stdout, "%s: %s\n", a, probeOne(a, token, *user, argv))
	}
	return 0
}

// probeOne tries one address and says what happened (see probe).
func probeOne(a probeAddr, token []byte, user string, argv []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	dial := DialSocketDir(a.socketDir)
	if a.tcp != "" {
		dial = func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", a.tcp)
		}
	}
	var opts []ClientOption
	if token != nil {
		opts = append(opts, WithToken(token))
	}
	c, err := NewClient(ctx, dial, opts...)
	if err != nil {
		if errors.Is(err, backend.ErrConflict) {
			return "refused: " + oneLine(err)
		}
		return "unreachable: " + oneLine(err)
	}
	var out bytes.Buffer
	p, err := ExecOnce(ctx, c, backend.ExecRequest{Argv: argv, User: user, Stdout: &out, Stderr: &out})
	if err != nil {
		return "refused: " + oneLine(err)
	}
	res, err := p.Wait()
	if err != nil {
		return "refused: " + oneLine(err)
	}
	return fmt.Sprintf("ran: exit %d: %s", res.ExitCode, oneLine(errors.New(out.String())))
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// findAgents returns the addresses of the agents whose command lines procDir's
// PID/cmdline files hold: "serve" with --socket-dir (and --listen-tcp).
func findAgents(procDir string) []probeAddr {
	ents, _ := os.ReadDir(procDir)
	var out []probeAddr
	for _, e := range ents {
		if strings.Trim(e.Name(), "0123456789") != "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		serving := false
		var a probeAddr
		for i, arg := range args {
			val := ""
			if i+1 < len(args) {
				val = args[i+1]
			}
			switch arg {
			case "serve":
				serving = true
			case "--socket-dir":
				a.socketDir = val
			case "--listen-tcp":
				a.tcp = val
			}
		}
		if !serving || a.socketDir == "" {
			continue
		}
		out = append(out, probeAddr{socketDir: a.socketDir})
		if a.tcp != "" {
			out = append(out, probeAddr{tcp: a.tcp})
		}
	}
	return out
}
