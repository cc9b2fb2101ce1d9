package agent

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/connectivity"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

// sandboxFixture is one sandbox as a driver sees it: the agent it runs now (nil when
// stopped), reached through a ConnCache whose ConnectFunc and IdentifyFunc read that
// state the way a driver reads its runtime's. Identities are agent PIDs; Meta records
// the socket dir the connection was made to.
type sandboxFixture struct {
	mu       sync.Mutex
	agent    *testAgent
	missing  bool
	connects atomic.Int32
	made     []*Conn[string] // every connection the ConnectFunc made
	cache    *ConnCache[string]
}

func newSandboxFixture(t *testing.T, a *testAgent) *sandboxFixture {
	f := &sandboxFixture{agent: a}
	f.cache = NewConnCache(f.connect, f.identify)
	t.Cleanup(func() { f.cache.Close() })
	return f
}

func (f *sandboxFixture) current() (*testAgent, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.agent, f.missing
}

func (f *sandboxFixture) connect(ctx context.Context, name string) (*Conn[string], error) {
	f.connects.Add(1)
	a, missing := f.current()
	switch {
	case missing:
		return nil, backend.Errorf(backend.ErrNotFound, "sandbox %s: not found", name)
	case a == nil:
		return nil, backend.Errorf(backend.ErrConflict, "sandbox %s is stopped", name)
	}
	c, err := NewClient(ctx, DialSocketDir(a.sockDir))
	if err != nil {
		return nil, err
	}
	conn := &Conn[string]{Client: c, Identity: strconv.Itoa(a.pid), Meta: a.sockDir}
	f.mu.Lock()
	f.made = append(f.made, conn)
	f.mu.Unlock()
	return conn, nil
}

func (f *sandboxFixture) identify(ctx context.Context, name string) (string, error) {
	a, missing := f.current()
	switch {
	case missing:
		return "", backend.Errorf(backend.ErrNotFound, "sandbox %s: not found", name)
	case a == nil:
		return "", nil
	}
	return strconv.Itoa(a.pid), nil
}

// set makes a the sandbox's agent (nil: stopped).
func (f *sandboxFixture) set(a *testAgent) {
	f.mu.Lock()
	f.agent = a
	f.mu.Unlock()
}

func (f *sandboxFixture) setMissing() {
	f.mu.Lock()
	f.missing = true
	f.mu.Unlock()
}

// echo runs `echo WORD` in sandbox sb through the cache and checks its output.
func (f *sandboxFixture) echo(t *testing.T, ctx context.Context, word string) error {
	t.Helper()
	out := &testwait.Buffer{}
	p, err := cacheExec(ctx, f.cache, "sb", backend.ExecRequest{Argv: []string{"echo", word}, Stdout: out})
	if err != nil {
		return err
	}
	res, err := p.Wait()
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || out.String() != word+"\n" {
		t.Errorf("echo %s: exit %d, output %q", word, res.ExitCode, out.String())
	}
	return nil
}

// cacheExec starts req in sandbox name through cc (Do's retry included).
func cacheExec[M any](ctx context.Context, cc *ConnCache[M], name string, req backend.ExecRequest) (backend.Process, error) {
	var p backend.Process
	err := cc.Do(ctx, name, func(c *Conn[M]) (err error) {
		p, err = c.Client.Exec(ctx, req)
		return err
	})
	return p, err
}

// closed reports whether c's Client has been closed.
func closed(c *Conn[string]) bool { return c.Client.conn.GetState() == connectivity.Shutdown }

// Concurrent calls share one connection; calls that connect at once keep one
// connection and close the others; Get while execs run (a Create adopting the running
// sandbox) returns the same connection and disturbs nothing.
func TestConnCacheShared(t *testing.T) {
	a := startAgent(t)
	f := newSandboxFixture(t, a)
	ctx := testCtx(t)

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.echo(t, ctx, "first"+strconv.Itoa(i)); err != nil {
				t.Errorf("first exec %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	cached, err := f.cache.Get(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	for _, c := range f.made {
		if c != cached && !closed(c) {
			t.Errorf("a connection that lost the race to be cached is still open")
		}
	}
	f.mu.Unlock()
	if closed(cached) {
		t.Fatal("the cached connection is closed")
	}

	connects := f.connects.Load()
	long, err := cacheExec(ctx, f.cache, "sb", backend.ExecRequest{Argv: []string{"sh", "-c", "read x; echo got $x"}, Stdin: true, Stdout: &testwait.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, err := f.cache.Get(ctx, "sb"); err != nil || c != cached {
				t.Errorf("Get during execs: %p %v, want the cached %p", c, err, cached)
			}
			if err := f.echo(t, ctx, "again"+strconv.Itoa(i)); err != nil {
				t.Errorf("exec %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if n := f.connects.Load(); n != connects {
		t.Errorf("%d more connects with a connection cached, want 0", n-connects)
	}
	long.Write([]byte("on\n"))
	if res, err := long.Wait(); err != nil || res.ExitCode != 0 {
		t.Errorf("the long exec: %+v %v", res, err)
	}
}

// An Unavailable answered by the live agent (it cannot open a file while its fd limit
// is exhausted, as it cannot fork under pids exhaustion) is returned as it is: the
// shared connection stays, and so do the execs running on it.
func TestConnCacheLiveAgentUnavailable(t *testing.T) {
	a := startAgent(t)
	f := newSandboxFixture(t, a)
	ctx := testCtx(t)
	if err := f.echo(t, ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	cached, _ := f.cache.Get(ctx, "sb")
	out := &testwait.Buffer{}
	long, err := cacheExec(ctx, f.cache, "sb", backend.ExecRequest{Argv: []string{"sh", "-c", "read x; echo got $x"}, Stdin: true, Stdout: out})
	if err != nil {
		t.Fatal(err)
	}

	// Lower the agent's fd limit to its lowest free fd: every open in it now fails.
	var old unix.Rlimit
	if err := unix.Prlimit(a.pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Skipf("prlimit: %v", err)
	}
	lim := unix.Rlimit{Cur: uint64(lowestFreeFD(t, a.pid)), Max: old.Max}
	if err := unix.Prlimit(a.pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Skipf("prlimit: %v", err)
	}
	err = f.echo(t, ctx, "starved")
	if rerr := unix.Prlimit(a.pid, unix.RLIMIT_NOFILE, &old, nil); rerr != nil {
		t.Fatalf("restoring the agent's fd limit: %v", rerr)
	}
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("exec with the agent's fds exhausted: %v, want the agent's ErrUnavailable", err)
	}
	if c, _ := f.cache.Get(ctx, "sb"); c != cached || closed(cached) {
		t.Fatal("the agent's own Unavailable dropped the shared connection")
	}
	long.Write([]byte("through\n"))
	if res, err := long.Wait(); err != nil || res.ExitCode != 0 || out.String() != "got through\n" {
		t.Errorf("the exec running beside it: %+v %v %q", res, err, out.String())
	}
	if err := f.echo(t, ctx, "after"); err != nil {
		t.Fatal(err)
	}
	if n := f.connects.Load(); n != 1 {
		t.Errorf("%d connects, want 1", n)
	}
}

// lowestFreeFD returns the lowest fd number that process pid has not open.
func lowestFreeFD(t *testing.T, pid int) int {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Skipf("reading the agent's fds: %v", err)
	}
	open := map[int]bool{}
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			open[n] = true
		}
	}
	n := 0
	for open[n] {
		n++
	}
	return n
}

// A call that fails because the sandbox now runs another agent is made once more on a
// new connection, and the stale one is closed; when the sandbox runs none, or is gone,
// the connection is dropped and the driver's error returned.
func TestConnCacheAgentReplaced(t *testing.T) {
	f := newSandboxFixture(t, startAgent(t))
	ctx := testCtx(t)
	first, b := f.restart(t, ctx)
	second, _ := f.cache.Get(ctx, "sb")
	if second == first || second.Meta != b.sockDir || !closed(first) {
		t.Errorf("after a restart: new connection %v (to %s), old one closed %v", second != first, second.Meta, closed(first))
	}
	if n := f.connects.Load(); n != 2 {
		t.Errorf("%d connects, want 2", n)
	}

	// Stopped: dropped, retried once, and the ConnectFunc's ErrConflict returned.
	shutdownAgent(t, b)
	f.set(nil)
	if err := f.echo(t, ctx, "three"); !errors.Is(err, backend.ErrConflict) {
		t.Errorf("exec in a stopped sandbox: %v, want ErrConflict", err)
	}
	if !closed(second) {
		t.Error("the connection to a stopped agent was kept")
	}

	// Gone while connected: the IdentifyFunc's error, and the connection dropped.
	c := startAgent(t)
	f.set(c)
	if err := f.echo(t, ctx, "four"); err != nil {
		t.Fatal(err)
	}
	third, _ := f.cache.Get(ctx, "sb")
	shutdownAgent(t, c)
	f.setMissing()
	connects := f.connects.Load()
	if err := f.echo(t, ctx, "five"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("exec in a removed sandbox: %v, want ErrNotFound", err)
	}
	if !closed(third) || f.connects.Load() != connects {
		t.Errorf("removed sandbox: connection closed %v, %d connects, want closed and none", closed(third), f.connects.Load()-connects)
	}
}

// Without an IdentifyFunc (Pool), every Unavailable drops the connection and the call
// is made once more.
func TestConnCacheNoIdentify(t *testing.T) {
	f := newSandboxFixture(t, startAgent(t))
	f.cache.identify = nil
	first, _ := f.restart(t, testCtx(t))
	if !closed(first) || f.connects.Load() != 2 {
		t.Errorf("old connection closed %v, %d connects; want closed, 2", closed(first), f.connects.Load())
	}
}

// Put replaces and closes; Take hands the connection over without closing it;
// Forget and Close close.
func TestConnCachePutTakeForget(t *testing.T) {
	a := startAgent(t)
	f := newSandboxFixture(t, a)
	ctx := testCtx(t)
	got := func() *Conn[string] {
		t.Helper()
		c, err := f.cache.Get(ctx, "sb")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	one := got()
	two, err := f.connect(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	f.cache.Put("sb", two)
	if !closed(one) || got() != two {
		t.Error("Put did not replace and close the cached connection")
	}
	f.cache.Put("sb", two)
	if closed(two) {
		t.Error("putting the cached connection again closed it")
	}
	if c := f.cache.Take("sb"); c != two || closed(two) {
		t.Error("Take did not hand over the open connection")
	}
	if c := f.cache.Take("sb"); c != nil {
		t.Error("Take of an empty entry returned a connection")
	}
	(*Conn[string])(nil).Close() // nil-safe, for Take's result
	two.Close()
	three := got()
	f.cache.Forget("sb")
	f.cache.Forget("sb")
	if !closed(three) {
		t.Error("Forget did not close the connection")
	}
	four := got()
	f.cache.Close()
	if !closed(four) {
		t.Error("Close did not close the connection")
	}
	if five := got(); closed(five) || five == four {
		t.Error("the cache is not usable after Close")
	}
	if c, err := f.cache.Get(ctx, "other"); err != nil || c.Meta != a.sockDir || c.Identity != strconv.Itoa(a.pid) {
		t.Errorf("Get of another name: %+v %v", c, err)
	}
}

// restart runs an exec on the sandbox's agent, then restarts the sandbox: its agent
// is gone and a new one runs, reached through a new socket dir (so nothing reconnects
// the old connection to it); an exec then runs on the new agent. It returns the
// connection of the first exec and the new agent.
func (f *sandboxFixture) restart(t *testing.T, ctx context.Context) (*Conn[string], *testAgent) {
	t.Helper()
	if err := f.echo(t, ctx, "before"); err != nil {
		t.Fatal(err)
	}
	first, _ := f.cache.Get(ctx, "sb")
	old, _ := f.current()
	shutdownAgent(t, old)
	b := startAgent(t)
	f.set(b)
	if err := f.echo(t, ctx, "after"); err != nil {
		t.Fatalf("exec after the agent was replaced: %v", err)
	}
	return first, b
}

// shutdownAgent asks a to end and waits until it has exited.
func shutdownAgent(t *testing.T, a *testAgent) {
	t.Helper()
	if err := a.c.Shutdown(testCtx(t), 0); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case <-a.exited:
	case <-testCtx(t).Done():
		t.Fatal("the agent did not exit after Shutdown")
	}
}
