package registry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
)

// stateDirError is the one error for a state dir that cannot be used.
func stateDirError(dir, why string) error {
	return backend.Errorf(backend.ErrInvalid,
		"state dir %s cannot be written: %s; choose a writable directory (berth's --state-dir or %s, state_dir in the config, or registry.WithStateDir), or fix its permissions",
		dir, why, config.EnvStateDir)
}

// kernelFilesystems names the filesystems of kernel interfaces, where berth cannot keep its
// files however access(2) answers (root passes it): no one makes a directory in
// proc or sysfs, and a directory made in cgroup, bpf or tracefs is the kernel's
// object, which holds no files of ours. Keyed by statfs(2)'s f_type (the kernel's
// include/uapi/linux/magic.h).
var kernelFilesystems = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "proc",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.CGROUP_SUPER_MAGIC:  "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.BPF_FS_MAGIC:        "bpf",
}

// kernelFS reports why the existing directory p cannot hold the state dir though
// access(2) allows it (as it does for root): p is on a kernel interface's filesystem
// (kernelFilesystems); nil otherwise. (A read-only mount needs no check here: access(2)
// answers EROFS for it.) A failed statfs is no answer: nil.
func kernelFS(p string) error {
	var fs unix.Statfs_t
	if unix.Statfs(p, &fs) != nil {
		return nil
	}
	if name, ok := kernelFilesystems[int64(fs.Type)]; ok {
		return fmt.Errorf("%s is on a %s filesystem, a kernel interface where berth cannot keep its files", p, name)
	}
	return nil
}

// checkStateDir reports whether dir exists as a writable directory or can be created
// (its nearest existing ancestor is a writable directory). It creates nothing.
func checkStateDir(dir string) error {
	p := dir
	for {
		st, err := os.Stat(p)
		if err == nil {
			if !st.IsDir() {
				return stateDirError(dir, p+" is not a directory")
			}
			if err := unix.Access(p, unix.W_OK|unix.X_OK); err != nil {
				return stateDirError(dir, fmt.Sprintf("%s: %v", p, err))
			}
			if err := kernelFS(p); err != nil {
				return stateDirError(dir, err.Error())
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
			return stateDirError(dir, err.Error())
		}
		parent := filepath.Dir(p)
		if parent == p {
			return stateDirError(dir, "no part of the path exists")
		}
		p = parent
	}
	if p == dir {
		store := filepath.Join(dir, StoreFile)
		if _, err := os.Stat(store); err == nil {
			if err := unix.Access(store, unix.R_OK|unix.W_OK); err != nil {
				return stateDirError(dir, fmt.Sprintf("%s: %v", store, err))
			}
		}
	}
	return nil
}

// mkdirTracked creates dir and its missing parents (mode 0700) and returns the
// directories it created, outermost first. On failure it removes them again.
func mkdirTracked(dir string) ([]string, error) {
	var missing []string
	for p := dir; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	var made []string
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			removeDirs(made)
			return nil, err
		} else if err == nil {
			made = append(made, missing[i])
		}
	}
	return made, nil
}

// removeDirs removes the (empty) directories made by mkdirTracked, innermost first.
func removeDirs(made []string) {
	for i := len(made) - 1; i >= 0; i-- {
		os.Remove(made[i])
	}
}
