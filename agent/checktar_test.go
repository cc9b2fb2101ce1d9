package agent

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// CheckTar passes directories, files and symlinks on with their attributes, names
// made relative, and refuses every other type, names out of the destination and a
// total over the limit, naming the entry.
func TestCheckTar(t *testing.T) {
	sticky := dir("d", 0o1777)
	suid := file("d/suid", "#!/bin/sh\n", 0o4755)
	suid.Uid, suid.Gid, suid.Uname = 7, 8, "someone"
	in := crafted(t, sticky, suid, symlink("d/abs", "/etc/passwd"), file("/top", "abc", 0o600), dir("./d/e", 0o700))
	var out bytes.Buffer
	n, size, err := CheckTar(bytes.NewReader(in), &out, 0)
	if err != nil || n != 5 || size != 13 {
		t.Fatalf("CheckTar: %d entries, %d bytes, %v", n, size, err)
	}
	var got []string
	tr := tar.NewReader(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		got = append(got, strings.Join([]string{h.Name, string(h.Typeflag), h.Linkname, string(body), h.Uname}, "|"))
		if h.Name == "d/suid" && (h.Mode != 0o4755 || h.Uid != 7 || h.Gid != 8) {
			t.Errorf("d/suid: mode %o, owner %d:%d", h.Mode, h.Uid, h.Gid)
		}
		if h.Name == "d/" && h.Mode != 0o1777 {
			t.Errorf("d: mode %o", h.Mode)
		}
	}
	want := []string{"d/|5|||", "d/suid|0||#!/bin/sh\n|", "d/abs|2|/etc/passwd||", "top|0||abc|", "d/e/|5|||"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("CheckTar wrote\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	for _, c := range []struct {
		name    string
		entries []hdr
		limit   int64
		msg     string
	}{
		{"hardlink", []hdr{file("a", "x", 0o644), hardlink("b", "a")}, 0, "b: refused: a hard link to a"},
		{"fifo", []hdr{{tar.Header{Name: "f", Typeflag: tar.TypeFifo, Mode: 0o644}, ""}}, 0, "f: refused: a FIFO"},
		{"device", []hdr{{tar.Header{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, ""}}, 0, "null: refused: a device"},
		{"escape", []hdr{file("a/../../x", "x", 0o644)}, 0, "a/../../x: name leaves the destination"},
		{"empty-link", []hdr{symlink("l", "")}, 0, "l: refused: a symlink with an empty target"},
		{"over-limit", []hdr{file("a", "12345", 0o644), file("b", "123456", 0o644)}, 10, "b: refused: 6 bytes, which would take the copy past its limit of 10 bytes"},
		{"terminal", []hdr{{tar.Header{Name: "\x1b[2J", Typeflag: tar.TypeFifo}, ""}}, 0, `"\x1b[2J": refused`},
		{"dot-file", []hdr{file("a", "a", 0o644), file(".", "x", 0o644)}, 0, ".: " + dotNotDir},
		{"dot-link", []hdr{symlink("./", "/etc")}, 0, "./: " + dotNotDir},
	} {
		_, _, err := CheckTar(bytes.NewReader(crafted(t, c.entries...)), io.Discard, c.limit)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %q", c.name, err, c.msg)
		}
		if c.name == "over-limit" && !errors.Is(err, ErrTarTooLarge) {
			t.Errorf("over-limit: %v does not wrap ErrTarTooLarge", err)
		}
	}
	// A directory entry named "." (tar -C dir -c . starts with one) names the
	// destination, which an upload never changes: it is neither passed on nor counted.
	var dot bytes.Buffer
	if n, size, err := CheckTar(bytes.NewReader(crafted(t, dir(".", 0o700), file("./a", "a", 0o644))), &dot, 0); err != nil || n != 1 || size != 1 {
		t.Errorf("./ and ./a: %d entries, %d bytes, %v; want 1 and 1", n, size, err)
	} else if tr := tar.NewReader(&dot); true {
		if h, err := tr.Next(); err != nil || h.Name != "a" {
			t.Errorf("./ and ./a: first entry written %+v %v, want a", h, err)
		}
	}
	if _, _, err := CheckTar(strings.NewReader("not a tar stream at all"), io.Discard, 0); err == nil || !strings.Contains(err.Error(), "reading the tar stream after 0 entries") {
		t.Errorf("no tar: %v", err)
	}
	// A stream cut inside a file's data is an error, not a short file.
	cut := crafted(t, file("a", strings.Repeat("x", 2000), 0o644))
	if _, _, err := CheckTar(bytes.NewReader(cut[:1024]), io.Discard, 0); err == nil {
		t.Errorf("a cut stream passed")
	}
}

// FuzzCheckTar: whatever a client sends, CheckTar either refuses it with a printable
// error or writes a tar stream of only directories, regular files and symlinks with
// local names and at most the limit's bytes of files, one entry per entry counted.
//
//	go test ./agent -run '^$' -fuzz FuzzCheckTar -fuzztime 1m
func FuzzCheckTar(f *testing.F) {
	for _, s := range fuzzTarSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const limit = 1 << 20
		var out bytes.Buffer
		n, size, err := CheckTar(bytes.NewReader(data), &out, limit)
		if err != nil {
			if r, ok := unprintable(err.Error()); ok {
				t.Fatalf("the error holds the control character %q: %q", r, err)
			}
			return
		}
		tr := tar.NewReader(&out)
		var count int
		var total int64
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("CheckTar's own output does not read: %v", err)
			}
			switch h.Typeflag {
			case tar.TypeDir, tar.TypeReg, tar.TypeSymlink:
			default:
				t.Fatalf("%q: type %q passed", h.Name, h.Typeflag)
			}
			if n := strings.TrimSuffix(h.Name, "/"); n != "." && !filepath.IsLocal(n) {
				t.Fatalf("the name %q passed", h.Name)
			}
			if sparse(h) {
				t.Fatalf("%q: a sparse entry passed", h.Name)
			}
			m, _ := io.Copy(io.Discard, tr)
			total += m
			count++
		}
		if count != n || total != size || total > limit {
			t.Fatalf("CheckTar said %d entries and %d bytes; its output holds %d and %d (limit %d)", n, size, count, total, limit)
		}
	})
}
