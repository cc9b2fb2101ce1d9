package docker_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/conformance"
	"github.com/berth-sh/berth/docker"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
	"github.com/berth-sh/berth/registry"
)

// privateDockerd is a dockerd of one test's own (its own socket, directories and
// managed containerd), so that the test may restart it without touching the shared
// engine other tests use.
type privateDockerd struct {
	t    *testing.T
	bin  string
	dir  string
	host string
	cmd  *exec.Cmd
	log  *os.File
}

// startPrivateDockerd starts a private dockerd, or skips when it cannot (not root,
// no dockerd binary).
func startPrivateDockerd(t *testing.T) *privateDockerd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("recovery/runtime-restart with a private dockerd needs root")
	}
	bin, err := exec.LookPath("dockerd")
	if err != nil {
		t.Skip("recovery/runtime-restart with a private dockerd needs the dockerd binary: " + err.Error())
	}
	// A short path: the socket path must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "brt-")
	if err != nil {
		t.Fatal(err)
	}
	d := &privateDockerd{t: t, bin: bin, dir: dir, host: "unix://" + filepath.Join(dir, "d.sock")}
	if d.log, err = os.Create(filepath.Join(dir, "dockerd.log")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.stop()
		d.log.Close()
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "dockerd.log")); err == nil && len(b) > 0 {
				if len(b) > 8000 {
					b = b[len(b)-8000:]
				}
				t.Logf("private dockerd log (tail):\n%s", b)
			}
		}
		os.RemoveAll(dir)
	})
	if err := d.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d
}

// start starts dockerd and waits (up to a minute) for it to answer.
func (d *privateDockerd) start(ctx context.Context) error {
	d.cmd = exec.Command(d.bin, "-H", d.host,
		"--data-root", filepath.Join(d.dir, "data"), "--exec-root", filepath.Join(d.dir, "exec"),
		"--pidfile", filepath.Join(d.dir, "dockerd.pid"), "--config-file", filepath.Join(d.dir, "daemon.json"),
		"--bridge=none", "--iptables=false", "--ip-masq=false", "--ip-forward=false") // its --ip-forward default turns on IP forwarding for the whole host
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGTERM}
	if err := d.cmd.Start(); err != nil {
		return fmt.Errorf("starting dockerd: %w", err)
	}
	if !testwait.For(ctx, 0, func() bool { return testimage.Ping(d.host) == nil }) {
		return fmt.Errorf("private dockerd at %s did not answer within %v (log %s)", d.host, testwait.Limit, d.log.Name())
	}
	return nil
}

// stop stops dockerd (SIGTERM, SIGKILL after 30 s) and waits for it.
func (d *privateDockerd) stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-done
	}
	d.cmd = nil
}

// restart is conformance.Options.RestartRuntime for the private dockerd.
func (d *privateDockerd) restart(ctx context.Context) error {
	d.stop()
	return d.start(ctx)
}

// TestRecoveryRuntimeRestart runs recovery/runtime-restart against a dockerd of its
// own, which it restarts: the session's container comes back on the next exec, files
// intact.
func TestRecoveryRuntimeRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and restarts a dockerd of its own")
	}
	d := startPrivateDockerd(t)
	drv := docker.New(docker.WithHost(d.host))
	t.Cleanup(func() { drv.Close() })
	importImage(t, drv)
	state := t.TempDir()
	opts := options(state)
	opts.BerthEnv = []string{"DOCKER_HOST=" + d.host}
	if err := drv.Configure(context.Background(), backend.DriverSetup{StateDir: filepath.Join(state, "drivers", "docker"), Owner: opts.Owner}); err != nil {
		t.Fatal(err)
	}
	opts.OpenRegistry = conformance.RegistryOpener(nil, registry.WithBerthBinary(berthBin),
		registry.WithDriver(docker.Name, func() backend.TerminalBackend { return docker.New(docker.WithHost(d.host)) }))
	opts.RestartRuntime = d.restart
	rep := conformance.RunAll(t.Context(), drv, opts, conformance.Filter{Run: regexp.MustCompile(`^recovery/runtime-restart$`)})
	if rep.Passed != 1 || rep.Failed != 0 {
		t.Fatalf("recovery/runtime-restart against a private dockerd: %+v", rep)
	}
	// dockerd stops its containers when it stops (no live-restore), so the case
	// went through "the next exec starts the stopped sandbox".
	if log := strings.Join(rep.Cases[0].Log, "\n"); !strings.Contains(log, "after the runtime restart the sandbox is stopped") {
		t.Errorf("the restart did not stop the sandbox, so the case proved less than it should; log:\n%s", log)
	}
}
