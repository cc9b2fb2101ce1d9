package kubernetes

import (
	"context"
	"encoding/json"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	//lint:ignore SA1019 client-go v0.37.2's spdy and portforward dialers still take and return this package's types
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/berth-sh/berth/backend"
)

// DialAgent implements backend.AgentDialer: a port-forward, through the API server
// and the kubelet, to AgentPort on the loopback of the running sandbox's Pod, where
// its agent listens (the host then speaks berth's token handshake over it). Each
// dial is a new stream pair on the one port-forward connection (SPDY over the API
// server's TLS) that the driver keeps per Pod (see forward). Errors: ErrNotFound
// (no sandbox), ErrConflict (not running, or stopped: a volume claim without a
// Pod), ErrUnavailable (the API server or the kubelet cannot forward).
func (d *Driver) DialAgent(ctx context.Context, name string) (net.Conn, error) {
	p, err := d.get(ctx, name)
	if errors.Is(err, backend.ErrNotFound) {
		d.pool.drop(PodName(name)) // gone behind berth's back: its connection leads nowhere
	}
	if err != nil {
		return nil, d.ifStopped(ctx, name, err)
	}
	if err := ours(name, p, ""); err != nil {
		return nil, err
	}
	if !containerRunning(p) || p.DeletionTimestamp != nil {
		return nil, backend.Errorf(backend.ErrConflict, "kubernetes sandbox %s: the Pod %s is not running (%s)", name, p.Name, p.Status.Phase)
	}
	return d.forward(ctx, p)
}

// forward opens a forwarded connection to AgentPort of Pod p: a stream pair on the
// port-forward connection the driver keeps for p (dialled on first use, and again
// when it ended: its idle timeout, an API server or kubelet restart, a broken
// proxy). The kept connection saves the TLS handshake and the upgrade of every
// dial after the first (client-go's port-forward protocol multiplexes stream pairs
// by request id over one connection, as kubectl port-forward does for every local
// connection).
//
// A connection on which a pair was refused (nothing listened on the port yet: the
// agent was starting, or gone) or ended without carrying a byte opens no more
// pairs and is closed once its last pair is: measured against v1.37.2 with
// containerd 1.6, a pair opened on a connection whose earlier pairs had been
// refused sometimes never carried the agent's answer, so such a connection is
// never trusted again. Create's wait for a starting agent therefore dials a
// new connection per refused attempt and keeps the first that answers.
func (d *Driver) forward(ctx context.Context, p *corev1.Pod) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		fc, fresh, err := d.pool.get(ctx, p, d.dialForward)
		if err != nil {
			return nil, err
		}
		c, err := fc.open(AgentPort)
		if err == nil {
			return c, nil
		}
		fc.retire()
		if fresh || attempt > 0 {
			return nil, backend.Errorf(backend.ErrUnavailable, "kubernetes: port-forward to pod %s port %d: %w", p.Name, AgentPort, err)
		}
		// The kept connection had broken without our noticing: dial a new one.
	}
}

// dialTimeout bounds dialling a port-forward connection.
const dialTimeout = 30 * time.Second

// keptIdle is how long a kept port-forward connection without pairs stays open:
// it bounds what a Pod deleted behind berth's back, whose connection no dial comes
// to drop, holds (one TCP connection to the API server); the kubelet's own
// streaming idle timeout is 4 hours.
const keptIdle = 5 * time.Minute

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
		return nil, backend.Errorf(backend.ErrInvalid, "kubernetes: port-forward to pod %s: %w", p.Name, err)
	}
	client := &http.Client{Transport: transport, Timeout: dialTimeout}
	type result struct {
		c   httpstream.Connection
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The request has no context: the upgraded connection is kept beyond this
		// dial's ctx (see forward); ctx only ends the wait below.
		c, err := negotiate(client, upgrader, u.String())
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

// negotiate upgrades a POST to the port-forward URL u to SPDY with port-forward
// protocol v1. It is client-go's spdy.Negotiate, except that an answer other than
// 101 Switching Protocols becomes the API server's status error (forbidden, not
// found), which Negotiate flattens into text: Create must tell a missing
// pods/portforward permission, which waiting does not mend, from an agent that
// is not listening yet.
func negotiate(client *http.Client, upgrader spdy.Upgrader, u string) (httpstream.Connection, error) {
	req, err := http.NewRequest(http.MethodPost, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Add(httpstream.HeaderProtocolVersion, portforward.PortForwardProtocolV1Name)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var st metav1.Status
		if json.Unmarshal(body, &st) == nil && st.Kind == "Status" && st.Code != 0 {
			return nil, &apierrors.StatusError{ErrStatus: st}
		}
		return nil, apierrors.NewGenericServerResponse(resp.StatusCode, http.MethodPost, corev1.Resource("pods/portforward"), "", strings.TrimSpace(string(body)), 0, false)
	}
	return upgrader.NewConnection(resp)
}

// forwardPool holds the kept port-forward connection of each Pod, by Pod name.
// The zero value is ready to use.
type forwardPool struct {
	mu    sync.Mutex
	conns map[string]*forwardConn
	// dialing holds, per Pod name, a channel that is closed when the dial of that
	// Pod's connection under way ends, so that concurrent dials make one.
	dialing map[string]chan struct{}
}

// get returns p's kept connection, dialling one with dial when there is none (or
// it is retired, ended, or of an earlier Pod of the name); fresh reports that it
// was dialled now.
func (fp *forwardPool) get(ctx context.Context, p *corev1.Pod, dial func(context.Context, *corev1.Pod) (httpstream.Connection, error)) (fc *forwardConn, fresh bool, err error) {
	for {
		fp.mu.Lock()
		if fc := fp.conns[p.Name]; fc != nil {
			if fc.usable(p.UID) {
				fp.mu.Unlock()
				return fc, false, nil
			}
			delete(fp.conns, p.Name)
			fc.retireLocked()
		}
		wait, busy := fp.dialing[p.Name]
		if !busy {
			if fp.dialing == nil {
				fp.dialing = map[string]chan struct{}{}
			}
			wait = make(chan struct{})
			fp.dialing[p.Name] = wait
		}
		fp.mu.Unlock()
		if busy {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, false, fmt.Errorf("kubernetes: port-forward to pod %s: %w", p.Name, ctx.Err())
			}
		}
		conn, err := dial(ctx, p)
		fp.mu.Lock()
		delete(fp.dialing, p.Name)
		close(wait)
		if err != nil {
			fp.mu.Unlock()
			return nil, false, err
		}
		fc = &forwardConn{conn: conn, uid: p.UID, pool: fp, name: p.Name}
		if fp.conns == nil {
			fp.conns = map[string]*forwardConn{}
		}
		fp.conns[p.Name] = fc
		fc.idleLocked()
		fp.mu.Unlock()
		return fc, true, nil
	}
}

// drop retires the kept connection of Pod name (deleted, or gone).
func (fp *forwardPool) drop(name string) {
	fp.mu.Lock()
	fc := fp.conns[name]
	delete(fp.conns, name)
	fp.mu.Unlock()
	if fc != nil {
		fc.retire()
	}
}

// closeAll closes every kept connection and the pairs on them.
func (fp *forwardPool) closeAll() {
	fp.mu.Lock()
	conns := fp.conns
	fp.conns = nil
	fp.mu.Unlock()
	for _, fc := range conns {
		fp.mu.Lock()
		fc.retired = true
		done := fc.closed
		fc.closed = true
		if fc.idle != nil {
			fc.idle.Stop()
		}
		fp.mu.Unlock()
		if !done {
			fc.conn.Close()
		}
	}
}

// forwardConn is one port-forward connection to a Pod; pool's mutex guards its
// counts.
type forwardConn struct {
	conn    httpstream.Connection
	uid     types.UID
	pool    *forwardPool
	name    string
	ids     atomic.Int64
	pairs   int  // stream pairs open on it
	retired bool // opens no more pairs; closed when the last one is
	closed  bool
	idle    *time.Timer
}

// usable reports whether fc may carry a new pair to the Pod of uid (pool's mutex
// held).
func (fc *forwardConn) usable(uid types.UID) bool {
	if fc.retired || fc.uid != uid {
		return false
	}
	select {
	case <-fc.conn.CloseChan():
		return false
	default:
		return true
	}
}

// retire stops fc from carrying new pairs and closes it once it carries none.
func (fc *forwardConn) retire() {
	fc.pool.mu.Lock()
	defer fc.pool.mu.Unlock()
	fc.retireLocked()
}

// retireLocked is retire with pool's mutex held.
func (fc *forwardConn) retireLocked() {
	fp := fc.pool
	fc.retired = true
	if fp.conns[fc.name] == fc {
		delete(fp.conns, fc.name)
	}
	if fc.pairs == 0 {
		fc.closeLocked()
	}
}

// closeLocked closes the connection, once (pool's mutex held).
func (fc *forwardConn) closeLocked() {
	if fc.idle != nil {
		fc.idle.Stop()
	}
	if !fc.closed {
		fc.closed = true
		go fc.conn.Close() // it resets its streams and may wait for the network
	}
}

// idleLocked starts the timer that retires fc after keptIdle without pairs (pool's
// mutex held).
func (fc *forwardConn) idleLocked() {
	if fc.idle != nil {
		fc.idle.Stop()
	}
	fc.idle = time.AfterFunc(keptIdle, fc.retire)
}

// open creates the error and data streams of one forwarded connection to port.
func (fc *forwardConn) open(port int) (net.Conn, error) {
	fp := fc.pool
	fp.mu.Lock()
	fc.pairs++
	if fc.idle != nil {
		fc.idle.Stop()
	}
	fp.mu.Unlock()
	c, err := fc.openPair(port)
	if err != nil {
		fc.release()
	}
	return c, err
}

// release counts a pair on fc as closed.
func (fc *forwardConn) release() {
	fp := fc.pool
	fp.mu.Lock()
	defer fp.mu.Unlock()
	fc.pairs--
	switch {
	case fc.pairs > 0:
	case fc.retired:
		fc.closeLocked()
	default:
		fc.idleLocked()
	}
}

func (fc *forwardConn) openPair(port int) (net.Conn, error) {
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
		errStream.Reset()
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
			fc.retire()
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
	got       atomic.Bool   // a Read returned bytes
	closeOnce sync.Once
}

// Read reads the data stream. When it ends, the error stream says whether the
// kubelet could forward at all (nothing listening yet: "connection refused"), and
// that message then becomes the error: the kubelet ends the data stream before it
// closes the error stream, so Read waits for the latter (or Close, or the
// connection's end).
func (c *streamConn) Read(b []byte) (int, error) {
	n, err := c.data.Read(b)
	if n > 0 {
		c.got.Store(true)
	}
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

// Close ends both halves and forgets the streams. A pair that never carried a
// byte retires its connection (see forward).
func (c *streamConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.data.Reset()
		c.errStream.Reset()
		c.fc.conn.RemoveStreams(c.data, c.errStream)
		if !c.got.Load() {
			c.fc.retire()
		}
		c.fc.release()
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
