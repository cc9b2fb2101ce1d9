package agent

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Fuzz targets of the tar extraction, both ways (docs/fuzzing.md): FuzzExtractTar
// is a download (the host extracts what a hostile sandbox sends), FuzzExtractUpload
// the agent's CopyIn (the sandbox extracts what the host sends). Seeds in f.Add are
// crafted entries of every kind; testdata/fuzz holds GNU tar's sparse files.

// fuzzTarSeeds are tar streams of every entry type and of the tricks a hostile
// stream plays: traversal, links out, links to host files, devices, long and PAX
// names, huge sizes.
func fuzzTarSeeds(f *testing.F) [][]byte {
	reg := func(name, body string) hdr { return file(name, body, 0o644) }
	long := strings.Repeat("d/", 60) + "f"
	pax := reg("out/pax", "x")
	pax.PAXRecords = map[string]string{"path": "out/pax-renamed", "linkpath": "/etc/passwd", "size": "1", "uid": "99999999999"}
	sparseRecs := reg("out/sparse", "")
	sparseRecs.PAXRecords = map[string]string{"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "4294967296"}
	setid := file("out/suid", "#!/bin/sh\n", 0o6755)
	setid.Uid, setid.Gid = 0, 0
	var out [][]byte
	for _, entries := range [][]hdr{
		{dir("out", 0o755), reg("out/a", "hello"), dir("out/d", 0o700), reg("out/d/b", "b"), symlink("out/l", "a"), symlink("out/d/up", "../a")},
		{dir("out", 0o755), hardlink("out/stolen", "../outside/secret")},
		{dir("out", 0o755), reg("out/a", "x"), hardlink("out/b", "out/a")},
		{dir("out", 0o755), symlink("out/abs", "/etc/passwd"), symlink("out/up", "../../outside/secret")},
		{dir("out", 0o755), symlink("out/link", "."), reg("out/link/f", "x")},
		{dir("out", 0o755), symlink("out/dd", "x/../../.."), reg("out/../outside/planted", "evil")},
		{reg("/out/abs-name", "x"), reg("../escape", "x"), reg("out/./../../escape2", "x")},
		{dir("out", 0o755), {tar.Header{Name: "out/fifo", Typeflag: tar.TypeFifo, Mode: 0o644}, ""}},
		{dir("out", 0o755), {tar.Header{Name: "out/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, ""}},
		{dir("out", 0o755), {tar.Header{Name: "out/sda", Typeflag: tar.TypeBlock, Mode: 0o660, Devmajor: 8}, ""}},
		{dir("out", 0o755), reg("out/"+long, "deep")},
		{dir("out", 0o755), pax, sparseRecs},
		{dir("out", 0o755), setid, dir("out/sticky", 0o1777)},
		{symlink("out", "x")},
		{reg("link", "through the destination's link"), reg("link/x", "x"), reg("keep", "replaced")},
		{dir("work", 0o755), reg("work/f", "x")},
		{dir("out", 0o755), reg("out/\x1b[2J\x07", "terminal"), hardlink("out/\x1b]0;pwned\x07", "y")},
	} {
		out = append(out, crafted(f, entries...))
	}
	// A header that claims a terabyte, and a few bytes of it.
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "out/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "out/huge", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40, Format: tar.FormatPAX})
	return append(out, append(b.Bytes(), "the rest never comes"...))
}

// tarFuzzOptions decodes ExtractTar's options from a fuzzed byte: the tree asked for
// (bits 0–1), a new name (bit 2), --archive (bit 3).
func tarFuzzOptions(opt uint8) ExtractOptions {
	o := ExtractOptions{Top: []string{"out", "", ".", "out/d"}[opt&3], Archive: opt&8 != 0}
	if opt&4 != 0 {
		o.Name = "renamed"
	}
	return o
}

// fuzzTree makes base/outside (a host secret and a directory) and base/dest (the
// destination, holding a file, a directory and links out to base/outside).
func fuzzTree(t *testing.T) (base, outside, dest string) {
	base = t.TempDir()
	outside, dest = filepath.Join(base, "outside"), filepath.Join(base, "dest")
	for _, d := range []string{filepath.Join(outside, "dir"), filepath.Join(dest, "out", "old")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, body := range map[string]string{
		filepath.Join(outside, "secret"): "PRIVATE KEY", filepath.Join(dest, "keep"): "mine", filepath.Join(dest, "out", "old", "f"): "old",
	} {
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		filepath.Join(dest, "link"): "../outside", filepath.Join(dest, "renamed"): "../outside/secret", filepath.Join(dest, "out", "old", "up"): "../../../outside",
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	return base, outside, dest
}

// treeEntry is what snapshot records of one path.
type treeEntry struct {
	mode  fs.FileMode
	size  int64
	nlink uint64
	ino   uint64
	uid   uint32
	// what is the content's sha256 for a regular file, the target for a symlink.
	what string
}

// snapshot records every path under dir (not following links) by its name relative
// to dir.
func snapshot(t *testing.T, dir string) map[string]treeEntry {
	t.Helper()
	out := map[string]treeEntry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		e := treeEntry{mode: fi.Mode(), size: fi.Size(), nlink: uint64(st.Nlink), ino: st.Ino, uid: st.Uid}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			e.what = hex.EncodeToString(sum[:])
		case fi.Mode()&fs.ModeSymlink != 0:
			if e.what, err = os.Readlink(p); err != nil {
				return err
			}
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(a, b map[string]treeEntry) string {
	for p, e := range a {
		if f, ok := b[p]; !ok || f != e {
			return fmt.Sprintf("%s: %+v, then %+v (present %v)", p, e, f, ok)
		}
	}
	for p, e := range b {
		if _, ok := a[p]; !ok {
			return fmt.Sprintf("%s appeared: %+v", p, e)
		}
	}
	return ""
}

// bounded runs fn and fails the test when it does not return within a minute (a
// hang on hostile input).
func bounded(t *testing.T, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s did not return within a minute", what)
		return nil
	}
}

// escapes reports how following the new symlink at rel (a path under dest) leaves
// dest, or "" when it stays inside: the target is resolved through dest's links
// component by component, except the links that were there before (old), which are
// the user's own.
func escapes(dest, rel string, old map[string]treeEntry) string {
	todo := strings.Split(rel, "/")
	var at []string // the resolved path so far, inside dest
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(at) == 0 {
				return "it leads above the destination"
			}
			at = at[:len(at)-1]
			continue
		}
		p := path.Join(append(at, c)...)
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			at = append(at, c)
			continue
		}
		target, _ := os.Readlink(filepath.Join(dest, p))
		if e, ok := old[p]; ok && e.what == target {
			return "" // the user's own link: what it leads to is the user's business
		}
		if hops++; hops > 40 {
			return "" // a loop: the kernel refuses to follow it
		}
		if path.IsAbs(target) {
			return fmt.Sprintf("%s is a link to the absolute %s", p, target)
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return ""
}

func FuzzExtractTar(f *testing.F) {
	for _, s := range fuzzTarSeeds(f) {
		for _, opt := range []uint8{0, 1, 2, 4, 8, 12} {
			f.Add(s, opt)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, opt uint8) {
		opts := tarFuzzOptions(opt)
		base, outside, dest := fuzzTree(t)
		beforeOut, beforeDest := snapshot(t, outside), snapshot(t, dest)
		err := bounded(t, "ExtractTar", func() error { return ExtractTar(bytes.NewReader(data), dest, opts) })
		if d := sameTree(beforeOut, snapshot(t, outside)); d != "" {
			t.Fatalf("ExtractTar (%+v, error %v) changed a file outside the destination: %s", opts, err, d)
		}
		if ents, _ := os.ReadDir(base); len(ents) != 2 {
			t.Fatalf("ExtractTar (%+v, error %v) wrote beside the destination: %v", opts, err, ents)
		}
		after := snapshot(t, dest)
		var xe *ExtractError
		if err != nil {
			if !errors.As(err, &xe) {
				t.Fatalf("ExtractTar: %T %v is not an *ExtractError", err, err)
			}
			if r, ok := unprintable(err.Error()); ok {
				t.Fatalf("ExtractTar: the error holds the control character %q, with which a hostile stream drives the terminal: %q", r, err)
			}
			if xe.Left == "" && !xe.Moved && !xe.InPlace {
				if d := sameTree(beforeDest, after); d != "" {
					t.Fatalf("ExtractTar says %q, but the destination changed: %s", xe.Outcome(), d)
				}
			}
		}
		var before, now int64
		for _, e := range beforeDest {
			before += e.size
		}
		for p, e := range after {
			if strings.HasPrefix(p, ".berth-cp-") && (xe == nil || xe.Left == "") {
				t.Fatalf("the staging directory %s is left behind (error %v)", p, err)
			}
			if old, ok := beforeDest[p]; ok && old == e {
				continue
			}
			switch {
			case e.mode.IsRegular():
				now += e.size
				if e.nlink != 1 {
					t.Fatalf("%s has %d hard links: a download makes no hard link", p, e.nlink)
				}
			case e.mode.IsDir():
			case e.mode&fs.ModeSymlink != 0:
				if why := escapes(dest, p, beforeDest); why != "" {
					t.Fatalf("the new symlink %s -> %s leads out of the destination: %s", p, e.what, why)
				}
			default:
				t.Fatalf("%s is a %v: a download makes only files, directories and symlinks", p, e.mode.Type())
			}
			if !opts.Archive && (e.mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 || e.uid != uint32(os.Geteuid())) {
				t.Fatalf("%s: mode %v, owner %d, without --archive", p, e.mode, e.uid)
			}
		}
		// What is written is what the stream carries: no hole or header expands.
		if now > before+int64(len(data)) {
			t.Fatalf("a %d-byte stream wrote %d bytes of files", len(data), now)
		}
	})
}

func FuzzExtractUpload(f *testing.F) {
	for _, s := range fuzzTarSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// The host's stream is trusted to be the host's files: a sparse or huge
		// entry is written out as it says, so only small ones are tried here.
		var size int64
		tr := tar.NewReader(bytes.NewReader(data))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if size += h.Size; h.Size < 0 || size > 1<<20 {
				return
			}
		}
		base, outside, dest := fuzzTree(t)
		beforeOut, beforeDest := snapshot(t, outside), snapshot(t, dest)
		root, err := os.OpenRoot(dest)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		err = bounded(t, "extractAll", func() error { return extractAll(root, bytes.NewReader(data)) })
		if d := sameTree(beforeOut, snapshot(t, outside)); d != "" {
			t.Fatalf("extractAll (error %v) changed a file outside the destination: %s", err, d)
		}
		if ents, _ := os.ReadDir(base); len(ents) != 2 {
			t.Fatalf("extractAll (error %v) wrote beside the destination: %v", err, ents)
		}
		// A failed upload is undone: the destination is as it was.
		if d := sameTree(beforeDest, snapshot(t, dest)); err != nil && d != "" {
			t.Fatalf("extractAll failed (%v) and left the destination changed: %s", err, d)
		}
		links := map[uint64]int{}
		after := snapshot(t, dest)
		for p, e := range after {
			switch {
			case e.mode.IsRegular():
				links[e.ino]++
			case e.mode.IsDir(), e.mode&fs.ModeSymlink != 0:
			default:
				t.Fatalf("%s is a %v: an upload makes only files, directories and symlinks", p, e.mode.Type())
			}
		}
		// A hard link joins files of the copy only.
		for p, e := range after {
			if e.mode.IsRegular() && uint64(links[e.ino]) != e.nlink {
				t.Fatalf("%s has %d links, %d of them in the destination", p, e.nlink, links[e.ino])
			}
		}
	})
}
