package backends

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// socketDirPrefix is the name go-plugin gives each plugin's socket directory
// (os.MkdirTemp(base, "plugin-dir")).
const socketDirPrefix = "plugin-dir"

// PluginSocketBase returns the directory in which Launch has go-plugin make each
// plugin's socket directory: $TMPDIR/berth-UID (os.TempDir, /tmp by default), short
// so that the socket path stays within the 108-byte limit of a unix socket address
// whatever the state dir. It is created 0700 when missing. Errors: the path exists
// but is not a directory owned by the caller (a symlink included: another user may
// have made it in a shared /tmp), naming the path and what to do; the path is
// returned with them.
func PluginSocketBase() (string, error) {
	uid := os.Getuid()
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("berth-%d", uid))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return dir, fmt.Errorf("plugin socket directory %s: %w; set TMPDIR to a writable directory", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return dir, fmt.Errorf("plugin socket directory %s: %w", dir, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return dir, fmt.Errorf("plugin socket directory %s is a %s, not a directory; remove it (or set TMPDIR elsewhere)", dir, describeMode(fi.Mode()))
	case !ok:
		return dir, fmt.Errorf("plugin socket directory %s: no owner in its file info", dir)
	case int(st.Uid) != uid:
		return dir, fmt.Errorf("plugin socket directory %s belongs to uid %d, not to you (uid %d): someone else made it; remove it (or set TMPDIR elsewhere)", dir, st.Uid, uid)
	case fi.Mode().Perm() != 0o700:
		if err := os.Chmod(dir, 0o700); err != nil {
			return dir, fmt.Errorf("plugin socket directory %s: %w", dir, err)
		}
	}
	return dir, nil
}

func describeMode(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "symlink"
	case m&os.ModeSocket != 0:
		return "socket"
	case m.IsRegular():
		return "file"
	}
	return "special file"
}

// holdSocketDir takes a shared lock on a plugin's socket directory for as long as
// the returned file stays open (close-on-exec, so the plugin does not inherit it):
// PruneSocketDirs leaves a locked directory alone, and the lock goes with the
// process that holds it, however it ends.
func holdSocketDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking plugin socket directory %s: %w", dir, err)
	}
	return f, nil
}

// StaleSocketDir is a plugin socket directory that PruneSocketDirs found: no
// running berth holds it (the one that made it was killed before it could remove
// it).
type StaleSocketDir struct {
	// Path is the directory.
	Path string
	// Removed says it was deleted (false on a dry run or an error).
	Removed bool
	// Err is why it could not be deleted.
	Err error
}

// PruneSocketDirs deletes, in PluginSocketBase, the plugin socket directories
// last modified longer ago than grace that no process holds (see holdSocketDir);
// with dry it only reports them. A directory is locked exclusively while it is
// deleted, so a berth cannot take it up meanwhile. It returns what it found, or
// the error of PluginSocketBase or of reading it.
func PruneSocketDirs(grace time.Duration, dry bool) ([]StaleSocketDir, error) {
	base, err := PluginSocketBase()
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, err
	}
	var out []StaleSocketDir
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), socketDirPrefix) {
			continue
		}
		p := filepath.Join(base, e.Name())
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < grace {
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close() // held: its berth is alive
			continue
		}
		s := StaleSocketDir{Path: p}
		if !dry {
			if s.Err = os.RemoveAll(p); s.Err == nil {
				s.Removed = true
			}
		}
		f.Close()
		out = append(out, s)
	}
	return out, nil
}
