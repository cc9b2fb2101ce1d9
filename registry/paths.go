package registry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-sh/berth/backend"
)

// Environment variables read by Open; Options fields override them.
const (
	// EnvConfig names the config file (like --config).
	EnvConfig = "BERTH_CONFIG"
	// EnvStateDir names the state dir (like --state-dir).
	EnvStateDir = "BERTH_STATE_DIR"
	// EnvLog sets the log level (like --log-level).
	EnvLog = "BERTH_LOG"
)

// DefaultConfigPath returns $XDG_CONFIG_HOME/berth/config.hcl, or
// ~/.config/berth/config.hcl when XDG_CONFIG_HOME is unset or not absolute.
func DefaultConfigPath() (string, error) {
	if x := os.Getenv("XDG_CONFIG_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "berth", "config.hcl"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("finding the default config file: %w; set --config or BERTH_CONFIG", err)
	}
	return filepath.Join(home, ".config", "berth", "config.hcl"), nil
}

// DefaultStateDir returns $XDG_STATE_HOME/berth, or ~/.local/state/berth when
// XDG_STATE_HOME is unset or not absolute.
func DefaultStateDir() (string, error) {
	if x := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "berth"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", backend.Errorf(backend.ErrInvalid, "finding the default state dir: %v; set --state-dir or BERTH_STATE_DIR", err)
	}
	return filepath.Join(home, ".local", "state", "berth"), nil
}

// ResolveConfigPath applies the config file's precedence: flag (--config) over
// $BERTH_CONFIG over DefaultConfigPath. explicit is true for the first two: such a
// file must exist, while a missing default file means "use DefaultConfig".
func ResolveConfigPath(flag string) (path string, explicit bool, err error) {
	if flag != "" {
		return absPath(flag)
	}
	if env := os.Getenv(EnvConfig); env != "" {
		return absPath(env)
	}
	p, err := DefaultConfigPath()
	return p, false, err
}

func absPath(p string) (string, bool, error) {
	p = expandHome(p)
	a, err := filepath.Abs(p)
	return a, true, err
}

func expandHome(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if h, err := os.UserHomeDir(); err == nil {
			return filepath.Join(h, p[1:])
		}
	}
	return p
}

// stateDirError is the one error for a state dir that cannot be used.
func stateDirError(dir, why string) error {
	return backend.Errorf(backend.ErrInvalid,
		"state dir %s cannot be written: %s; choose a writable directory with --state-dir or %s (or state_dir in the config), or fix its permissions",
		dir, why, EnvStateDir)
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
