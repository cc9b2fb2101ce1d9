package agent

import (
	"archive/tar"
	"bytes"
	"os"
	"testing"
)

// ExtractTar never writes through a link, whether the destination held it or the
// stream made it, and refuses names that leave the destination.
func TestExtractTarContained(t *testing.T) {
	outside := t.TempDir()
	for _, entries := range [][]tarEntry{
		{{name: "t/", dir: true}, {name: "t/link", link: outside}, {name: "t/link/evil", body: "x"}},
		{{name: "../evil", body: "x"}},
		{{name: "t/abs", link: "/"}, {name: "t/abs" + outside + "/evil", body: "x"}},
	} {
		dst := t.TempDir()
		err := ExtractTar(bytes.NewReader(makeTar(t, entries)), dst, ExtractOptions{Top: "t"})
		if err == nil {
			t.Errorf("%v: extracted without error", entries)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("%v: wrote %v outside the destination", entries, ents)
		}
	}
}

type tarEntry struct {
	name, link, body string
	dir              bool
}

func makeTar(t *testing.T, entries []tarEntry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case e.dir:
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}
