package agent

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hdr is one crafted tar entry: a header and, for regular files, a body.
type hdr struct {
	tar.Header
	body string
}

func file(name, body string, mode int64) hdr {
	return hdr{tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(body))}, body}
}

func dir(name string, mode int64) hdr {
	return hdr{tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: mode}, ""}
}

func symlink(name, target string) hdr {
	return hdr{tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}, ""}
}

func hardlink(name, target string) hdr {
	return hdr{tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, Mode: 0o644}, ""}
}

func crafted(t testing.TB, entries ...hdr) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// listing is every path under dir with its type, for comparing trees.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, rel+" "+d.Type().String())
		return nil
	})
	sort.Strings(out)
	return out
}

// A download refuses every entry that is not a regular file, a directory or a symlink
// that stays inside the copy, naming the entry and why; it leaves the destination as
// it was (no staging dir, no half copy), and a host secret is never linked in.
func TestExtractTarRefusesHostileEntries(t *testing.T) {
	home := t.TempDir()
	secret := filepath.Join(home, ".ssh", "id_rsa")
	os.MkdirAll(filepath.Dir(secret), 0o700)
	os.WriteFile(secret, []byte("PRIVATE KEY"), 0o600)
	fifo := hdr{tar.Header{Name: "out/p", Typeflag: tar.TypeFifo, Mode: 0o644}, ""}
	dev := hdr{tar.Header{Name: "out/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, ""}
	blk := hdr{tar.Header{Name: "out/sda", Typeflag: tar.TypeBlock, Mode: 0o660, Devmajor: 8}, ""}
	for _, c := range []struct {
		name    string
		entries []hdr
		words   string
	}{
		{"hard link to a host file", []hdr{dir("out", 0o755), file("out/a", "x", 0o644), hardlink("out/stolen", "../.ssh/id_rsa")}, "out/stolen: refused: a hard link to ../.ssh/id_rsa"},
		{"hard link by an absolute name", []hdr{dir("out", 0o755), hardlink("out/stolen", secret)}, "out/stolen: refused: a hard link"},
		{"hard link inside the copy", []hdr{dir("out", 0o755), file("out/a", "x", 0o644), hardlink("out/b", "out/a")}, "out/b: refused: a hard link to out/a"},
		{"FIFO", []hdr{dir("out", 0o755), fifo}, "out/p: refused: a FIFO"},
		{"character device", []hdr{dir("out", 0o755), dev}, "out/null: refused: a device"},
		{"block device", []hdr{dir("out", 0o755), blk}, "out/sda: refused: a device"},
		{"absolute symlink", []hdr{dir("out", 0o755), symlink("out/key", secret)}, "out/key: refused: a symlink to " + secret + ": its target is absolute"},
		{"symlink out of the copy", []hdr{dir("out", 0o755), symlink("out/key", "../.ssh/id_rsa")}, "out/key: refused: a symlink to ../.ssh/id_rsa: its target leads out"},
		{"symlink out from deeper", []hdr{dir("out/a", 0o755), symlink("out/a/key", "../../.ssh")}, "leads out of the copied tree"},
		{"dot-dot after a name", []hdr{dir("out", 0o755), symlink("out/up", "."), symlink("out/key", "up/../../x")}, "has \"..\" after a name"},
		{"a lone symlink", []hdr{symlink("out", "x")}, "out: refused: a symlink to x: it is copied by itself"},
		{"entry through a symlink", []hdr{dir("out/d", 0o755), symlink("out/l", "d"), file("out/l/f", "x", 0o644)}, "out/l/f: refused: it lies under the symlink out/l"},
		{"entry outside the path asked for", []hdr{dir("out", 0o755), file(".bashrc", "evil", 0o644)}, ".bashrc: refused: not inside out"},
		{"name leaving the destination", []hdr{dir("out", 0o755), file("out/../../x", "evil", 0o644)}, "name leaves the destination"},
		{"a name that drives the terminal", []hdr{dir("out", 0o755), hardlink("out/\x1b[2Jx", "y")}, `"out/\x1b[2Jx": refused: a hard link`},
		{"global header", []hdr{dir("out", 0o755), {tar.Header{Name: "g", Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"comment": "x"}}, ""}}, "refused: an entry of tar type"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := t.TempDir()
			os.WriteFile(filepath.Join(dst, "keep"), []byte("mine"), 0o644)
			before := listing(t, dst)
			err := ExtractTar(bytes.NewReader(crafted(t, c.entries...)), dst, ExtractOptions{Top: "out"})
			var xe *ExtractError
			if !errors.As(err, &xe) || !strings.Contains(err.Error(), c.words) || !strings.Contains(err.Error(), "nothing was written to "+dst) {
				t.Errorf("ExtractTar: %v\nwant an error saying %q and that nothing was written", err, c.words)
			}
			if after := listing(t, dst); strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Errorf("the destination changed:\nbefore %v\nafter  %v", before, after)
			}
			if b, _ := os.ReadFile(secret); string(b) != "PRIVATE KEY" {
				t.Errorf("the secret changed: %q", b)
			}
		})
	}
}

// The symlinks a download keeps: relative ones that stay inside the copied tree.
func TestExtractTarKeepsLinksInside(t *testing.T) {
	dst := t.TempDir()
	err := ExtractTar(bytes.NewReader(crafted(t,
		dir("out", 0o755), dir("out/a/b", 0o755), file("out/f", "x", 0o644),
		symlink("out/self", "."), symlink("out/f2", "f"), symlink("out/a/b/up", "../../f"), symlink("out/a/sub", "./b/"),
	)), dst, ExtractOptions{Top: "out", Name: "copy"})
	if err != nil {
		t.Fatal(err)
	}
	for link, want := range map[string]string{"copy/self": ".", "copy/f2": "f", "copy/a/b/up": "../../f", "copy/a/sub": "./b/"} {
		if got, err := os.Readlink(filepath.Join(dst, link)); err != nil || got != want {
			t.Errorf("%s: %q %v, want a link to %q", link, got, err, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dst, "copy", "a", "b", "up")); err != nil || string(b) != "x" {
		t.Errorf("through copy/a/b/up: %q %v", b, err)
	}
}

// A stream that breaks off (the agent's connection drops, the copy fails after
// some entries) leaves the destination as it was, even where the entries so far were
// good; so does an error that closes the stream after a complete tar.
func TestExtractTarBrokenStream(t *testing.T) {
	good := crafted(t, dir("out", 0o755), file("out/a", strings.Repeat("a", 5000), 0o644), file("out/b", "b", 0o644))
	failure := errors.New("agent unreachable: connection reset")
	for name, r := range map[string]io.Reader{
		"cut in a file":    io.MultiReader(bytes.NewReader(good[:1500]), iotestErr(failure)),
		"cut between":      io.MultiReader(bytes.NewReader(good[:512*2+5120]), iotestErr(failure)),
		"error after tar":  io.MultiReader(bytes.NewReader(good), iotestErr(failure)),
		"truncated header": bytes.NewReader(good[:100]),
	} {
		t.Run(name, func(t *testing.T) {
			dst := t.TempDir()
			err := ExtractTar(r, dst, ExtractOptions{Top: "out"})
			if err == nil || !strings.Contains(err.Error(), "nothing was written to "+dst) {
				t.Errorf("ExtractTar: %v, want an error saying nothing was written", err)
			}
			if ents, _ := os.ReadDir(dst); len(ents) != 0 {
				t.Errorf("the destination holds %v", ents)
			}
		})
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func iotestErr(err error) io.Reader { return errReader{err} }

// A good copy merges into an existing directory, replaces a link in its way (never
// writing through it), and keeps modes and mtimes; a read-only directory does not
// stop its entries.
func TestExtractTarPlacesCopy(t *testing.T) {
	dst := t.TempDir()
	outside := t.TempDir()
	os.MkdirAll(filepath.Join(dst, "out", "old"), 0o755)
	os.WriteFile(filepath.Join(dst, "out", "old", "mine"), []byte("mine"), 0o644)
	os.Symlink(outside, filepath.Join(dst, "out", "ro"))
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	d := dir("out/ro", 0o555)
	d.ModTime = mtime
	f := file("out/ro/f", "x", 0o640)
	f.ModTime = mtime
	if err := ExtractTar(bytes.NewReader(crafted(t, dir("out", 0o750), d, f)), dst, ExtractOptions{Top: "out"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "out", "old", "mine")); err != nil || string(b) != "mine" {
		t.Errorf("existing file in the merged dir: %q %v", b, err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("wrote through the link: %v", ents)
	}
	for p, want := range map[string]fs.FileMode{"out": fs.ModeDir | 0o750, "out/ro": fs.ModeDir | 0o555, "out/ro/f": 0o640} {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: %v %v, want mode %v", p, fi.Mode(), err, want)
		}
		if p != "out" && !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: mtime %v, want %v", p, fi.ModTime(), mtime)
		}
	}
	if ents, _ := os.ReadDir(dst); len(ents) != 1 {
		t.Errorf("the destination holds %v, want only out (no staging dir left)", ents)
	}
	// The first entry names the tree when the path asked for does not ("."), and
	// must then be one name.
	if err := ExtractTar(bytes.NewReader(crafted(t, dir("work", 0o755), file("work/f", "x", 0o644))), dst, ExtractOptions{}); err != nil {
		t.Errorf("Top from the first entry: %v", err)
	}
	if err := ExtractTar(bytes.NewReader(crafted(t, dir("work/x", 0o755))), dst, ExtractOptions{}); err == nil || !strings.Contains(err.Error(), "one file or directory") {
		t.Errorf("a first entry of two names: %v", err)
	}
}

// Downloaded files belong to the user who runs the extraction, without setuid and
// setgid; the sticky bit stays. Archive keeps the stream's owners and every bit.
func TestExtractTarOwnersAndModes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the stream names other users' files")
	}
	entries := func() []hdr {
		s := file("out/suid", "x", 0o4755)
		s.Uid, s.Gid = 1234, 5678
		g := dir("out/sgid", 0o2775)
		g.Uid, g.Gid = 1234, 5678
		k := dir("out/tmp", 0o1777)
		l := symlink("out/link", "suid")
		l.Uid, l.Gid = 1234, 5678
		return []hdr{dir("out", 0o755), s, g, k, l}
	}
	for _, c := range []struct {
		archive  bool
		uid, gid uint32
		modes    map[string]fs.FileMode
	}{
		{false, 0, 0, map[string]fs.FileMode{"suid": 0o755, "sgid": fs.ModeDir | 0o775, "tmp": fs.ModeDir | fs.ModeSticky | 0o777}},
		{true, 1234, 5678, map[string]fs.FileMode{"suid": fs.ModeSetuid | 0o755, "sgid": fs.ModeDir | fs.ModeSetgid | 0o775, "tmp": fs.ModeDir | fs.ModeSticky | 0o777}},
	} {
		dst := t.TempDir()
		if err := ExtractTar(bytes.NewReader(crafted(t, entries()...)), dst, ExtractOptions{Top: "out", Archive: c.archive}); err != nil {
			t.Fatal(err)
		}
		for p, want := range c.modes {
			if fi, err := os.Lstat(filepath.Join(dst, "out", p)); err != nil || fi.Mode() != want {
				t.Errorf("archive %v: %s: mode %v %v, want %v", c.archive, p, fi.Mode(), err, want)
			}
		}
		for _, p := range []string{"suid", "sgid", "link"} {
			fi, err := os.Lstat(filepath.Join(dst, "out", p))
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != c.uid || st.Gid != c.gid {
				t.Errorf("archive %v: %s belongs to %d:%d, want %d:%d", c.archive, p, st.Uid, st.Gid, c.uid, c.gid)
			}
		}
	}
}

// An upload (the agent's extraction) keeps setuid, setgid and sticky bits, and hard
// links between files of the same stream; a hard link to a file the stream did not
// create is refused.
func TestExtractAllUpload(t *testing.T) {
	dst := t.TempDir()
	os.WriteFile(filepath.Join(dst, "preexisting"), []byte("x"), 0o644)
	root, err := os.OpenRoot(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	err = extractAll(root, bytes.NewReader(crafted(t, dir("t", 0o755), file("t/suid", "x", 0o4755), file("t/sgid", "x", 0o2755),
		dir("t/tmp", 0o1777), dir("t/shared", 0o2775), hardlink("t/suid2", "t/suid"))))
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{"suid": fs.ModeSetuid | 0o755, "sgid": fs.ModeSetgid | 0o755, "tmp": fs.ModeDir | fs.ModeSticky | 0o777, "shared": fs.ModeDir | fs.ModeSetgid | 0o775} {
		if fi, err := os.Lstat(filepath.Join(dst, "t", p)); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v %v, want %v", p, fi.Mode(), err, want)
		}
	}
	a, _ := os.Stat(filepath.Join(dst, "t", "suid"))
	b, _ := os.Stat(filepath.Join(dst, "t", "suid2"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Errorf("t/suid2 is not a hard link to t/suid")
	}
	err = extractAll(root, bytes.NewReader(crafted(t, hardlink("stolen", "preexisting"))))
	if err == nil || !strings.Contains(err.Error(), "not a regular file that this copy created") {
		t.Errorf("a hard link to a file the stream did not create: %v", err)
	}
}

// WriteTar stamps entries with their mtime cut to whole seconds, never rounded up: a
// copy is never newer than its source (archive/tar's default format rounds to the
// nearest second, which put a file written at .6 s one second ahead, in the future).
func TestWriteTarCutsMtime(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f")
	if err := os.WriteFile(src, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2026, 1, 1, 10, 0, 0, 700_000_000, time.UTC)
	if err := os.Chtimes(src, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTar(&buf, src, "f"); err != nil {
		t.Fatal(err)
	}
	hdr, err := tar.NewReader(&buf).Next()
	if err != nil {
		t.Fatal(err)
	}
	if want := mtime.Truncate(time.Second); !hdr.ModTime.Equal(want) {
		t.Errorf("mtime in the stream %v, want %v (cut to the second)", hdr.ModTime.UTC(), want)
	}
}

// A copy's file or link never replaces a directory of its name, uploading or
// downloading: the copy fails, naming it, and the tree stays (as cp(1)'s "cannot
// overwrite directory with non-directory"). `berth cp f :data`, data an existing
// tree, used to delete the tree.
func TestCopyNeverReplacesDirWithFile(t *testing.T) {
	tree := func(t *testing.T) string {
		dst := t.TempDir()
		os.MkdirAll(filepath.Join(dst, "data", "sub"), 0o755)
		os.WriteFile(filepath.Join(dst, "data", "sub", "b.txt"), []byte("kept"), 0o644)
		return dst
	}
	check := func(t *testing.T, dst string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "is a directory") {
			t.Errorf("a file over the directory data: %v, want the copy refused, naming the directory", err)
		}
		if b, rerr := os.ReadFile(filepath.Join(dst, "data", "sub", "b.txt")); rerr != nil || string(b) != "kept" {
			t.Errorf("the tree under data after the refused copy: %q %v", b, rerr)
		}
	}
	for _, entry := range []hdr{file("data", "new", 0o644), symlink("data", "elsewhere")} {
		t.Run("upload "+entry.Name, func(t *testing.T) {
			dst := tree(t)
			root, err := os.OpenRoot(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			check(t, dst, extractAll(root, bytes.NewReader(crafted(t, entry))))
		})
	}
	t.Run("download", func(t *testing.T) {
		dst := tree(t)
		check(t, dst, ExtractTar(bytes.NewReader(crafted(t, file("data", "new", 0o644))), dst, ExtractOptions{Top: "data"}))
	})
}

// A failed upload is undone: what it created goes (a symlink that a later entry
// wrote through included), what it replaced comes back, what was there stays as it
// was; a successful one keeps no backup of what it replaced.
func TestExtractAllUndoesFailedUpload(t *testing.T) {
	dst := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dst, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("keep", "old")
	if err := os.Mkdir(filepath.Join(dst, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("d/x", "old x")
	if err := os.Symlink("keep", filepath.Join(dst, "ln")); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	before := listing(t, dst)
	for _, c := range []struct {
		name    string
		entries []hdr
		msg     string
	}{
		{"write through a link out", []hdr{
			file("new", "n", 0o644), dir("nd", 0o755), file("nd/deep/f", "f", 0o644), file("keep", "new", 0o600),
			symlink("ln", "new"), file("d/x", "new x", 0o644), dir("d", 0o700), file("d/y", "y", 0o644),
			symlink("esc", "/etc"), file("esc/passwd", "x", 0o644),
		}, "esc/passwd"},
		{"a file named .", []hdr{file("a", "a", 0o644), file(".", "x", 0o644)}, dotNotDir},
		{"a link named .", []hdr{symlink("l", "keep"), symlink("./", "keep")}, dotNotDir},
		{"a file over a directory", []hdr{file("b", "b", 0o644), file("d", "x", 0o644)}, "d is a directory"},
	} {
		err := extractAll(root, bytes.NewReader(crafted(t, c.entries...)))
		if err == nil || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), "nothing of the upload was kept") {
			t.Errorf("%s: %v, want an error naming %q that says nothing was kept", c.name, err, c.msg)
		}
		if got := listing(t, dst); strings.Join(got, "\n") != strings.Join(before, "\n") {
			t.Errorf("%s: the failed upload left\n%s\nwant\n%s", c.name, strings.Join(got, "\n"), strings.Join(before, "\n"))
		}
		for name, want := range map[string]string{"keep": "old", "d/x": "old x"} {
			if b, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(b) != want {
				t.Errorf("%s: %s holds %q (%v), want %q", c.name, name, b, err, want)
			}
		}
		if l, err := os.Readlink(filepath.Join(dst, "ln")); err != nil || l != "keep" {
			t.Errorf("%s: ln -> %q (%v), want keep", c.name, l, err)
		}
		if fi, err := os.Stat(filepath.Join(dst, "d")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: d's mode changed: %v %v", c.name, fi.Mode(), err)
		}
	}
	if err := extractAll(root, bytes.NewReader(crafted(t, file("keep", "new", 0o600), symlink("ln", "new"), file("new", "n", 0o644)))); err != nil {
		t.Fatal(err)
	}
	want := []string{". d---------", "d d---------", "d/x ----------", "keep ----------", "ln L---------", "new ----------"}
	if got := listing(t, dst); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("after a good upload:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "keep")); string(b) != "new" {
		t.Errorf("keep holds %q after the upload that replaced it", b)
	}
}
