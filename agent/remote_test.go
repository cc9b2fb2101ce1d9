package agent

import (
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/backend"
)

// --listen-tcp takes a loopback address with a port and a token only.
func TestListenTCP(t *testing.T) {
	tok := []byte("0123456789abcdef0123456789abcdef")
	for _, tc := range []struct {
		addr  string
		token []byte
		want  string
	}{
		{"0.0.0.0:7070", tok, "only a loopback address"},
		{"192.0.2.1:7070", tok, "only a loopback address"},
		{"localhost:7070", tok, "only a loopback address"},
		{"127.0.0.1", tok, "want a loopback address with a port"},
		{"127.0.0.1:0", nil, "needs a token"},
	} {
		l, err := listenTCP(tc.addr, tc.token)
		if err == nil {
			l.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || backend.KindOf(err) != backend.ErrInvalid {
			t.Errorf("listenTCP(%q, token %v) = %v, want ErrInvalid saying %q", tc.addr, tc.token != nil, err, tc.want)
		}
	}
	l, err := listenTCP("127.0.0.1:0", tok)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
}

// net-none, run as PID 1 of a new PID namespace inside a new network namespace
// holding a bridge and a veth pair, leaves only lo, up; run as any other pid (on a
// host, by mistake) it refuses and changes nothing.
func TestNetNone(t *testing.T) {
	if out, err := exec.Command(agentBin, "agent", "net-none").CombinedOutput(); err == nil || !strings.Contains(string(out), "refusing to run as pid") {
		t.Fatalf("net-none as an ordinary process: %v %s, want a refusal", err, out)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	for _, tool := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	script := `set -e
ip link add br0 type bridge
ip link add v0 type veth peer name v1
unshare --pid --fork "$1" agent net-none
cat /proc/net/dev
ip -o link show lo`
	out, err := exec.Command("unshare", "--net", "sh", "-c", script, "sh", agentBin).CombinedOutput()
	if err != nil {
		t.Fatalf("net-none in a network namespace: %v\n%s", err, out)
	}
	var ifaces []string
	for _, line := range strings.Split(string(out), "\n") {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.Contains(line, "|") && !strings.HasPrefix(name, "1") {
			ifaces = append(ifaces, name)
		}
	}
	if len(ifaces) != 1 || ifaces[0] != "lo" {
		t.Errorf("interfaces after net-none: %v, want only lo\n%s", ifaces, out)
	}
	if !strings.Contains(string(out), "LOOPBACK,UP") {
		t.Errorf("lo is not up after net-none:\n%s", out)
	}
}

// --own-dir gives the directory itself (not what it holds) to a non-root exec
// user, and leaves it alone for root, for no user, and for a user the sandbox
// does not know (logged only).
func TestOwnDir(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to chown")
	}
	logger := log.New(io.Discard, "", 0)
	owner := func(p string) (uint32, uint32) {
		t.Helper()
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return st.Uid, st.Gid
	}
	dir := t.TempDir()
	inner := filepath.Join(dir, "f")
	if err := os.WriteFile(inner, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"", "0", "root", "no-such-user-berth"} {
		if err := ownDir(dir, u, logger); err != nil {
			t.Errorf("ownDir(%q): %v", u, err)
		}
		if uid, gid := owner(dir); uid != 0 || gid != 0 {
			t.Errorf("ownDir(%q) gave the directory to %d:%d, want it left to root", u, uid, gid)
		}
	}
	if err := ownDir(dir, "1234:2345", logger); err != nil {
		t.Fatal(err)
	}
	if uid, gid := owner(dir); uid != 1234 || gid != 2345 {
		t.Errorf("ownDir(1234:2345): directory owned by %d:%d", uid, gid)
	}
	if uid, _ := owner(inner); uid != 0 {
		t.Errorf("ownDir changed the owner of a file inside the directory to %d; only the directory is given", uid)
	}
	if err := ownDir(inner, "1234", logger); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("ownDir of a file: %v, want 'not a directory'", err)
	}
}
