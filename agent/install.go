package agent

import (
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/filehash"
)

// Binary is the agent executable installed in a state dir.
type Binary struct {
	// Path is the absolute path of the content-addressed copy,
	// STATEDIR/agent/bin/<Hash>. It is never modified once in place.
	Path string
	// Hash is the lowercase hex SHA-256 of the file's content.
	Hash string
	// Static reports whether the binary is statically linked (IsStatic), as drivers
	// whose sandbox has its own root filesystem require.
	Static bool
}

// Install puts the agent binary src in stateDir: a copy at
// stateDir/agent/bin/<sha256>, made once per content. The hash of src is cached in
// stateDir/agent/hashcache/ (internal/filehash: under src's device, inode, size, mtime
// and ctime), so a second Install of an unchanged file reads no content at all. The copy is written to a
// temporary file while syscall.ForkLock is held (no fork can inherit the writable
// descriptor, so starting the copy never fails with ETXTBSY) and then linked into
// place atomically. Errors: src is not a regular file (ErrInvalid), or stateDir
// cannot be written.
func Install(stateDir, src string) (Binary, error) {
	if stateDir == "" || src == "" {
		return Binary{}, backend.Errorf(backend.ErrInvalid, "agent install: state dir and binary path must be set")
	}
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return Binary{}, fmt.Errorf("agent install: %w", err)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return Binary{}, backend.Errorf(backend.ErrInvalid, "agent binary %s: %w", src, err)
	}
	if !fi.Mode().IsRegular() {
		return Binary{}, backend.Errorf(backend.ErrInvalid, "agent binary %s: not a regular file", src)
	}
	binDir := filepath.Join(stateDir, "agent", "bin")
	cacheDir := filepath.Join(stateDir, "agent", "hashcache")
	for _, d := range []string{binDir, cacheDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Binary{}, fmt.Errorf("agent install: %w", err)
		}
	}
	hash, err := filehash.Sum(src, cacheDir)
	if err != nil {
		return Binary{}, fmt.Errorf("agent install: hashing %s: %w", src, err)
	}
	dst := filepath.Join(binDir, hash)
	if dfi, err := os.Lstat(dst); err != nil || !dfi.Mode().IsRegular() || dfi.Size() != fi.Size() {
		if err := installCopy(src, dst); err != nil {
			return Binary{}, fmt.Errorf("agent install: %w", err)
		}
	}
	static, err := IsStatic(dst)
	if err != nil {
		return Binary{}, err
	}
	return Binary{Path: dst, Hash: hash, Static: static}, nil
}

func tempName(dir, prefix string) string {
	var b [8]byte
	rand.Read(b[:])
	return filepath.Join(dir, prefix+hex.EncodeToString(b[:]))
}

// copyExecutable copies src to a new file tmp (mode 0755) while holding
// syscall.ForkLock for writing, so no process forked meanwhile holds tmp open for
// writing when it is executed later, and syncs it.
func copyExecutable(src, tmp string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	syscall.ForkLock.Lock()
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err == nil {
		_, err = io.Copy(out, in)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}
	syscall.ForkLock.Unlock()
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.Remove(tmp)
		return err
	}
	// fsync through a read-only descriptor: a writable one would be ETXTBSY bait.
	if f, err := os.Open(tmp); err == nil {
		f.Sync()
		f.Close()
	}
	return nil
}

// installCopy copies src to dst unless a concurrent Install got there first.
func installCopy(src, dst string) error {
	tmp := tempName(filepath.Dir(dst), ".tmp-")
	if err := copyExecutable(src, tmp); err != nil {
		return err
	}
	defer os.Remove(tmp)
	err := os.Link(tmp, dst)
	if errors.Is(err, fs.ErrExist) {
		// Another Install linked a complete copy first, unless what is there is
		// damaged (another size): replace that atomically.
		tfi, terr := os.Stat(tmp)
		dfi, derr := os.Lstat(dst)
		if terr == nil && derr == nil && dfi.Mode().IsRegular() && dfi.Size() == tfi.Size() {
			return nil
		}
		return os.Rename(tmp, dst)
	}
	return err
}

// PrepareSandbox makes the agent directories of one sandbox: sandboxDir/agent
// (mode 0755, owned by the host user) holding backend.AgentBinaryName, a hard link to
// bin.Path (an existing link to another binary is replaced atomically; across file
// systems a copy is made instead), sandboxDir/run (0755), the socket directory, and
// the sandbox's token sandboxDir/TokenFileName (mode 0600, made once and kept; taken
// from a token an earlier berth left in the agent directory, see TokenName), which no
// driver mounts into the sandbox.
// sandboxDir is created if missing. Errors: a path in the way is not a directory
// (ErrInvalid), or the directories cannot be written.
func PrepareSandbox(sandboxDir string, bin Binary) (backend.AgentFiles, error) {
	if sandboxDir == "" || bin.Path == "" {
		return backend.AgentFiles{}, backend.Errorf(backend.ErrInvalid, "agent prepare: sandbox dir and binary must be set")
	}
	sandboxDir, err := filepath.Abs(sandboxDir)
	if err != nil {
		return backend.AgentFiles{}, fmt.Errorf("agent prepare: %w", err)
	}
	binFi, err := os.Stat(bin.Path)
	if err != nil {
		return backend.AgentFiles{}, backend.Errorf(backend.ErrInvalid, "agent prepare: binary %s: %w", bin.Path, err)
	}
	if err := os.MkdirAll(sandboxDir, 0o755); err != nil {
		return backend.AgentFiles{}, fmt.Errorf("agent prepare: %w", err)
	}
	agentDir := filepath.Join(sandboxDir, "agent")
	runDir := filepath.Join(sandboxDir, "run")
	for _, d := range []string{agentDir, runDir} {
		if err := ensureDir(d); err != nil {
			return backend.AgentFiles{}, err
		}
	}
	link := filepath.Join(agentDir, backend.AgentBinaryName)
	if fi, err := os.Lstat(link); err != nil || !os.SameFile(fi, binFi) {
		tmp := tempName(agentDir, ".berth-agent.tmp-")
		if err := os.Link(bin.Path, tmp); err != nil {
			if !errors.Is(err, syscall.EXDEV) {
				return backend.AgentFiles{}, fmt.Errorf("agent prepare: %w", err)
			}
			if err := copyExecutable(bin.Path, tmp); err != nil {
				return backend.AgentFiles{}, fmt.Errorf("agent prepare: %w", err)
			}
		}
		if err := os.Rename(tmp, link); err != nil {
			os.Remove(tmp)
			return backend.AgentFiles{}, fmt.Errorf("agent prepare: %w", err)
		}
	}
	if err := ensureToken(agentDir); err != nil {
		return backend.AgentFiles{}, fmt.Errorf("agent prepare: %w", err)
	}
	return backend.AgentFiles{Binary: link, Dir: agentDir, SocketDir: runDir, Static: bin.Static}, nil
}

// ensureDir makes d (0755) or checks that it is a real directory, not a link.
func ensureDir(d string) error {
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("agent prepare: %w", err)
	}
	fi, err := os.Lstat(d)
	if err != nil {
		return fmt.Errorf("agent prepare: %w", err)
	}
	if !fi.IsDir() {
		return backend.Errorf(backend.ErrInvalid, "agent prepare: %s is not a directory; remove it", d)
	}
	if fi.Mode().Perm() != 0o755 {
		if err := os.Chmod(d, 0o755); err != nil {
			return fmt.Errorf("agent prepare: %w", err)
		}
	}
	return nil
}

// IsStatic reports whether the ELF executable at path is statically linked: it has
// no PT_INTERP program header (no dynamic loader). Errors: path cannot be read or is
// not an ELF file (ErrInvalid).
func IsStatic(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, backend.Errorf(backend.ErrInvalid, "%s: not an ELF executable: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// InstallSelf copies the running executable (/proc/self/exe) to
// dir/backend.AgentBinaryName, mode 0755, through a temporary file renamed into
// place, so a reader never sees a partial binary. It is what `berth-agent install DIR`
// runs in the init container of a Kubernetes Pod: the agent image (`berth image
// agent`) holds only the binary, which copies itself into an emptyDir volume that
// the sandbox container mounts read-only. Errors: dir is not an existing directory
// (ErrInvalid), or the copy fails.
func InstallSelf(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return backend.Errorf(backend.ErrInvalid, "agent install: %s is not an existing directory (mount the emptyDir volume there)", dir)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("agent install: %w", err)
	}
	tmp := tempName(dir, ".tmp-")
	if err := copyExecutable(self, tmp); err != nil {
		return fmt.Errorf("agent install: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, backend.AgentBinaryName)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("agent install: %w", err)
	}
	return nil
}
