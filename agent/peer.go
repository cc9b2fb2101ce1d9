package agent

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// overflowUID is the uid Linux reports for a user that the reader's user namespace
// does not map (/proc/sys/kernel/overflowuid's default): such a peer's real user is
// unknown, so it is not told apart from the host by its uid.
const overflowUID = 65534

// peerCheck is the agent's check of who is on the other end of a new connection,
// besides the token: a process of the sandbox that runs as one of the sandbox's
// users other than root and the agent's own user must not use the agent, which would
// run commands for it as any user (ExecRequest.User), root included. The host is
// outside the sandbox: its end of a unix socket has no pid in the agent's PID
// namespace, and its end of a port-forward is made by the runtime, as root.
type peerCheck struct {
	self uint32 // the agent's effective uid
	// tcpTables are the socket tables searched for a TCP peer (/proc/net/tcp and
	// tcp6; tests replace them).
	tcpTables []string
}

func newPeerCheck() peerCheck {
	return peerCheck{self: uint32(os.Geteuid()), tcpTables: []string{"/proc/net/tcp", "/proc/net/tcp6"}}
}

// deny returns why conn's peer may not use the agent, or "" when it may (or cannot
// be told: the token decides then).
func (p peerCheck) deny(conn net.Conn) string {
	switch c := conn.(type) {
	case *net.UnixConn:
		raw, err := c.SyscallConn()
		if err != nil {
			return ""
		}
		var cred *unix.Ucred
		var cerr error
		if err := raw.Control(func(fd uintptr) {
			cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		}); err != nil || cerr != nil {
			return ""
		}
		return unixPeerVerdict(cred.Pid, cred.Uid, p.self)
	case *net.TCPConn:
		local, ok1 := c.LocalAddr().(*net.TCPAddr)
		remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
		if !ok1 || !ok2 {
			return ""
		}
		uid, ok := p.tcpOwner(remote, local)
		if !ok {
			return ""
		}
		return tcpPeerVerdict(uid, p.self)
	}
	return ""
}

// unixPeerVerdict decides for a unix-socket peer with SO_PEERCRED pid and uid (as
// the agent's namespaces see them) and an agent running as uid self: a peer whose
// pid is 0 is outside the agent's PID namespace (the host; a process of the sandbox
// has a pid there, nested namespaces included), root may do anything in the sandbox
// anyway, and a peer of the agent's own user could do all the agent does (the local
// driver, where host and sandbox are one user). Anyone else is a user of the sandbox.
func unixPeerVerdict(pid int32, uid, self uint32) string {
	if pid == 0 || uid == 0 || uid == self {
		return ""
	}
	return fmt.Sprintf("connection from process %d (uid %d) of the sandbox: only berth's host may use the agent, which would run commands for it as any user", pid, uid)
}

// tcpPeerVerdict decides for a TCP peer whose socket belongs to uid (its creator,
// from the socket table) and an agent running as uid self, as unixPeerVerdict does:
// a port-forward's socket is made by the runtime, as root (or by a user the agent's
// user namespace does not map: overflowUID).
func tcpPeerVerdict(uid, self uint32) string {
	if uid == 0 || uid == self || uid == overflowUID {
		return ""
	}
	return fmt.Sprintf("connection from a socket of uid %d of the sandbox: only berth's host may use the agent, which would run commands for it as any user", uid)
}

// tcpOwner returns the owner's uid of the TCP socket whose local address is peer and
// whose remote address is ours (the peer's end of the connection), from the socket
// tables; false when no table lists it (another network namespace, no /proc).
func (p peerCheck) tcpOwner(peer, ours *net.TCPAddr) (uint32, bool) {
	for _, table := range p.tcpTables {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		uid, ok := findTCPOwner(bufio.NewScanner(f), peer, ours)
		f.Close()
		if ok {
			return uid, true
		}
	}
	return 0, false
}

// findTCPOwner scans a socket table in the format of proc_net_tcp(5) ("sl
// local_address rem_address st ... uid ..."; addresses as hex words in host byte
// order, ports in hex) for the row local == local, rem == remote and returns its
// uid. Hand-written: the table is a documented kernel format of a few columns, and
// no library of the project's reads it.
func findTCPOwner(sc *bufio.Scanner, local, remote *net.TCPAddr) (uint32, bool) {
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[0] == "sl" {
			continue
		}
		if !addrIs(f[1], local) || !addrIs(f[2], remote) {
			continue
		}
		uid, err := strconv.ParseUint(f[7], 10, 32)
		if err != nil {
			return 0, false
		}
		return uint32(uid), true
	}
	return 0, false
}

// addrIs reports whether the socket table's "ADDR:PORT" field s is a.
func addrIs(s string, a *net.TCPAddr) bool {
	hexIP, hexPort, ok := strings.Cut(s, ":")
	if !ok {
		return false
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil || int(port) != a.Port {
		return false
	}
	raw, err := hex.DecodeString(hexIP)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return false
	}
	// Each 32-bit word is printed as a number in host byte order.
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	return ip.Equal(a.IP)
}
