package docker

import (
	"os"
	"strings"
	"testing"
)

// engineContainerd finds the containerd socket of the engine in use through the
// engine process's command line.
func TestEngineContainerd(t *testing.T) {
	sock, ok := strings.CutPrefix(os.Getenv("DOCKER_HOST"), "unix://")
	if !ok {
		t.Skip("DOCKER_HOST names no unix socket")
	}
	if _, err := os.Stat(sock); err != nil {
		t.Skipf("no engine: %v", err)
	}
	got := engineContainerd(sock)
	if len(got) == 0 {
		t.Fatalf("engineContainerd(%s) found nothing", sock)
	}
	fi, err := os.Stat(got[0])
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("engineContainerd(%s) = %v: not a socket (%v)", sock, got, err)
	}
	t.Logf("engine %s runs on containerd %v", sock, got)
}
