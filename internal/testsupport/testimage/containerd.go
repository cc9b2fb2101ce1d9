package testimage

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
)

// ContainerdStartHint is what tests print when no containerd answers.
const ContainerdStartHint = "start Debian's containerd 1.6 and containerd 2.x with: sudo scripts/runtimes.sh, then export the CONTAINERD_ADDRESS and CONTAINERD2_ADDRESS it prints"

// ContainerdEnvs are the variables naming the containerd sockets tests run against:
// Debian's 1.6 and 2.x built from its module, as scripts/runtimes.sh starts them.
var ContainerdEnvs = []string{"CONTAINERD_ADDRESS", "CONTAINERD2_ADDRESS"}

// RequireContainerd returns the socket path in the variable env when something
// accepts connections there (a unix dial within pingTimeout). When the variable is unset or
// nothing answers, it fails the test under CI (CI=true), where a missing runtime is an
// error, and skips it elsewhere, with ContainerdStartHint.
func RequireContainerd(t testing.TB, env string) string {
	t.Helper()
	addr := strings.TrimPrefix(os.Getenv(env), "unix://")
	msg := ""
	if addr == "" {
		msg = env + " is not set"
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", addr)
		if err != nil {
			msg = "no containerd at " + env + "=" + addr + " (" + err.Error() + ")"
		} else {
			c.Close()
			return addr
		}
	}
	msg += "; " + ContainerdStartHint
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
