package local_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-sh/berth/agent/agenttest"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/local"
	"github.com/berth-sh/berth/registry"
)

// directEnv is a state dir and config whose sessions run on the local driver in
// this process; every registry opened on it counts how often it made the driver.
type directEnv struct {
	t     *testing.T
	state string
	cfg   string
}

func newDirectEnv(t *testing.T, cfg string) *directEnv {
	e := &directEnv{t: t, state: t.TempDir(), cfg: cfg}
	// Local sandboxes outlive their registry (their agents run on): remove every
	// session at the end, before the state dir goes.
	t.Cleanup(func() { removeSessions(t, e.state, e.cfg) })
	return e
}

// localRegistries parses cfg (a config text) for the state dir state and returns an
// opener of registries on them: the local driver in the test's process, berthBin as
// the berth binary, and opts. Each registry is closed when t ends, after which every
// session of state is removed.
func localRegistries(t *testing.T, state, cfg string, opts ...registry.Option) func() *registry.Registry {
	t.Helper()
	c, err := config.Parse([]byte(cfg), filepath.Join(state, "config.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeSessions(t, state, cfg) })
	return func() *registry.Registry {
		t.Helper()
		r, err := registry.Open(context.Background(), c, append([]registry.Option{registry.WithStateDir(state), registry.WithBerthBinary(berthBin),
			registry.WithDriver(local.Name, func() backend.TerminalBackend { return local.New() })}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
}

// removeSessions removes every session recorded in state (their sandboxes and
// agents) through a registry on cfg.
func removeSessions(t *testing.T, state, cfg string) {
	c, err := config.Parse([]byte(cfg), filepath.Join(state, "config.hcl"))
	if err != nil {
		t.Error(err)
		return
	}
	r, err := registry.Open(context.Background(), c, registry.WithStateDir(state), registry.WithBerthBinary(berthBin),
		registry.WithDriver(local.Name, func() backend.TerminalBackend { return local.New() }))
	if err != nil {
		t.Error(err)
		return
	}
	defer r.Close()
	ctx := context.Background()
	infos, err := r.Sessions(ctx)
	if err != nil {
		t.Error(err)
	}
	for _, in := range infos {
		if err := r.RemoveSession(ctx, in.Session); err != nil {
			t.Errorf("removing session %s: %v", in.Session, err)
		}
	}
}

// open opens a registry on the env; made counts the local drivers it constructs
// (one per start of the driver).
func (e *directEnv) open() (*registry.Registry, *atomic.Int32) {
	e.t.Helper()
	c, err := config.Parse([]byte(e.cfg), filepath.Join(e.state, "config.hcl"))
	if err != nil {
		e.t.Fatal(err)
	}
	made := &atomic.Int32{}
	r, err := registry.Open(context.Background(), c, registry.WithStateDir(e.state), registry.WithBerthBinary(berthBin),
		registry.WithDriver(local.Name, func() backend.TerminalBackend { made.Add(1); return local.New() }))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { r.Close() })
	return r, made
}

// execIn runs `sh -c script` in session through r.
func execIn(t *testing.T, r *registry.Registry, session, script string) (string, *registry.Lease, error) {
	t.Helper()
	var out bytes.Buffer
	p, lease, err := r.Exec(context.Background(), session, backend.ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &out})
	if err != nil {
		return "", nil, err
	}
	res, err := p.Wait()
	if err == nil && res.ExitCode != 0 {
		t.Fatalf("%q exited %d", script, res.ExitCode)
	}
	return out.String(), lease, err
}

// sandboxDir is the host dir of session's sandbox (the registry's layout).
func (e *directEnv) sandboxDir(t *testing.T, r *registry.Registry, session string) string {
	ex, err := r.Explain(session)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(e.state, "sandboxes", local.Name, ex.Sandbox)
}

// A session whose sandbox runs is served by its agent alone: a second registry
// (another berth process) runs its exec, its shell call, its job and copy calls
// without starting the driver; drift is still reported from the record.
func TestDirectPathStartsNoDriver(t *testing.T) {
	e := newDirectEnv(t, "scope \"*\" {\n  driver = \"local\"\n}\n")
	r1, made1 := e.open()
	if out, lease, err := execIn(t, r1, "chat:1", "echo first > f; echo ok"); err != nil || out != "ok\n" || lease.Direct || !lease.Created {
		t.Fatalf("first exec: %q %+v %v", out, lease, err)
	}
	if made1.Load() != 1 {
		t.Fatalf("the first exec made the driver %d times, want once", made1.Load())
	}
	r1.Close()

	r2, made2 := e.open()
	out, lease, err := execIn(t, r2, "chat:1", "cat f")
	if err != nil || out != "first\n" || !lease.Direct || lease.Drift {
		t.Fatalf("exec in the running sandbox: %q %+v %v", out, lease, err)
	}
	ctx := context.Background()
	if res, err := r2.Shell(ctx, "chat:1", registry.ShellRequest{Command: "cd /tmp && echo shell"}); err != nil || res.Stdout != "shell\n" || res.Cwd != "/tmp" {
		t.Errorf("shell call: %+v %v", res, err)
	}
	j, err := r2.JobStart(ctx, "chat:1", registry.JobStartRequest{Argv: []string{"sleep", "300"}})
	if err != nil {
		t.Fatalf("job start: %v", err)
	}
	if jobs, err := r2.Jobs(ctx, "chat:1"); err != nil || len(jobs) != 1 || !jobs[0].Running {
		t.Errorf("jobs: %+v %v", jobs, err)
	}
	if err := r2.JobKill(ctx, "chat:1", j.ID); err != nil {
		t.Errorf("job kill: %v", err)
	}
	var tarOut bytes.Buffer
	if err := r2.CopyOut(ctx, "chat:1", "f", &tarOut); err != nil || tarOut.Len() == 0 {
		t.Errorf("copy out: %d bytes, %v", tarOut.Len(), err)
	}
	if n := made2.Load(); n != 0 {
		t.Errorf("calls on a running sandbox made the driver %d times, want never", n)
	}
	// A changed rule is drift, found from the record without the driver.
	e.cfg = "scope \"*\" {\n  driver = \"local\"\n  env = { EXTRA = \"1\" }\n}\n"
	r3, made3 := e.open()
	if _, lease, err := execIn(t, r3, "chat:1", "true"); err != nil || !lease.Direct || !lease.Drift {
		t.Errorf("exec after the rule changed: %+v %v, want direct with drift", lease, err)
	}
	if made3.Load() != 0 {
		t.Errorf("drift made the driver %d times", made3.Load())
	}
}

// A sandbox stopped or removed behind berth's back is noticed at the first dial:
// the next call runs the lifecycle (a stopped one starts again with its files, a
// removed one is recreated and said so).
func TestDirectPathNoticesStoppedAndRemoved(t *testing.T) {
	e := newDirectEnv(t, "scope \"*\" {\n  driver = \"local\"\n}\n")
	r, _ := e.open()
	if _, _, err := execIn(t, r, "s:1", "echo kept > f"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ex, _ := r.Explain("s:1")
	d, err := r.Backend(ctx, local.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx, ex.Sandbox, 0); err != nil {
		t.Fatal(err)
	}
	out, lease, err := execIn(t, r, "s:1", "cat f")
	if err != nil || out != "kept\n" || lease.Direct || lease.Recreated {
		t.Errorf("exec after a stop behind berth's back: %q %+v %v, want the lifecycle and the file", out, lease, err)
	}
	if err := d.Remove(ctx, ex.Sandbox); err != nil {
		t.Fatal(err)
	}
	out, lease, err = execIn(t, r, "s:1", "cat f 2>/dev/null || echo none")
	if err != nil || out != "none\n" || !lease.Recreated || !strings.Contains(lease.RecreatedReason, "no longer existed") {
		t.Errorf("exec after a removal behind berth's back: %q %+v %v, want a new sandbox, said so", out, lease, err)
	}
}

// What a sandbox can do to its agent's socket is met at once, with an error that
// names the session and the way out: a planted link (the sandbox took the socket
// over), a server that does not know berth's handshake (an older berth's agent), a
// listener that accepts and never answers (whenever agent_timeout passes, the
// outcome is the same: nothing answers, so that case alone runs with a short one;
// the others get a long one, which an answer that comes ends at once: with 100 ms
// for all, an older agent's answer missed it on a loaded CI machine).
func TestDirectPathBadSockets(t *testing.T) {
	for _, c := range []struct {
		name    string
		plant   func(t *testing.T, sock string)
		kind    error
		says    []string
		timeout time.Duration
	}{
		{"link", func(t *testing.T, sock string) {
			if err := os.Symlink("/run/somewhere-else.sock", sock); err != nil {
				t.Fatal(err)
			}
		}, backend.ErrConflict, []string{"symbolic link", "--recreate", "berth rm s:1"}, testwait.Limit},
		{"old-agent", func(t *testing.T, sock string) {
			lis := listenAt(t, sock)
			t.Cleanup(agenttest.Serve(lis, nil))
		}, backend.ErrUnsupported, []string{"older berth", "berth stop s:1"}, testwait.Limit},
		{"silent", func(t *testing.T, sock string) {
			lis := listenAt(t, sock)
			t.Cleanup(func() { lis.Close() })
			go func() {
				var held []net.Conn
				for {
					c, err := lis.Accept()
					if err != nil {
						for _, c := range held {
							c.Close()
						}
						return
					}
					held = append(held, c)
				}
			}()
		}, backend.ErrTimeout, []string{"did not answer", "agent_timeout"}, 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newDirectEnv(t, fmt.Sprintf("agent_timeout = %q\nscope \"*\" {\n  driver = \"local\"\n}\n", c.timeout))
			r, _ := e.open()
			if _, _, err := execIn(t, r, "s:1", "true"); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			ex, _ := r.Explain("s:1")
			d, err := r.Backend(ctx, local.Name)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Remove(context.Background(), ex.Sandbox) })
			// The agent goes (as if its sandbox were stopped); what takes its socket's
			// place is what a sandbox's root could leave there.
			if err := d.Stop(ctx, ex.Sandbox, 0); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(e.sandboxDir(t, r, "s:1"), "run", backend.AgentSocketName)
			os.Remove(sock)
			c.plant(t, sock)
			_, _, err = execIn(t, r, "s:1", "true")
			if !errors.Is(err, c.kind) {
				t.Fatalf("exec: %v, want %v", err, c.kind)
			}
			for _, w := range append(c.says, `session "s:1"`) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
		})
	}
}

// listenAt listens on the unix socket path, whatever its length (through
// /proc/self/fd of its directory, as the agent does).
func listenAt(t *testing.T, path string) net.Listener {
	t.Helper()
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	lis, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// A session that joins a shared sandbox takes the lifecycle's slow path while
// another session's command runs there on the registry's kept connection to the
// sandbox's agent. The join finds the sandbox running (its agent the same), so the
// running command must go on: the kept connection is dropped only when the sandbox
// has a new agent. (Found by the Python SDK's 50-thread test: a call that started
// on a new session's kept connection got "context canceled" when another thread's
// first call on the session went through the lifecycle.)
func TestJoinKeepsRunningCall(t *testing.T) {
	e := newDirectEnv(t, "scope \"team:*\" {\n  driver = \"local\"\n  isolation = \"shared\"\n  name = \"team\"\n}\n")
	r, _ := e.open()
	if _, lease, err := execIn(t, r, "team:1", "true"); err != nil || !lease.Created {
		t.Fatalf("first exec: %+v %v", lease, err)
	}
	var out bytes.Buffer
	ctx := context.Background()
	p, lease, err := r.Exec(ctx, "team:1", backend.ExecRequest{Argv: []string{"sh", "-c", "echo started; read x; echo got $x"}, Stdin: true, Stdout: &out})
	if err != nil || !lease.Direct {
		t.Fatalf("exec on the kept connection: %+v %v", lease, err)
	}
	// team:2 has no record: its first call runs the lifecycle on the running sandbox.
	if _, lease, err := execIn(t, r, "team:2", "true"); err != nil || lease.Direct || lease.Created {
		t.Fatalf("the second session's first exec: %+v %v, want the lifecycle on the sandbox that runs", lease, err)
	}
	if _, err := p.Write([]byte("more\n")); err != nil {
		t.Errorf("writing to the running command: %v", err)
	}
	p.CloseStdin()
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 || out.String() != "started\ngot more\n" {
		t.Fatalf("the command that ran while another session joined: %+v %v, output %q", res, err, out.String())
	}
	// The kept connection still serves the next call.
	if _, lease, err := execIn(t, r, "team:1", "true"); err != nil || !lease.Direct {
		t.Errorf("the next exec: %+v %v", lease, err)
	}
}

// After Close no call runs anything, even on a session whose agent answers (the
// direct path needs no driver): Exec fails with ErrUnavailable naming the session,
// before any command runs, as Acquire and a new session's Exec do.
func TestClosedRegistryRunsNothing(t *testing.T) {
	e := newDirectEnv(t, "scope \"*\" {\n  driver = \"local\"\n}\n")
	r, _ := e.open()
	ctx := context.Background()
	execIn(t, r, "chat:1", "true")
	if _, lease, err := execIn(t, r, "chat:1", "true"); err != nil || !lease.Direct {
		t.Fatalf("the second exec: %v, %+v; want the direct path", err, lease)
	}
	r.Close()
	mark := filepath.Join(t.TempDir(), "ran")
	for _, session := range []string{"chat:1", "chat:2"} {
		_, _, err := r.Exec(ctx, session, backend.ExecRequest{Argv: []string{"touch", mark}})
		if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), fmt.Sprintf("session %q: the registry is closed", session)) {
			t.Errorf("Exec(%s) after Close: %v; want ErrUnavailable naming the session", session, err)
		}
	}
	if _, err := os.Stat(mark); err == nil {
		t.Error("a command ran after Close")
	}
	if _, err := r.Acquire(ctx, "chat:1"); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("Acquire after Close: %v", err)
	}
}
