package agent

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
)

// The user check of a connection: the host (no pid in the agent's PID namespace),
// root and the agent's own user may use the agent; any other user of the sandbox
// may not, over a unix socket or TCP.
func TestPeerVerdicts(t *testing.T) {
	for _, c := range []struct {
		pid       int32
		uid, self uint32
		allowed   bool
	}{
		{0, 1000, 0, true},     // the host, outside the sandbox's PID namespace
		{0, 65534, 0, true},    // the host as an unmapped user (user namespaces)
		{17, 0, 0, true},       // root of the sandbox
		{17, 1000, 1000, true}, // the agent's own user (local)
		{17, 1000, 0, false},   // the sandbox's user, agent as root
		{17, 65534, 0, false},  // nobody, in the sandbox
		{17, 0, 1000, true},    // root beside an agent of a user
		{17, 1001, 1000, false},
	} {
		why := unixPeerVerdict(c.pid, c.uid, c.self)
		if (why == "") != c.allowed {
			t.Errorf("unix peer pid %d uid %d, agent uid %d: %q, want allowed=%v", c.pid, c.uid, c.self, why, c.allowed)
		}
		if !c.allowed && !strings.Contains(why, fmt.Sprint(c.uid)) {
			t.Errorf("refusal %q does not name uid %d", why, c.uid)
		}
	}
	for _, c := range []struct {
		uid, self uint32
		allowed   bool
	}{
		{0, 0, true}, {1000, 1000, true}, {65534, 0, true}, {1000, 0, false}, {1001, 1000, false},
	} {
		if why := tcpPeerVerdict(c.uid, c.self); (why == "") != c.allowed {
			t.Errorf("tcp peer uid %d, agent uid %d: %q, want allowed=%v", c.uid, c.self, why, c.allowed)
		}
	}
}

// word prints a 4-byte address word as proc_net_tcp(5) does: the number in host
// byte order, in hex.
func word(b []byte) string {
	return fmt.Sprintf("%08X", binary.NativeEndian.Uint32(b))
}

// The socket table parser finds the row of an IPv4 and an IPv6 connection by both
// addresses, and takes no row whose remote end differs.
func TestFindTCPOwner(t *testing.T) {
	v4 := func(ip string, port int) string { return fmt.Sprintf("%s:%04X", word(net.ParseIP(ip).To4()), port) }
	v6 := func(ip string, port int) string {
		b := net.ParseIP(ip).To16()
		return fmt.Sprintf("%s%s%s%s:%04X", word(b[0:4]), word(b[4:8]), word(b[8:12]), word(b[12:16]), port)
	}
	table := strings.Join([]string{
		"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
		"   0: " + v4("127.0.0.1", 7070) + " " + v4("0.0.0.0", 0) + " 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0",
		"   1: " + v4("127.0.0.1", 40000) + " " + v4("127.0.0.1", 7071) + " 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 20 4 30 10 -1",
		"   2: " + v4("127.0.0.1", 40000) + " " + v4("127.0.0.1", 7070) + " 01 00000000:00000000 00:00000000 00000000  1234        0 3 1 0 20 4 30 10 -1",
		"   3: " + v6("::1", 40001) + " " + v6("::1", 7070) + " 01 00000000:00000000 00:00000000 00000000  4321        0 4 1 0 20 4 30 10 -1",
	}, "\n")
	find := func(local, remote *net.TCPAddr) (uint32, bool) {
		return findTCPOwner(bufio.NewScanner(strings.NewReader(table)), local, remote)
	}
	if uid, ok := find(&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 40000}, &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 7070}); !ok || uid != 1234 {
		t.Errorf("IPv4 row: %d %v, want 1234", uid, ok)
	}
	if uid, ok := find(&net.TCPAddr{IP: net.ParseIP("::1"), Port: 40001}, &net.TCPAddr{IP: net.ParseIP("::1"), Port: 7070}); !ok || uid != 4321 {
		t.Errorf("IPv6 row: %d %v, want 4321", uid, ok)
	}
	if uid, ok := find(&net.TCPAddr{IP: net.ParseIP("127.0.0.2"), Port: 40000}, &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 7070}); ok {
		t.Errorf("a row of another address matched: %d", uid)
	}
	// And in the kernel's own table: a connection of this process is ours.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uid, ok := newPeerCheck().tcpOwner(c.LocalAddr().(*net.TCPAddr), l.Addr().(*net.TCPAddr))
	if !ok || uid != uint32(os.Geteuid()) {
		t.Errorf("tcpOwner of this process's connection: %d %v, want %d", uid, ok, os.Geteuid())
	}
}

// A process of another user than root and the agent's (a sandbox's user) that
// connects to the agent's socket or TCP port is refused at the handshake, even with
// the right token, and `berth agent probe` reports it; the agent's own user gets in.
// Needs root (to run a process as another user).
func TestPeerOfOtherUserRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run the probe as another user")
	}
	pub, err := os.MkdirTemp("", "berth-peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pub) })
	os.Chmod(pub, 0o755)
	bin := filepath.Join(pub, "berth-agent")
	if err := copyExecutable(agentBin, bin); err != nil {
		t.Fatal(err)
	}
	tok := bytes.Repeat([]byte{0x42}, tokenLen)
	creds := &tokenCreds{token: tok, timeout: time.Minute, peer: newPeerCheck()}
	// In-process servers of the handshake: what they answer is the agent's check.
	serve := func(l net.Listener) <-chan error {
		errc := make(chan error, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				errc <- err
				return
			}
			defer c.Close()
			_, _, err = creds.ServerHandshake(c)
			errc <- err
		}()
		return errc
	}
	unixL, err := net.Listen("unix", filepath.Join(pub, backend.AgentSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer unixL.Close()
	os.Chmod(filepath.Join(pub, backend.AgentSocketName), 0o777)
	tcpL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcpL.Close()

	probeAs := func(uid uint32, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append(append([]string{"probe", "--token-stdin"}, args...), "--", "true")...)
		cmd.Stdin = strings.NewReader(hex.EncodeToString(tok) + "\n")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("probe as uid %d: %v %s", uid, err, stderr.Bytes())
		}
		return string(out)
	}
	for _, c := range []struct {
		name string
		l    net.Listener
		args []string
	}{
		{"unix", unixL, []string{"--socket-dir", pub}},
		{"tcp", tcpL, []string{"--tcp", tcpL.Addr().String()}},
	} {
		errc := serve(c.l)
		out := probeAs(1234, c.args...)
		herr := <-errc
		if herr == nil || !strings.Contains(herr.Error(), "uid 1234") {
			t.Errorf("%s: handshake of uid 1234 with the right token: %v, want a refusal naming uid 1234", c.name, herr)
		}
		if !strings.Contains(out, "refused:") || !strings.Contains(out, "uid 1234") {
			t.Errorf("%s: probe as uid 1234 says %q, want refused naming uid 1234", c.name, out)
		}
		// The agent's own user (root, this process) passes the handshake.
		errc = serve(c.l)
		conn, err := net.Dial(c.l.Addr().Network(), c.l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _, cerr := clientHandshake(testCtx(t), conn, tok, nil, true)
		conn.Close()
		if herr := <-errc; herr != nil || cerr != nil {
			t.Errorf("%s: handshake of the agent's own user: %v / %v", c.name, herr, cerr)
		}
	}
}

// `berth agent probe` finds agents by their command lines.
func TestFindAgents(t *testing.T) {
	proc := t.TempDir()
	write := func(pid string, args ...string) {
		os.MkdirAll(filepath.Join(proc, pid), 0o755)
		os.WriteFile(filepath.Join(proc, pid, "cmdline"), []byte(strings.Join(args, "\x00")+"\x00"), 0o644)
	}
	write("1", "/.berth/agent/berth-agent", "serve", "--socket-dir", "/.berth/run", "--listen-tcp", "127.0.0.1:7070")
	write("7", "sh", "-c", "sleep 1")
	write("self", "/.berth/agent/berth-agent", "serve", "--socket-dir", "/elsewhere")
	got := findAgents(proc)
	want := []probeAddr{{socketDir: "/.berth/run"}, {tcp: "127.0.0.1:7070"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("findAgents: %v, want %v", got, want)
	}
	var out, errb bytes.Buffer
	if code := probe(nil, strings.NewReader(""), &out, &errb); code != 2 {
		t.Errorf("probe without a command: code %d, want 2 (usage)", code)
	}
}
