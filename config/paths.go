package config

import "github.com/berth-sh/berth/config/paths"

// The environment variables of berth's CLI that name settings. Nothing in package
// registry reads them: the CLI resolves them (flags > environment > config file >
// defaults) and passes the result to Load and registry.Open. ResolvePath reads
// EnvConfig.
const (
	// EnvConfig names the config file (like --config).
	EnvConfig = paths.EnvConfig
	// EnvStateDir names the state dir (like --state-dir).
	EnvStateDir = paths.EnvStateDir
	// EnvLog sets the log level (like --log-level), one of LogLevels.
	EnvLog = "BERTH_LOG"
)

// DefaultPath returns the default config file (paths.DefaultPath, whose doc gives
// the rule and the error).
func DefaultPath() (string, error) { return paths.DefaultPath() }

// DefaultStateDir returns the default state dir (paths.DefaultStateDir, whose doc
// gives the rule and the error).
func DefaultStateDir() (string, error) { return paths.DefaultStateDir() }

// ResolvePath applies the config file's precedence, flag over $BERTH_CONFIG over
// DefaultPath (paths.ResolvePath, whose doc gives the details and errors).
func ResolvePath(flag string) (path string, explicit bool, err error) { return paths.ResolvePath(flag) }

// ExpandHome replaces a leading "~" or "~/" of p with the home directory
// (paths.ExpandHome).
func ExpandHome(p string) string { return paths.ExpandHome(p) }
