package containerutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

func TestCheckMount(t *testing.T) {
	dir := t.TempDir()
	sockDir := filepath.Join(dir, "run")
	os.Mkdir(sockDir, 0o755)
	sock := filepath.Join(sockDir, "rt.sock")
	os.WriteFile(sock, nil, 0o600)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(sockDir, link); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	os.Mkdir(other, 0o755)
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
		{"/", "/host", false, "root directory"},
		{"/", "/host", true, ""},
		{other, "/.berth/x", true, "reserved"},
		{other, "/", true, "reserved"},
		{"relative", "/mnt", false, "absolute"},
		{filepath.Join(dir, "missing"), "/mnt", false, "does not exist"},
	} {
		err := CheckMount(backend.Mount{Source: c.src, Target: c.dst}, c.allow, socks)
		switch {
		case c.words == "" && err != nil:
			t.Errorf("CheckMount(%s -> %s, allow %v): %v, want accepted", c.src, c.dst, c.allow, err)
		case c.words != "" && (err == nil || !strings.Contains(err.Error(), c.words)):
			t.Errorf("CheckMount(%s -> %s, allow %v): %v, want an error saying %q", c.src, c.dst, c.allow, err, c.words)
		}
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

func TestReadOOMCount(t *testing.T) {
	dir := t.TempDir()
	v1 := filepath.Join(dir, "memory.oom_control")
	os.WriteFile(v1, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 0o644)
	v2 := filepath.Join(dir, "memory.events")
	os.WriteFile(v2, []byte("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n"), 0o644)
	none := filepath.Join(dir, "none")
	os.WriteFile(none, []byte("under_oom 0\n"), 0o644)
	for path, want := range map[string]int64{v1: 3, v2: 2, none: -1, "": -1, filepath.Join(dir, "missing"): -1} {
		if got := ReadOOMCount(path); got != want {
			t.Errorf("ReadOOMCount(%q) = %d, want %d", path, got, want)
		}
	}
	if got := OOMCounterPath(os.Getpid()); got != "" && ReadOOMCount(got) < 0 {
		t.Errorf("OOMCounterPath of this process: %q holds no oom_kill counter", got)
	}
}
