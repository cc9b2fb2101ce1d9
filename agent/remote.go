package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
)

// This file holds what berth's agent needs in a sandbox that the host reaches
// through a remote transport (a Kubernetes port-forward) rather than a socket on
// its own filesystem: a loopback TCP listener, and a way to leave its network
// namespace with loopback only (InstallSelf, in install.go, puts it in place).

// listenTCP listens on addr, which must be a loopback address with a port, for an
// agent that has a token: every process in the agent's network namespace can
// connect to a TCP port, so the token handshake is what keeps them out.
func listenTCP(addr string, token []byte) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "agent: --listen-tcp %q: want a loopback address with a port, e.g. 127.0.0.1:7070: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, backend.Errorf(backend.ErrInvalid, "agent: --listen-tcp %q: only a loopback address (127.0.0.1, ::1) is accepted; the agent is reached from outside its network namespace through the runtime (a port-forward), never over the network", addr)
	}
	if token == nil {
		return nil, backend.Errorf(backend.ErrInvalid, "agent: --listen-tcp %q needs a token (--token-file): every process of the network namespace can reach a TCP port", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("agent: listening on %s: %w", addr, err)
	}
	return l, nil
}

// NetNone deletes every network interface of the calling process's network
// namespace except loopback, which it brings up, so that a Pod on any CNI has
// network "none": only lo. Deleting a veth end deletes its peer on the node too,
// which CNI plugins' DEL tolerates (a missing interface is not an error there).
// It needs CAP_NET_ADMIN in the namespace's owning user namespace (a Kubernetes
// init container with that one capability). An interface that the kernel refuses
// to delete (the tunl0 and sit0 devices a module makes in every namespace) is set
// down instead, and the error names it.
//
// Hand-written over netlink (x/sys/unix) rather than with a netlink library: it is
// two messages (RTM_DELLINK, RTM_NEWLINK with IFF_UP), and the agent is linked into
// every berth binary.
//
// It refuses to run unless it is PID 1 (the first process of a container, in a PID
// namespace of its own): run on a host by mistake it would take the host's network
// down.
func NetNone() error {
	if os.Getpid() != 1 {
		return backend.Errorf(backend.ErrInvalid, "agent net-none: refusing to run as pid %d: it deletes every network interface of its network namespace but lo, and runs only as the first process of a container (the init container of a Kubernetes sandbox), never on a host", os.Getpid())
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("agent net-none: listing interfaces: %w", err)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("agent net-none: netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("agent net-none: netlink bind: %w", err)
	}
	var errs []error
	seq := uint32(1)
	for _, ifc := range ifaces {
		seq++
		if ifc.Flags&net.FlagLoopback != 0 {
			if err := linkRequest(fd, seq, unix.RTM_NEWLINK, int32(ifc.Index), unix.IFF_UP, unix.IFF_UP); err != nil {
				errs = append(errs, fmt.Errorf("bringing %s up: %w", ifc.Name, err))
			}
			continue
		}
		err := linkRequest(fd, seq, unix.RTM_DELLINK, int32(ifc.Index), 0, 0)
		if errors.Is(err, unix.ENODEV) {
			continue // gone with its veth peer, deleted just before
		}
		if err != nil {
			seq++
			if derr := linkRequest(fd, seq, unix.RTM_NEWLINK, int32(ifc.Index), 0, unix.IFF_UP); derr != nil {
				err = errors.Join(err, derr)
			}
			errs = append(errs, fmt.Errorf("deleting %s (set down instead): %w", ifc.Name, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("agent net-none: %w", errors.Join(errs...))
	}
	return nil
}

// linkRequest sends one rtnetlink link message (typ RTM_DELLINK or RTM_NEWLINK,
// with ifinfomsg flags and change mask) for interface index and waits for its
// acknowledgement, returning the kernel's error.
func linkRequest(fd int, seq uint32, typ uint16, index int32, flags, change uint32) error {
	const hdr, ifi = unix.SizeofNlMsghdr, unix.SizeofIfInfomsg
	b := make([]byte, hdr+ifi)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], typ)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	ne.PutUint32(b[8:], seq)
	// ifinfomsg: family, pad, type (u16), index (i32), flags, change.
	b[hdr] = unix.AF_UNSPEC
	ne.PutUint32(b[hdr+4:], uint32(index))
	ne.PutUint32(b[hdr+8:], flags)
	ne.PutUint32(b[hdr+12:], change)
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		if n < hdr {
			return io.ErrUnexpectedEOF
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if len(m.Data) < 4 {
				return io.ErrUnexpectedEOF
			}
			if code := int32(ne.Uint32(m.Data[:4])); code != 0 {
				return syscall.Errno(-code)
			}
			return nil
		}
	}
}
