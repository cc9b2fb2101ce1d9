package paths

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-sh/berth/backend"
)

// The environment variables that name the config file and the state dir
// (config.EnvConfig and config.EnvStateDir). ResolvePath reads EnvConfig.
const (
	// EnvConfig names the config file (like --config).
	EnvConfig = "BERTH_CONFIG"
	// EnvStateDir names the state dir (like --state-dir).
	EnvStateDir = "BERTH_STATE_DIR"
)

// DefaultPath returns the default config file, an absolute path:
// $XDG_CONFIG_HOME/berth/config.hcl, or ~/.config/berth/config.hcl when
// XDG_CONFIG_HOME is unset or not absolute. It reads those variables and $HOME
// only; the file need not exist. Error: no home directory (os.UserHomeDir), with
// what to set instead.
func DefaultPath() (string, error) {
	if x := os.Getenv("XDG_CONFIG_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "berth", "config.hcl"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("finding the default config file: %w; set --config or BERTH_CONFIG", err)
	}
	return filepath.Join(home, ".config", "berth", "config.hcl"), nil
}

// DefaultStateDir returns the default state dir, an absolute path:
// $XDG_STATE_HOME/berth, or ~/.local/state/berth when XDG_STATE_HOME is unset or not
// absolute. It creates nothing. Error (wrapping backend.ErrInvalid): no home
// directory, with what to set instead.
func DefaultStateDir() (string, error) {
	if x := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "berth"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", backend.Errorf(backend.ErrInvalid, "finding the default state dir: %w; set --state-dir or BERTH_STATE_DIR", err)
	}
	return filepath.Join(home, ".local", "state", "berth"), nil
}

// ResolvePath applies the config file's precedence: flag (--config) over
// $BERTH_CONFIG over DefaultPath. The path is absolute, with a leading "~/"
// expanded (ExpandHome). explicit is true for the first two: such a file must exist,
// while a missing default file means "use Default". Errors: those of DefaultPath and
// filepath.Abs.
func ResolvePath(flag string) (path string, explicit bool, err error) {
	if flag != "" {
		return absPath(flag)
	}
	if env := os.Getenv(EnvConfig); env != "" {
		return absPath(env)
	}
	p, err := DefaultPath()
	return p, false, err
}

func absPath(p string) (string, bool, error) {
	p = ExpandHome(p)
	a, err := filepath.Abs(p)
	return a, true, err
}

// ExpandHome replaces a leading "~" or "~/" of p with the home directory
// (os.UserHomeDir); p is returned unchanged otherwise, or when there is no home
// directory. "~user/" is not expanded.
func ExpandHome(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if h, err := os.UserHomeDir(); err == nil {
			return filepath.Join(h, p[1:])
		}
	}
	return p
}
