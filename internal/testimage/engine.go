package testimage

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"
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
