package catalog

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/internal/filehash"
)

// PluginPrefix starts the file name of every third-party driver executable:
// the driver NAME is served by "berth-driver-NAME".
const PluginPrefix = "berth-driver-"

// EnvPluginPath is the environment variable with extra plugin directories,
// separated by ":" like PATH. They are searched before the config's
// plugin_dirs.
const EnvPluginPath = "BERTH_PLUGIN_PATH"

// PluginFile is the executable file name of the third-party driver name:
// PluginPrefix + name.
func PluginFile(name string) string { return PluginPrefix + name }

// SearchPath returns the directories searched for driver plugins, in order:
// the entries of $BERTH_PLUGIN_PATH (empty entries and relative paths are
// skipped: a relative entry would depend on the working directory), then
// pluginDirs (the config's plugin_dirs), then the directory that holds
// berthBinary (skipped when berthBinary is ""). Duplicates keep their first
// place.
func SearchPath(pluginDirs []string, berthBinary string) []string {
	var dirs []string
	for _, d := range filepath.SplitList(os.Getenv(EnvPluginPath)) {
		if d != "" && filepath.IsAbs(d) {
			dirs = append(dirs, filepath.Clean(d))
		}
	}
	dirs = append(dirs, pluginDirs...)
	if berthBinary != "" {
		if abs, err := filepath.Abs(berthBinary); err == nil {
			dirs = append(dirs, filepath.Dir(abs))
		}
	}
	seen := map[string]bool{}
	out := dirs[:0]
	for _, d := range dirs {
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// SkippedPluginPathEntries returns the entries of $BERTH_PLUGIN_PATH that
// SearchPath skips because they are relative paths (empty entries are not listed),
// in order; nil when there are none. Callers tell the user: a skipped entry is
// otherwise silent.
func SkippedPluginPathEntries() []string {
	var skipped []string
	for _, d := range filepath.SplitList(os.Getenv(EnvPluginPath)) {
		if d != "" && !filepath.IsAbs(d) {
			skipped = append(skipped, d)
		}
	}
	return skipped
}

// Plugin is one third-party driver executable found by Discover or FindPlugin.
type Plugin struct {
	// Name is the driver name (the file name without PluginPrefix).
	Name string `json:"name"`
	// Path is the absolute path of the executable.
	Path string `json:"path"`
}

// Discover lists the berth-driver-NAME files in dirs (see SearchPath), sorted
// by name; when several directories hold the same name, the first directory
// wins, as in PATH. Directories that do not exist or cannot be read are
// skipped. Files that are not executable are listed too, so that starting
// them gives the clear error (Launch) instead of a silent fallback; entries
// that are directories are not.
func Discover(dirs []string) []Plugin {
	found := map[string]Plugin{}
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			name, ok := strings.CutPrefix(e.Name(), PluginPrefix)
			if !ok || name == "" || !validDriverName(name) {
				continue
			}
			if _, dup := found[name]; dup {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if fi, err := os.Stat(p); err != nil || fi.IsDir() {
				continue
			}
			found[name] = Plugin{Name: name, Path: p}
		}
	}
	out := make([]Plugin, 0, len(found))
	for _, p := range found {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// validDriverName reports whether name can be a driver name: 1–64 characters
// of a–z 0–9 _ - starting with a letter or digit (so "berth-driver-NAME~" and
// editor backups are not mistaken for drivers).
func validDriverName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		case (r == '-' || r == '_') && i > 0:
		default:
			return false
		}
	}
	return true
}

// FindPlugin returns the executable that serves the third-party driver name.
//
// plugin is the driver block's plugin key: when it contains a "/" it is the
// path itself (it should be absolute; the registry makes a relative one
// absolute against the config file's directory); otherwise it is a file name
// searched in dirs. When plugin is "", the file PluginFile(name) is searched.
// The first directory of dirs that has the file wins; the file is returned
// even when it is not executable (Launch then says so).
//
// Errors wrap backend.ErrNotFound and name every directory searched and the
// ways to fix it.
func FindPlugin(name, plugin string, dirs []string) (string, error) {
	if strings.Contains(plugin, "/") {
		if _, err := os.Stat(plugin); err != nil {
			return "", backend.Errorf(backend.ErrNotFound, "driver %q: plugin %s: %w; fix the plugin path in driver %q {} or install the driver there", name, plugin, errors.Unwrap(err), name)
		}
		return plugin, nil
	}
	file := plugin
	if file == "" {
		file = PluginFile(name)
	}
	for _, dir := range dirs {
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	where := "no plugin directories"
	if len(dirs) > 0 {
		where = strings.Join(dirs, ", ")
	}
	return "", backend.Errorf(backend.ErrNotFound,
		"driver %q: no executable %s in the plugin search path (%s); install it in one of those directories, add its directory to $%s or plugin_dirs, or set plugin = \"/path/to/%s\" in driver %q {}",
		name, file, where, EnvPluginPath, file, name)
}

// FileSHA256 returns the lowercase hex SHA-256 of the file at path.
func FileSHA256(path string) (string, error) { return filehash.Sum(path, "") }

// CachedFileSHA256 is FileSHA256 with a cache in cacheDir ("" means none): the sum
// is stored under a key made of the file's device, inode, size, mtime and ctime (the
// one hash cache of internal/filehash, which the agent's install uses too). Any
// write to the file, or a replacement, changes the ctime, which no user can set
// back, so a cached sum is never stale. Cache write failures are ignored.
func CachedFileSHA256(path, cacheDir string) (string, error) { return filehash.Sum(path, cacheDir) }

// VerifySHA256 checks that the file at path has the SHA-256 want (hex, case
// ignored), its sum cached in cacheDir as CachedFileSHA256 does ("" means none). A
// mismatch wraps backend.ErrInvalid and shows both sums and what to do; a file that
// cannot be read wraps backend.ErrInvalid too.
func VerifySHA256(path, want, cacheDir string) error {
	got, err := CachedFileSHA256(path, cacheDir)
	if err != nil {
		return backend.Errorf(backend.ErrInvalid, "driver plugin %s: cannot check its sha256: %w", path, err)
	}
	want = strings.ToLower(strings.TrimSpace(want))
	if got != want {
		return backend.Errorf(backend.ErrInvalid,
			"driver plugin %s: sha256 mismatch, refusing to start it: the file has %s, the config pins %s; if you installed a new build on purpose, set sha256 = %q in its driver block, otherwise reinstall the pinned build",
			path, got, want, got)
	}
	return nil
}

// ValidSHA256 reports whether s is 64 hex digits (either case), the form of a
// sha256 pin.
func ValidSHA256(s string) bool { return filehash.Valid(s) }
