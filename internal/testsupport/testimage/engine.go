package testimage

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
)

// StartHint is what tests print when no Docker Engine answers.
const StartHint = "start one with: sudo scripts/runtimes.sh, then export the DOCKER_HOST it prints"

// DockerHost returns the engine address tests use: DOCKER_HOST, else the standard
// socket unix:///var/run/docker.sock.
func DockerHost() string {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return h
	}
	return "unix:///var/run/docker.sock"
}

// RequireEngine returns DockerHost() when a Docker Engine answers there (a GET /_ping
// on its unix socket within pingTimeout). When none does, it fails the test under CI (CI=true),
// where a missing runtime is an error, and skips it elsewhere, with StartHint.
func RequireEngine(t testing.TB) string {
	t.Helper()
	host := DockerHost()
	if err := Ping(host); err != nil {
		msg := "no Docker Engine at " + host + " (" + err.Error() + "); " + StartHint
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return host
}

// pingTimeout bounds the check that a runtime answers: long enough for a busy
// daemon on a loaded machine (it was 5 s); a runtime that is not there fails at
// once, as its socket refuses the connection.
const pingTimeout = 30 * time.Second

// Ping reports whether a Docker Engine answers GET /_ping on the unix socket of host.
func Ping(host string) error {
	sock, ok := strings.CutPrefix(host, "unix://")
	if !ok {
		return &net.AddrError{Err: "not a unix:// address", Addr: host}
	}
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(pingTimeout))
	if _, err := c.Write([]byte("GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if !strings.Contains(string(buf[:n]), " 200 ") {
		return &net.AddrError{Err: "unexpected answer to /_ping: " + strings.SplitN(string(buf[:n]), "\r\n", 2)[0], Addr: host}
	}
	return nil
}

// SilentSocket listens on a unix socket in a temp dir of t that accepts connections
// and never answers (a hung engine or daemon) until the test ends, and returns its
// path.
func SilentSocket(t testing.TB) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "silent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return sock
}

// CheckInfoHealth checks the runtime check of a container driver's Info (driver name,
// made by newDriver for a runtime at a socket path): before Configure, Info only
// describes the driver; once configured, it reports a runtime that is not there (a
// missing socket) and one that does not answer (SilentSocket) as
// backend.ErrUnavailable naming the socket, the latter within timeout and a margin.
func CheckInfoHealth(t *testing.T, name string, timeout time.Duration, newDriver func(sock string) backend.TerminalBackend) {
	t.Helper()
	for what, sock := range map[string]string{"missing": filepath.Join(t.TempDir(), "nothing.sock"), "hung": SilentSocket(t)} {
		d := newDriver(sock)
		if info, err := d.Info(context.Background()); err != nil || info.Name != name {
			t.Errorf("%s: Info before Configure: %+v, %v; want the description", what, info, err)
		}
		if err := d.(backend.Configurer).Configure(context.Background(), backend.DriverSetup{Owner: "o", StateDir: t.TempDir()}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := d.Info(context.Background())
		if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), sock) {
			t.Errorf("%s: Info of a configured driver: %v, want ErrUnavailable naming %s", what, err, sock)
		}
		if took := time.Since(start); took > timeout+5*time.Second {
			t.Errorf("%s: Info took %s, want it bounded by %s", what, took, timeout)
		}
		if c, ok := d.(interface{ Close() error }); ok {
			c.Close()
		}
	}
}
