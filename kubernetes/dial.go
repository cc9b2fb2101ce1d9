package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	//lint:ignore SA1019 client-go v0.37.2's spdy and portforward dialers still take and return this package's types
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/berth-sh/berth/backend"
)

// DialAgent implements backend.AgentDialer: a port-forward, through the API server
// and the kubelet, to AgentPort on the loopback of the running sandbox's Pod, where
// its agent listens (the host then speaks berth's token handshake over it), one
// port-forward connection (SPDY over the API server's TLS) per dial. Errors: ErrNotFound (no sandbox),
// ErrConflict (not running), ErrUnavailable (the API server or the kubelet cannot
// forward).
func (d *Driver) DialAgent(ctx context.Context, name string) (net.Conn, error) {
	p, err := d.get(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := ours(name, p, ""); err != nil {
		return nil, err
	}
	if !containerRunning(p) || p.DeletionTimestamp != nil {
		return nil, backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s: the Pod %s is not running (%s)", name, p.Name, p.Status.Phase)
	}
	return d.forward(ctx, p)
}

// forwardConn is one port-forward connection to a Pod.
type forwardConn struct {
	conn httpstream.Connection
	ids  atomic.Int64
}

// forward dials a port-forward connection to Pod p and opens one stream pair to
// AgentPort on it; closing the returned connection closes the port-forward
// connection too. (Keeping one connection per Pod and opening a stream pair per
// dial saves the TLS handshake and upgrade, but measured against v1.37.2 a stream
// pair opened on a connection whose earlier pairs had been refused, while the
// agent was starting, sometimes never carried the agent's answer.)
func (d *Driver) forward(ctx context.Context, p *corev1.Pod) (net.Conn, error) {
	conn, err := d.dialForward(ctx, p)
	if err != nil {
		return nil, err
	}
	fc := &forwardConn{conn: conn}
	c, err := fc.open(AgentPort)
	if err != nil {
		conn.Close()
		return nil, backend.Errorf(backend.ErrUnavailable, "kubernetes: port-forward to pod %s port %d: %v", p.Name, AgentPort, err)
	}
	c.(*streamConn).own = true
	return c, nil
}

// dialTimeout bounds dialling a port-forward connection.
const dialTimeout = 30 * time.Second

// dialForward dials the port-forward subresource of Pod p over SPDY (client-go's
// spdy dialer and portforward's protocol name, as kubectl port-forward's fallback).
// Not client-go's SPDY-over-WebSocket tunnel, kubectl's first choice: through it
// the kubelet's close of a stream pair's error stream did not reach the client
// (measured against v1.37.2), so a forward refused because the agent does not
// listen yet could not be told from a slow one.
func (d *Driver) dialForward(ctx context.Context, p *corev1.Pod) (httpstream.Connection, error) {
	rc, err := d.restConfig()
	if err != nil {
		return nil, err
	}
	cs, ns, err := d.client()
	if err != nil {
		return nil, err
	}
	u := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(p.Name).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(rc)
	if err != nil {
		return nil, backend.Errorf(backend.ErrInvalid, "kubernetes: port-forward to pod %s: %v", p.Name, err)
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport, Timeout: dialTimeout}, http.MethodPost, u)
	type result struct {
		c   httpstream.Connection
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, d.wrap(fmt.Sprintf("port-forward to pod %s", p.Name), r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("kubernetes: port-forward to pod %s: %w", p.Name, ctx.Err())
	}
}

// open creates the error and data streams of one forwarded connection to port.
func (fc *forwardConn) open(port int) (net.Conn, error) {
	id := strconv.FormatInt(fc.ids.Add(1), 10)
	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, strconv.Itoa(port))
	h.Set(corev1.PortForwardRequestIDHeader, id)
	errStream, err := fc.conn.CreateStream(h)
	if err != nil {
		return nil, err
	}
	errStream.Close() // nothing is written to it
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := fc.conn.CreateStream(h)
	if err != nil {
		fc.conn.RemoveStreams(errStream)
		return nil, err
	}
	c := &streamConn{fc: fc, data: data, errStream: errStream, remoteErr: make(chan struct{}), closed: make(chan struct{})}
	go func() {
		// The kubelet writes here why it could not forward (nothing listens on the
		// port yet: "connection refused"), then closes the stream.
		msg, _ := io.ReadAll(io.LimitReader(errStream, 4096))
		if len(msg) > 0 {
			c.errMsg.Store(strings.TrimSpace(string(msg)))
			data.Reset()
		}
		close(c.remoteErr)
	}()
	return c, nil
}

// streamConn is one forwarded connection as a net.Conn. Deadlines are not
// supported (the SPDY streams have none), as for the plugin's DialAgent streams:
// cancel the call or close the connection to end a blocked read.
type streamConn struct {
	fc        *forwardConn
	data      httpstream.Stream
	errStream httpstream.Stream
	errMsg    atomic.Value // string
	remoteErr chan struct{}
	closed    chan struct{} // closed by Close
	own       bool          // Close closes fc's connection too
	closeOnce sync.Once
}

// Read reads the data stream. When it ends, the error stream says whether the
// kubelet could forward at all (nothing listening yet: "connection refused"), and
// that message then becomes the error: the kubelet ends the data stream before it
// closes the error stream, so Read waits for the latter (or Close, or the
// connection's end).
func (c *streamConn) Read(b []byte) (int, error) {
	n, err := c.data.Read(b)
	if err != nil && n == 0 {
		select {
		case <-c.remoteErr:
		case <-c.closed:
		case <-c.fc.conn.CloseChan():
		}
		if m, ok := c.errMsg.Load().(string); ok && m != "" {
			return 0, backend.Errorf(backend.ErrUnavailable, "kubernetes port-forward: %s", m)
		}
	}
	return n, err
}

func (c *streamConn) Write(b []byte) (int, error) {
	n, err := c.data.Write(b)
	if err != nil {
		if m, ok := c.errMsg.Load().(string); ok && m != "" {
			return n, backend.Errorf(backend.ErrUnavailable, "kubernetes port-forward: %s", m)
		}
	}
	return n, err
}

// CloseWrite ends the host's half: the agent reads EOF.
func (c *streamConn) CloseWrite() error { return c.data.Close() }

// Close ends both halves, forgets the streams and closes the port-forward
// connection.
func (c *streamConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.data.Reset()
		c.errStream.Reset()
		c.fc.conn.RemoveStreams(c.data, c.errStream)
		if c.own {
			c.fc.conn.Close()
		}
	})
	return nil
}

type forwardAddr string

func (a forwardAddr) Network() string { return "kubernetes-port-forward" }
func (a forwardAddr) String() string  { return string(a) }

func (c *streamConn) LocalAddr() net.Addr  { return forwardAddr("local") }
func (c *streamConn) RemoteAddr() net.Addr { return forwardAddr("pod:" + strconv.Itoa(AgentPort)) }

var errNoDeadline = errors.New("kubernetes port-forward connection: deadlines are not supported")

func (c *streamConn) SetDeadline(time.Time) error      { return errNoDeadline }
func (c *streamConn) SetReadDeadline(time.Time) error  { return errNoDeadline }
func (c *streamConn) SetWriteDeadline(time.Time) error { return errNoDeadline }
