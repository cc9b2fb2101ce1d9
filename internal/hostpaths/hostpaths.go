// Package hostpaths knows the host paths that belong to berth and that no bind mount
// may expose to a sandbox: berth's state dirs, which hold the agent socket of every
// sandbox (connect(2) works through a read-only mount, and the local driver's agents
// run on the host), and the directories where berth's driver plugins listen (whoever
// connects to a plugin can create sandboxes with any mount, i.e. is root on the host).
//
// The registry applies Check to every mount of a rule before any driver sees it, for
// every driver; the built-in container drivers apply it again as defence (see
// containerutil.CheckMount). It is internal: third-party drivers get the registry's
// check, which runs before their Create.
//
// Known reads the host's environment and /etc/passwd: what it finds describes the
// host (whose state dirs exist, where plugins listen), not a setting of the berth
// that asks, so package registry, which reads no environment variable, leaves that
// lookup to this package.
package hostpaths

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strings"
)

// MarkerFile is the name of the file, directly inside a state dir, that marks it as a
// berth state dir (written by the registry when it first uses the dir; see WriteMarker).
// Its content is MarkerContent; only its presence as a regular file counts.
const MarkerFile = ".berth-state-dir"

// MarkerContent is what WriteMarker writes into MarkerFile, for whoever finds it.
const MarkerContent = "This directory is a berth state dir: it holds the agent socket of every sandbox of\n" +
	"this installation. berth refuses bind mounts that are, contain or lie inside it\n" +
	"(see docs/security.md). Do not delete this file while the state dir is in use.\n"

// legacyStoreFile and legacyLocksDir mark the state dirs made before MarkerFile
// existed: the registry's store file next to its lock dir.
const (
	legacyStoreFile = "state.db"
	legacyLocksDir  = "locks"
)

// WriteMarker creates dir/MarkerFile (mode 0644) unless it exists. dir must exist.
// Errors: the file cannot be written.
func WriteMarker(dir string) error {
	p := filepath.Join(dir, MarkerFile)
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = f.WriteString(MarkerContent)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// IsStateDir reports whether dir looks like a berth state dir: it holds MarkerFile as
// a regular file, or (state dirs of earlier versions) the store file state.db next to a
// locks directory. It costs at most three lstat calls and follows no link inside dir.
func IsStateDir(dir string) bool {
	if fi, err := os.Lstat(filepath.Join(dir, MarkerFile)); err == nil && fi.Mode().IsRegular() {
		return true
	}
	fi, err := os.Lstat(filepath.Join(dir, legacyStoreFile))
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	fi, err = os.Lstat(filepath.Join(dir, legacyLocksDir))
	return err == nil && fi.IsDir()
}

// Dir is a host directory that mounts must not expose.
type Dir struct {
	// Path is the directory, absolute.
	Path string
	// What names it in errors: "berth's state dir", "the default berth state dir of
	// user alice", "the go-plugin socket dir".
	What string
	// Grants says what a sandbox that can reach the directory can do, for errors.
	Grants string
	// Prefixes, when set, narrows what is protected inside Path to its entries whose
	// names start with one of them (the sockets and socket dirs that go-plugin and
	// berth create in the temporary directory); Path itself and its ancestors are
	// still protected, as they contain those entries. Empty protects all of Path.
	Prefixes []string
}

// What a sandbox that reaches a state dir or a plugin socket can do.
const (
	stateDirGrants = "that directory holds the agent socket of every sandbox of that berth installation, and connecting works through a read-only mount: " +
		"any process in the sandbox could run commands in every one of those sandboxes and, through the local driver's agents, on the host as the user who runs berth"
	pluginGrants = "berth's driver plugins listen on unix sockets there, and whoever connects to one can create sandboxes with any mount, i.e. act as root on the host"
)

// Known returns the berth directories this process can name: stateDirs (the state
// dir in use; empty strings are skipped), $BERTH_STATE_DIR, $XDG_STATE_HOME/berth and
// ~/.local/state/berth of the invoking user ($HOME, and SUDO_USER's home under sudo)
// and of root, the default state dir of every other user in /etc/passwd whose one
// exists, the go-plugin socket dir ($PLUGIN_UNIX_SOCKET_DIR when set) and the
// temporary directories (os.TempDir() and /tmp, entries named plugin* or berth-*)
// where go-plugin and berth put sockets. It reads /etc/passwd and stats a few paths;
// it walks no tree.
func Known(stateDirs ...string) []Dir {
	var out []Dir
	seen := map[string]bool{}
	add := func(d Dir) {
		if !filepath.IsAbs(d.Path) {
			return
		}
		d.Path = filepath.Clean(d.Path)
		key := d.Path + "\x00" + strings.Join(d.Prefixes, "\x00")
		if seen[key] {
			return
		}
		seen[key] = true
		out = append(out, d)
	}
	state := func(p, what string) { add(Dir{Path: p, What: what, Grants: stateDirGrants}) }
	for _, s := range stateDirs {
		if s != "" {
			state(s, "berth's state dir")
		}
	}
	state(os.Getenv("BERTH_STATE_DIR"), "the state dir named by $BERTH_STATE_DIR")
	state(filepath.Join(os.Getenv("XDG_STATE_HOME"), "berth"), "the default berth state dir ($XDG_STATE_HOME/berth)")
	if h, err := os.UserHomeDir(); err == nil {
		state(defaultIn(h), "the default berth state dir of the invoking user")
	}
	if name := os.Getenv("SUDO_USER"); name != "" {
		if u, err := user.Lookup(name); err == nil {
			state(defaultIn(u.HomeDir), "the default berth state dir of user "+name+" (SUDO_USER)")
		}
	}
	rootHome := "/root"
	if u, err := user.LookupId("0"); err == nil && filepath.IsAbs(u.HomeDir) {
		rootHome = u.HomeDir
	}
	state(defaultIn(rootHome), "the default berth state dir of root")
	for name, home := range passwdHomes() {
		if p := defaultIn(home); exists(p) {
			state(p, "the default berth state dir of user "+name)
		}
	}
	if p := os.Getenv("PLUGIN_UNIX_SOCKET_DIR"); p != "" {
		add(Dir{Path: p, What: "the go-plugin socket dir ($PLUGIN_UNIX_SOCKET_DIR)", Grants: pluginGrants})
	}
	for _, tmp := range []string{os.TempDir(), "/tmp"} {
		add(Dir{Path: tmp, What: "the temporary directory where berth's driver plugins put their sockets (plugin*, berth-*)", Grants: pluginGrants, Prefixes: []string{"plugin", "berth-"}})
	}
	return out
}

// defaultIn is the default state dir under the home directory home.
func defaultIn(home string) string {
	if !filepath.IsAbs(home) {
		return ""
	}
	return filepath.Join(home, ".local", "state", "berth")
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return p != "" && err == nil
}

// passwdHomes returns user name → home directory from /etc/passwd (nil when it
// cannot be read).
func passwdHomes() map[string]string {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Split(s.Text(), ":")
		if len(fields) >= 6 && fields[0] != "" && !strings.HasPrefix(fields[0], "#") && filepath.IsAbs(fields[5]) {
			out[fields[0]] = fields[5]
		}
	}
	return out
}

// Check refuses the mount source src when it is, contains or lies inside one of dirs
// (both sides compared as written and with links resolved), or when it, one of its
// ancestors or one of its direct subdirectories (among its first MaxScan entries) is
// recognisably a berth state dir (IsStateDir). A source that does not exist is compared as written. The error
// (plain, for the caller to wrap with backend.ErrInvalid) names the source, the
// directory and how they relate, says what a sandbox could do through it, and that
// allow_host_paths = true in the rule grants exactly that.
func Check(src string, dirs []Dir) error {
	if !filepath.IsAbs(src) {
		return nil // the caller refuses relative sources
	}
	srcs := resolved(filepath.Clean(src))
	for _, d := range dirs {
		for _, s := range srcs {
			for _, p := range resolved(d.Path) {
				if rel := relation(s, p, d.Prefixes); rel != "" {
					return refusal(src, s, rel, d)
				}
			}
		}
	}
	for _, s := range srcs {
		for a := s; ; a = filepath.Dir(a) {
			if IsStateDir(a) {
				rel := "lies inside"
				if a == s {
					rel = "is"
				}
				return refusal(src, s, rel, Dir{Path: a, What: "a berth state dir (it holds " + MarkerFile + " or a berth store)", Grants: stateDirGrants})
			}
			if a == "/" {
				break
			}
		}
		for _, e := range firstEntries(s, MaxScan) {
			if c := filepath.Join(s, e.Name()); e.IsDir() && IsStateDir(c) {
				return refusal(src, s, "contains", Dir{Path: c, What: "a berth state dir (it holds " + MarkerFile + " or a berth store)", Grants: stateDirGrants})
			}
		}
	}
	return nil
}

// MaxScan is how many entries of a mount source Check looks at for a subdirectory
// that is a berth state dir; a larger directory's further entries are not looked at,
// so that a mount of a huge directory costs a bounded time at each create.
const MaxScan = 4096

// firstEntries returns up to n entries of the directory dir (none when it is no
// readable directory), in directory order.
func firstEntries(dir string, n int) []fs.DirEntry {
	f, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer f.Close()
	ents, _ := f.ReadDir(n)
	return ents
}

// relation says how the source s relates to the protected dir p: "is", "contains",
// "lies inside", or "" for none. With prefixes, only entries of p whose names start
// with one of them count as inside it.
func relation(s, p string, prefixes []string) string {
	switch {
	case s == p:
		return "is"
	case under(p, s):
		return "contains"
	case !under(s, p):
		return ""
	}
	rest := strings.TrimPrefix(strings.TrimPrefix(s, p), "/")
	if len(prefixes) == 0 {
		return "lies inside"
	}
	first, _, _ := strings.Cut(rest, "/")
	for _, pre := range prefixes {
		if strings.HasPrefix(first, pre) {
			return "lies inside"
		}
	}
	return ""
}

// under reports whether the clean absolute path a is b or lies inside it.
func under(a, b string) bool {
	return a == b || b == "/" || strings.HasPrefix(a, b+"/")
}

func refusal(src, resolvedSrc, rel string, d Dir) error {
	shown := src
	if resolvedSrc != filepath.Clean(src) {
		shown = fmt.Sprintf("%s (%s)", src, resolvedSrc)
	}
	return fmt.Errorf("mount source %s %s %s %s: %s; mount a directory that is outside it and does not contain it, or set allow_host_paths = true in the rule to grant exactly that access", shown, rel, d.What, d.Path, d.Grants)
}

// resolved returns path and, when it differs, path with links resolved.
func resolved(path string) []string {
	out := []string{path}
	if r, err := filepath.EvalSymlinks(path); err == nil && r != path {
		out = append(out, r)
	}
	return out
}
