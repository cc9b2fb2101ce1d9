package agent

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/backend"
)

// A download stops at ExtractOptions.MaxBytes: the file that would take the copy
// past it is refused before any of it is written, naming the limit and how to raise
// it, and the destination is left as it was. A header that claims more than the
// default limit is refused from its header alone.
func TestExtractTarMaxBytes(t *testing.T) {
	stream := crafted(t, dir("out", 0o755), file("out/a", strings.Repeat("a", 600), 0o644), file("out/b", strings.Repeat("b", 600), 0o644))
	dst := t.TempDir()
	err := ExtractTar(bytes.NewReader(stream), dst, ExtractOptions{Top: "out", MaxBytes: 1000})
	if err == nil || !strings.Contains(err.Error(), "out/b: refused: 600 bytes, which would take the copy past its limit of 1000 bytes") ||
		!strings.Contains(err.Error(), "--max-size") || !strings.Contains(err.Error(), "nothing was written to") {
		t.Errorf("a copy of 1200 bytes with MaxBytes 1000: %v", err)
	}
	if l := listing(t, dst); len(l) != 1 {
		t.Errorf("destination after the refusal: %v, want it empty", l)
	}
	if err := ExtractTar(bytes.NewReader(stream), dst, ExtractOptions{Top: "out", MaxBytes: 1200}); err != nil {
		t.Errorf("the same copy with MaxBytes 1200: %v", err)
	}
	if err := ExtractTar(bytes.NewReader(stream), t.TempDir(), ExtractOptions{Top: "out", MaxBytes: -1}); err != nil {
		t.Errorf("the same copy without a limit: %v", err)
	}

	// A header of DefaultMaxCopyBytes+1 bytes, then the stream ends: the limit is the
	// error, not the missing body.
	var huge bytes.Buffer
	tw := tar.NewWriter(&huge)
	tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: DefaultMaxCopyBytes + 1})
	tw.Flush()
	err = ExtractTar(bytes.NewReader(huge.Bytes()), t.TempDir(), ExtractOptions{Top: "big"})
	if err == nil || !strings.Contains(err.Error(), "limit of 1073741824 bytes (1 GiB;") {
		t.Errorf("a file of 1 GiB and a byte, over the default limit: %v", err)
	}
}

// allocated returns the bytes the file system holds for path (st_blocks).
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// sparseBody is 64 MiB of zeros with a few bytes of data at its start, middle and
// end, as a file made with truncate and a few writes holds.
func sparseBody() []byte {
	b := make([]byte, 64<<20)
	copy(b, "head")
	copy(b[32<<20:], "middle")
	copy(b[len(b)-3:], "end")
	return b
}

// Runs of zeros are written as holes both ways: a download (ExtractTar) and an
// upload (the agent's CopyIn) of a 64 MiB file holding 13 bytes of data allocate a
// few blocks, and read back byte for byte.
func TestCopyKeepsHoles(t *testing.T) {
	body := sparseBody()
	stream := crafted(t, hdr{tar.Header{Name: "sparse", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}, string(body)})
	check := func(how, path string) {
		t.Helper()
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, body) {
			t.Errorf("%s: the file reads back as %d bytes (%v), want the 64 MiB written", how, len(got), err)
		}
		if a := allocated(t, path); a > 1<<20 {
			t.Errorf("%s: the file holds %d bytes on disk, want its holes kept (a few blocks)", how, a)
		}
	}
	dst := t.TempDir()
	if err := ExtractTar(bytes.NewReader(stream), dst, ExtractOptions{Top: "sparse"}); err != nil {
		t.Fatal(err)
	}
	check("download", filepath.Join(dst, "sparse"))

	a := startAgent(t)
	up := t.TempDir()
	if err := a.c.CopyIn(testCtx(t), up, bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	check("upload", filepath.Join(up, "sparse"))
}

// The agent's own directories are no copy's target: CopyIn into its socket dir or
// state dir, or under them, or with an entry that would land in them or replace
// them, is refused naming the directory, and the agent keeps answering on its socket.
func TestCopyInRefusesAgentDirs(t *testing.T) {
	a := &testAgent{sockDir: deepDir(t), logPath: filepath.Join(t.TempDir(), "agent.log"), stateDir: filepath.Join(t.TempDir(), "state"), exited: make(chan struct{})}
	os.MkdirAll(a.stateDir, 0o700)
	a.start(t)
	c, err := NewClient(testCtx(t), DialSocketDir(a.sockDir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	sockName := filepath.Base(a.sockDir)
	for _, tc := range []struct {
		what, dir string
		stream    []byte
	}{
		{"into the socket dir", a.sockDir, crafted(t, file(backend.AgentSocketName, "x", 0o644))},
		{"into the state dir", a.stateDir, crafted(t, file("f", "x", 0o644))},
		{"into a dir under the state dir", mkdir(t, filepath.Join(a.stateDir, "sub")), crafted(t, file("f", "x", 0o644))},
		{"an entry into the socket dir", filepath.Dir(a.sockDir), crafted(t, file(sockName+"/"+backend.AgentSocketName, "x", 0o644))},
		{"an entry replacing the socket dir", filepath.Dir(a.sockDir), crafted(t, file(sockName, "x", 0o644))},
		{"through a symlink to the socket dir", linkTo(t, a.sockDir), crafted(t, file("f", "x", 0o644))},
	} {
		err := c.CopyIn(ctx, tc.dir, bytes.NewReader(tc.stream))
		if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "berth's agent's own directory") {
			t.Errorf("CopyIn %s: %v, want ErrInvalid naming the agent's own directory", tc.what, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(a.sockDir, backend.AgentSocketName)); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("the agent's socket after the refused copies: %v %v", fi, err)
	}
	if _, err := NewClient(ctx, DialSocketDir(a.sockDir)); err != nil {
		t.Errorf("a new connection after the refused copies: %v", err)
	}
	// A directory beside them is an ordinary target.
	if err := c.CopyIn(ctx, filepath.Dir(a.sockDir), bytes.NewReader(crafted(t, file("beside", "x", 0o644)))); err != nil {
		t.Errorf("CopyIn beside the socket dir: %v", err)
	}
}

func mkdir(t *testing.T, d string) string {
	t.Helper()
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// linkTo returns a new symlink to dir.
func linkTo(t *testing.T, dir string) string {
	t.Helper()
	l := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, l); err != nil {
		t.Fatal(err)
	}
	return l
}
