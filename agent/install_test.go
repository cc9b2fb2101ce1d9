package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/filehash"
)

func TestIsStatic(t *testing.T) {
	if ok, err := IsStatic(agentBin); err != nil || !ok {
		t.Errorf("IsStatic(static test agent) = %v, %v", ok, err)
	}
	ls, err := exec.LookPath("ls")
	if err != nil {
		t.Skip("no ls")
	}
	if ok, err := IsStatic(ls); err != nil || ok {
		t.Errorf("IsStatic(%s) = %v, %v; want false", ls, ok, err)
	}
	text := filepath.Join(t.TempDir(), "script")
	os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755)
	if _, err := IsStatic(text); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("IsStatic(script) error = %v, want ErrInvalid", err)
	}
}

func TestInstallOnce(t *testing.T) {
	state := deepDir(t)
	before := filehash.Hashed()
	b1, err := Install(state, agentBin)
	if err != nil {
		t.Fatal(err)
	}
	if filehash.Hashed() != before+1 {
		t.Errorf("first Install hashed %d files", filehash.Hashed()-before)
	}
	if b1.Path != filepath.Join(state, "agent", "bin", b1.Hash) || len(b1.Hash) != 64 || !b1.Static {
		t.Errorf("Install = %+v", b1)
	}
	fi1, err := os.Stat(b1.Path)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := Install(state, agentBin)
	if err != nil {
		t.Fatal(err)
	}
	if b2 != b1 {
		t.Errorf("second Install = %+v, first %+v", b2, b1)
	}
	if filehash.Hashed() != before+1 {
		t.Error("second Install hashed the file again (hash cache miss)")
	}
	fi2, _ := os.Stat(b2.Path)
	if !os.SameFile(fi1, fi2) || !fi1.ModTime().Equal(fi2.ModTime()) {
		t.Error("second Install replaced the copy")
	}
	if fi2.Mode().Perm() != 0o755 {
		t.Errorf("copy mode %v", fi2.Mode())
	}
	if _, err := Install(state, filepath.Join(state, "missing")); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Install of a missing file: %v", err)
	}
}

func TestPrepareSandbox(t *testing.T) {
	state := deepDir(t)
	bin, err := Install(state, agentBin)
	if err != nil {
		t.Fatal(err)
	}
	sb := filepath.Join(state, "sandboxes", "b-1")
	files, err := PrepareSandbox(sb, bin)
	if err != nil {
		t.Fatal(err)
	}
	want := backend.AgentFiles{
		Binary:    filepath.Join(sb, "agent", backend.AgentBinaryName),
		Dir:       filepath.Join(sb, "agent"),
		SocketDir: filepath.Join(sb, "run"),
		Static:    true,
	}
	if files != want {
		t.Errorf("PrepareSandbox = %+v, want %+v", files, want)
	}
	same := func(a, b string) bool {
		fa, err1 := os.Stat(a)
		fb, err2 := os.Stat(b)
		return err1 == nil && err2 == nil && os.SameFile(fa, fb)
	}
	if !same(files.Binary, bin.Path) {
		t.Error("the sandbox's binary is not a hard link to the installed copy")
	}
	for _, d := range []string{files.Dir, files.SocketDir} {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v", d, fi, err)
		}
	}
	// Preparing again is a no-op; with another binary the link is swapped.
	if _, err := PrepareSandbox(sb, bin); err != nil || !same(files.Binary, bin.Path) {
		t.Errorf("second PrepareSandbox: %v", err)
	}
	other, err := Install(state, "/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	if other.Static {
		t.Log("/bin/true is static here")
	}
	if _, err := PrepareSandbox(sb, other); err != nil || !same(files.Binary, other.Path) {
		t.Errorf("PrepareSandbox with another binary: %v", err)
	}
	// The agent dir is mounted into sandboxes: it holds the binary only, and the
	// token, owner-only, lies beside it.
	if ents, _ := os.ReadDir(files.Dir); len(ents) != 1 {
		t.Errorf("agent dir holds %d entries, want the binary only", len(ents))
	}
	if _, err := ReadToken(files.Dir); err != nil {
		t.Errorf("token: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(sb, TokenFileName)); err != nil || fi.Mode() != 0o600 {
		t.Errorf("token file: %v %v, want a regular file of mode 0600 in the sandbox dir", fi.Mode(), err)
	}
	// The agent directory must be a real directory, not a link.
	sb2 := filepath.Join(state, "sandboxes", "b-2")
	os.MkdirAll(sb2, 0o755)
	os.Symlink(t.TempDir(), filepath.Join(sb2, "agent"))
	if _, err := PrepareSandbox(sb2, bin); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("PrepareSandbox over a symlinked agent dir: %v", err)
	}
}

// Copies made and started from many goroutines at once never fail with ETXTBSY: no
// fork can inherit a copy's writable descriptor.
func TestInstallConcurrentStartNoETXTBSY(t *testing.T) {
	small, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				// Mostly a small binary (many copies, many forks), sometimes the agent.
				src, args := small, []string(nil)
				if i%20 == g%20 {
					src = agentBin
				}
				state := t.TempDir()
				bin, err := Install(state, src)
				if err != nil {
					errs <- err
					return
				}
				files, err := PrepareSandbox(filepath.Join(state, "sb"), bin)
				if err != nil {
					errs <- err
					return
				}
				for _, p := range []string{bin.Path, files.Binary} {
					// true exits 0; the agent without arguments prints its usage and exits 2.
					err := exec.Command(p, args...).Run()
					var ee *exec.ExitError
					if err != nil && !errors.As(err, &ee) {
						if errors.Is(err, syscall.ETXTBSY) {
							err = fmt.Errorf("ETXTBSY: %w", err)
						}
						errs <- err
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
