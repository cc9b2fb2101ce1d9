package registry

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends"
)

// buildTestPlugin builds package backends' test plugin, which serves a small
// os/exec driver whatever its arguments, so it can stand in for
// `berth driver serve local`.
func buildTestPlugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "testplugin")
	cmd := exec.Command("go", "build", "-o", bin, "../backends/testdata/testplugin")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the test plugin: %v\n%s", err, out)
	}
	return bin
}

// TestDefaultWiring runs the registry with its default Launch (go-plugin, package
// backends) and PrepareAgent (package agent).
func TestDefaultWiring(t *testing.T) {
	plugin := buildTestPlugin(t)
	e := newEnv(t, "driver \"local\" {\n  root = \"/unused\"\n}\n")
	cfg, err := e.load()
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(context.Background(), cfg, WithStateDir(e.stateDir), WithBerthBinary(plugin))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()

	var out bytes.Buffer
	p, lease, err := r.Exec(ctx, "main", backend.ExecRequest{Argv: []string{"echo", "through the plugin"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.Wait(); err != nil || res.ExitCode != 0 || out.String() != "through the plugin\n" {
		t.Fatalf("exec: %+v %v %q", res, err, out.String())
	}
	// The agent binary was installed under its hash and hard-linked into the sandbox dir.
	link := filepath.Join(e.stateDir, "sandboxes", "local", lease.Sandbox, "agent", backend.AgentBinaryName)
	var st syscall.Stat_t
	if err := syscall.Stat(link, &st); err != nil || st.Nlink < 2 {
		t.Errorf("agent link %s: %v (links %d)", link, err, st.Nlink)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.stateDir, "agent", "bin")); len(ents) != 1 {
		t.Errorf("installed agent binaries: %v", ents)
	}

	ds, err := r.Drivers(ctx)
	if err != nil || len(ds) != 1 || ds[0].Err != nil || ds[0].Info.Name != "test" || ds[0].Info.Protocol != backends.ProtocolVersion {
		t.Fatalf("Drivers: %+v %v", ds, err)
	}
	b, _ := r.Backend(ctx, "local")
	c := b.(*backends.Client)
	pid := c.Pid()
	// A plugin that has gone is started again on the next call.
	c.Kill()
	b2, err := r.Backend(ctx, "local")
	if err != nil || b2 == b || b2.(*backends.Client).Pid() == pid {
		t.Fatalf("relaunch: %v", err)
	}
	// Close kills the plugin (Kill blocks until the process is gone).
	pid = b2.(*backends.Client).Pid()
	r.Close()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("plugin %d still there after Close: %v", pid, err)
	}
}

func TestDefaultWiringConfigErrors(t *testing.T) {
	plugin := buildTestPlugin(t)
	for src, want := range map[string]string{
		"driver \"local\" {\n}\n":                           `:1:16: error: Missing required driver setting: driver "local" needs "root" (string: where sandboxes live)`,
		"driver \"local\" {\n  root = \"bad\"\n}\n":         ":1:1: configuring driver local", // at the block
		"driver \"local\" {\n  root = \"/x\"\n  y = 1\n}\n": ":3:3: error: Unsupported argument",
	} {
		e := newEnv(t, src)
		cfg, err := e.load()
		if err != nil {
			t.Fatal(err)
		}
		r, err := Open(context.Background(), cfg, WithStateDir(e.stateDir), WithBerthBinary(plugin))
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Acquire(context.Background(), "main")
		if err == nil || !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: %v, want ErrInvalid containing %q", src, err, want)
		}
		r.Close()
	}
	// A third-party driver that is known but has no executable in the search
	// path is not found, and the error names the search path and the fixes.
	e := newEnv(t, "")
	cfg, err := e.load("local", "thirdparty")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("BERTH_PLUGIN_PATH", "")
	r, _ := Open(context.Background(), cfg, WithStateDir(e.stateDir), WithBerthBinary(plugin))
	defer r.Close()
	_, err = r.Backend(context.Background(), "thirdparty")
	if !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), "berth-driver-thirdparty") ||
		!strings.Contains(err.Error(), filepath.Dir(plugin)) || !strings.Contains(err.Error(), "plugin_dirs") {
		t.Errorf("third-party driver: %v", err)
	}
}

// A plugin that crashes during Create under a supervising registry: it is
// restarted, the Create is made again on the new plugin (it is idempotent) and the
// call succeeds, counted in OnRestart. Without supervision the call fails with a
// *DriverCrashedError that says it was not retried, and nothing is recorded.
func TestSupervisedCreateCrash(t *testing.T) {
	plugin := buildTestPlugin(t)
	for _, supervised := range []bool{true, false} {
		t.Run(map[bool]string{true: "supervised", false: "unsupervised"}[supervised], func(t *testing.T) {
			t.Setenv("BERTH_TESTPLUGIN_CRASH_CREATE", filepath.Join(t.TempDir(), "crashed"))
			e := newEnv(t, "driver \"local\" {\n  root = \"/unused\"\n}\n")
			cfg, err := e.load()
			if err != nil {
				t.Fatal(err)
			}
			restarts := make(chan error, 10)
			opts := []Option{WithStateDir(e.stateDir), WithBerthBinary(plugin)}
			if supervised {
				opts = append(opts, WithSupervision(SupervisePolicy{OnRestart: func(driver string, err error) { restarts <- err }}))
			}
			r, err := Open(context.Background(), cfg, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			lease, err := r.Acquire(context.Background(), "main")
			var dc *DriverCrashedError
			if !supervised {
				if !errors.As(err, &dc) || dc.Retried || !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "not retried") {
					t.Fatalf("unsupervised Acquire across the crash: %v", err)
				}
				if list, err := r.Sessions(context.Background()); err != nil || len(list) != 0 {
					t.Errorf("sessions after the failed create: %+v %v", list, err)
				}
				return
			}
			if err != nil || !lease.Created {
				t.Fatalf("supervised Acquire across the crash: %+v %v", lease, err)
			}
			if err := <-restarts; err != nil {
				t.Errorf("restart: %v", err)
			}
			if list, err := r.Sessions(context.Background()); err != nil || len(list) != 1 || list[0].State != "running" {
				t.Errorf("sessions after the retried create: %+v %v", list, err)
			}
		})
	}
}

// A supervised plugin killed from outside is restarted without any call; crashes
// in a row count up the backoff, unless the plugin ran for HealthyAfter first, which
// starts the series again.
func TestSupervisedRestartSeries(t *testing.T) {
	plugin := buildTestPlugin(t)
	for _, c := range []struct {
		healthy time.Duration
		want    int // restarts in a row counted after two crashes
	}{{time.Hour, 2}, {time.Nanosecond, 1}} {
		t.Run(c.healthy.String(), func(t *testing.T) {
			e := newEnv(t, "driver \"local\" {\n  root = \"/unused\"\n}\n")
			cfg, err := e.load()
			if err != nil {
				t.Fatal(err)
			}
			restarts := make(chan error, 10)
			r, err := Open(context.Background(), cfg, WithStateDir(e.stateDir), WithBerthBinary(plugin),
				WithSupervision(SupervisePolicy{Initial: time.Millisecond, HealthyAfter: c.healthy, OnRestart: func(_ string, err error) { restarts <- err }}))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			for i := 0; i < 2; i++ {
				b, err := r.Backend(context.Background(), "local")
				if err != nil {
					t.Fatal(err)
				}
				syscall.Kill(b.(*backends.Client).Pid(), syscall.SIGKILL)
				if err := <-restarts; err != nil {
					t.Fatalf("restart %d: %v", i+1, err)
				}
			}
			r.drvMu.Lock()
			de := r.drivers["local"]
			r.drvMu.Unlock()
			de.mu.Lock()
			got := de.attempt
			de.mu.Unlock()
			if got != c.want {
				t.Errorf("restarts in a row after two crashes: %d, want %d", got, c.want)
			}
			if b, err := r.Backend(context.Background(), "local"); err != nil || b.(*backends.Client).Exited() {
				t.Errorf("the driver after the restarts: %v", err)
			}
		})
	}
}
