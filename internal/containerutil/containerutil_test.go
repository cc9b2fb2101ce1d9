package containerutil

import (
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/backend"
)

func TestResolveUser(t *testing.T) {
	for _, c := range []struct{ in, want string }{{"", ""}, {"1000", "1000"}, {"1000:1001", "1000:1001"}, {"user", "user"}} {
		if got, err := ResolveUser(c.in); err != nil || got != c.want {
			t.Errorf("ResolveUser(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"1:2:3", ":1", "1:", "a b", "x\x00"} {
		if _, err := ResolveUser(bad); err == nil {
			t.Errorf("ResolveUser(%q) accepted", bad)
		}
	}
	t.Setenv("SUDO_UID", "1234")
	t.Setenv("SUDO_GID", "99")
	if got, err := ResolveUser("host"); err != nil || got != "1234:99" {
		t.Errorf("ResolveUser(host) under sudo = %q, %v; want 1234:99", got, err)
	}
	t.Setenv("SUDO_GID", "")
	if got, err := ResolveUser("host"); err != nil || got != "1234:1234" {
		t.Errorf("ResolveUser(host) with SUDO_UID only = %q, %v; want 1234:1234", got, err)
	}
	t.Setenv("SUDO_UID", "nope")
	if _, err := ResolveUser("host"); err == nil || !strings.Contains(err.Error(), "SUDO_UID") {
		t.Errorf("ResolveUser(host) with a bad SUDO_UID: %v", err)
	}
}

// listen makes a real unix socket at path, closed with the test.
func listen(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
}

func TestCheckMount(t *testing.T) {
	dir := t.TempDir()
	sockDir := filepath.Join(dir, "run")
	sock := filepath.Join(sockDir, "rt.sock")
	listen(t, sock)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(sockDir, link); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	os.Mkdir(other, 0o755)
	// A socket no list names (another daemon's, a ttrpc socket): refused as a socket.
	stray := filepath.Join(dir, "elsewhere", "daemon2.sock")
	listen(t, stray)
	strayLink := filepath.Join(dir, "stray-link")
	if err := os.Symlink(stray, strayLink); err != nil {
		t.Fatal(err)
	}
	socks := []Socket{{Path: sock, What: "runtime socket"}}
	for _, c := range []struct {
		src, dst string
		allow    bool
		words    string // "" for accepted
	}{
		{other, "/mnt", false, ""},
		{sockDir, "/mnt", false, "runtime socket"},
		{sock, "/mnt", false, "runtime socket"},
		{link, "/mnt", false, "runtime socket"}, // through a link
		{dir, "/mnt", false, "runtime socket"},  // a directory holding it
		{dir, "/mnt", true, ""},
		{stray, "/run/x.sock", false, "mount source " + stray + " is a unix socket"},
		{stray, "/run/x.sock", false, "allow_host_paths = true"},
		{strayLink, "/run/x.sock", false, "mount source " + strayLink + " is a unix socket"},
		{stray, "/run/x.sock", true, ""},
		{filepath.Dir(stray), "/mnt", false, ""}, // directories are not scanned for sockets
		{"/", "/host", false, "root directory"},
		{"/", "/host", true, ""},
		{other, "/.berth/x", true, "reserved"},
		{other, "/", true, "reserved"},
		{"relative", "/mnt", false, "absolute"},
		{filepath.Join(dir, "missing"), "/mnt", false, "does not exist"},
	} {
		err := CheckMount(backend.Mount{Source: c.src, Target: c.dst}, c.allow, socks, nil)
		switch {
		case c.words == "" && err != nil:
			t.Errorf("CheckMount(%s -> %s, allow %v): %v, want accepted", c.src, c.dst, c.allow, err)
		case c.words != "" && (err == nil || !strings.Contains(err.Error(), c.words)):
			t.Errorf("CheckMount(%s -> %s, allow %v): %v, want an error saying %q", c.src, c.dst, c.allow, err, c.words)
		}
	}
}

// RuntimeSockets names the sockets of $DOCKER_HOST and $CONTAINERD_ADDRESS, the ttrpc
// sibling of a containerd socket and the well-known places, so that CheckMount
// refuses the directories that hold them.
func TestRuntimeSockets(t *testing.T) {
	dir := t.TempDir()
	dockerDir := filepath.Join(dir, "docker")
	ctrDir := filepath.Join(dir, "ctr")
	ttrpcDir := filepath.Join(dir, "ttrpc")
	listen(t, filepath.Join(dockerDir, "dockerd.sock"))
	listen(t, filepath.Join(ctrDir, "containerd.sock"))
	listen(t, filepath.Join(ttrpcDir, "inuse.sock.ttrpc"))
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(dockerDir, "dockerd.sock"))
	t.Setenv("CONTAINERD_ADDRESS", filepath.Join(ctrDir, "containerd.sock"))
	socks := RuntimeSockets(Socket{Path: filepath.Join(ttrpcDir, "inuse.sock"), What: "containerd socket"})
	has := map[string]bool{}
	for _, s := range socks {
		has[s.Path] = true
	}
	for _, p := range []string{"/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock", "/run/containerd/containerd.sock.ttrpc", filepath.Join(ctrDir, "containerd.sock.ttrpc")} {
		if !has[p] {
			t.Errorf("RuntimeSockets() lacks %s: %v", p, socks)
		}
	}
	for _, c := range []struct{ src, words string }{
		{dockerDir, "Docker socket " + filepath.Join(dockerDir, "dockerd.sock")},
		{ctrDir, "containerd socket " + filepath.Join(ctrDir, "containerd.sock")},
		{filepath.Join(ttrpcDir, "inuse.sock.ttrpc"), "containerd socket (ttrpc) " + filepath.Join(ttrpcDir, "inuse.sock.ttrpc")},
	} {
		err := CheckMount(backend.Mount{Source: c.src, Target: "/mnt"}, false, socks, nil)
		if err == nil || !strings.Contains(err.Error(), c.words) || !strings.Contains(err.Error(), "mount source "+c.src) {
			t.Errorf("CheckMount(%s): %v, want an error naming it and %q", c.src, err, c.words)
		}
		if err := CheckMount(backend.Mount{Source: c.src, Target: "/mnt"}, true, socks, nil); err != nil {
			t.Errorf("CheckMount(%s) with allow_host_paths: %v", c.src, err)
		}
	}
	t.Setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
	t.Setenv("CONTAINERD_ADDRESS", "")
	if err := CheckMount(backend.Mount{Source: dockerDir, Target: "/mnt"}, false, RuntimeSockets(), nil); err != nil {
		t.Errorf("CheckMount(%s) without DOCKER_HOST naming it: %v", dockerDir, err)
	}
}

func TestCheckAgent(t *testing.T) {
	good := backend.AgentFiles{Binary: "/s/agent/" + backend.AgentBinaryName, Dir: "/s/agent", SocketDir: "/s/run", Static: true}
	if err := CheckAgent("x", "sb", good); err != nil {
		t.Errorf("good agent files: %v", err)
	}
	for _, bad := range []backend.AgentFiles{
		{},
		{Binary: "/s/agent/other", Dir: "/s/agent", SocketDir: "/s/run", Static: true},
		{Binary: "/t/" + backend.AgentBinaryName, Dir: "/s/agent", SocketDir: "/s/run", Static: true},
		{Binary: good.Binary, Dir: good.Dir, SocketDir: good.SocketDir},
	} {
		if err := CheckAgent("x", "sb", bad); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("CheckAgent(%+v): %v, want ErrInvalid", bad, err)
		}
	}
}

// A spec's env may not set the variable that carries the agent's token; the agent's
// environment is the spec's plus that variable, read from the sandbox's token file.
func TestAgentEnv(t *testing.T) {
	for _, env := range [][]string{{"NOEQUALS"}, {"=x"}, {agent.TokenEnv + "=x"}} {
		if err := CheckEnv("docker sandbox b-1", env); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "b-1") {
			t.Errorf("CheckEnv(%q): %v, want ErrInvalid naming the sandbox", env, err)
		}
	}
	if err := CheckEnv("x", []string{"A=1", "B="}); err != nil {
		t.Errorf("CheckEnv of good entries: %v", err)
	}
	if env, err := AgentEnv([]string{"A=1"}, backend.AgentFiles{}); err != nil || len(env) != 1 {
		t.Errorf("AgentEnv without agent files: %q %v", env, err)
	}
	sb := t.TempDir()
	bin, err := agent.Install(t.TempDir(), "/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	files, err := agent.PrepareSandbox(sb, bin)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := agent.ReadToken(files.Dir)
	if err != nil {
		t.Fatal(err)
	}
	env, err := AgentEnv([]string{"A=1"}, files)
	if want := agent.TokenEnv + "=" + hex.EncodeToString(tok); err != nil || len(env) != 2 || env[0] != "A=1" || env[1] != want {
		t.Errorf("AgentEnv: %q %v, want [A=1 %s]", env, err, want)
	}
	if _, err := AgentEnv(nil, backend.AgentFiles{Dir: filepath.Join(t.TempDir(), "agent")}); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("AgentEnv without a token: %v, want ErrUnavailable", err)
	}
}
