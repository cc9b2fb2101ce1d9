package catalog

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/berth-sh/berth/backend"
)

// ModulePath is the Go module that berth and its built-in drivers' executables
// are built from; a missing driver executable's error names it.
const ModulePath = "github.com/berth-sh/berth"

// BuiltinDriver is one driver that ships with berth, and how it is served out of
// process.
type BuiltinDriver struct {
	// Name is the driver's config name (driver = "NAME").
	Name string
	// Executable is the file name of the driver's own executable, PluginFile(Name)
	// ("berth-driver-docker"), built from ModulePath's cmd/ of that name; "" when
	// the berth binary serves the driver itself (`BINARY driver serve NAME`).
	Executable string
}

// Builtins are the drivers that ship with berth, by name: local is compiled into the
// berth binary, berth-cli (it links no runtime SDK, and `go run ./cmd/berth-cli`
// needs nothing else); docker, containerd and kubernetes are their own executables,
// so that the berth binary links neither the Docker SDK, the containerd client nor client-go
// and starts in a fraction of the time. The list is what config accepts as built-in driver names
// (BuiltinNames). Do not modify it.
var Builtins = []BuiltinDriver{
	{Name: "local"},
	{Name: "docker", Executable: PluginFile("docker")},
	{Name: "containerd", Executable: PluginFile("containerd")},
	{Name: "kubernetes", Executable: PluginFile("kubernetes")},
}

// LookupBuiltin returns the entry of Builtins called name, and whether there is one.
func LookupBuiltin(name string) (BuiltinDriver, bool) {
	for _, b := range Builtins {
		if b.Name == name {
			return b, true
		}
	}
	return BuiltinDriver{}, false
}

// BuiltinNames returns the names of Builtins, in their order (a new slice).
func BuiltinNames() []string {
	names := make([]string, len(Builtins))
	for i, b := range Builtins {
		names[i] = b.Name
	}
	return names
}

// Command returns the command that serves the driver out of process. For a driver
// that the berth binary serves it is berthBinary with the arguments "driver",
// "serve" and the name (berth's hidden sub-command). For one with its own
// executable it is that file, without arguments, looked for first beside
// berthBinary (the build that ships with this berth), then in the plugin search
// path (SearchPath(pluginDirs, ""): $BERTH_PLUGIN_PATH, then pluginDirs), as
// third-party drivers are. Pass path and args to Launch as LaunchOptions.Path and
// Args.
//
// Error: no executable found, wrapping backend.ErrNotFound; it names the file, every
// place searched, and the go build command that puts it beside berthBinary.
func (b BuiltinDriver) Command(berthBinary string, pluginDirs []string) (path string, args []string, err error) {
	if b.Executable == "" {
		return berthBinary, []string{"driver", "serve", b.Name}, nil
	}
	dir := ""
	if berthBinary != "" {
		if abs, err := filepath.Abs(berthBinary); err == nil {
			dir = filepath.Dir(abs)
		}
	}
	search := SearchPath(pluginDirs, "")
	dirs := search
	if dir != "" {
		dirs = append([]string{dir}, search...)
	}
	for _, d := range dirs {
		p := filepath.Join(d, b.Executable)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil, nil
		}
	}
	return "", nil, b.notFound(berthBinary, dir, search)
}

// notFound is Command's error for a driver executable found nowhere.
func (b BuiltinDriver) notFound(berthBinary, dir string, search []string) error {
	where := "[]"
	if len(search) > 0 {
		where = "[" + strings.Join(search, " ") + "]"
	}
	beside, target := "beside berth", "DIR/"+b.Executable
	if dir != "" {
		beside, target = "beside "+berthBinary, filepath.Join(dir, b.Executable)
	}
	return backend.Errorf(backend.ErrNotFound,
		"the %s driver is its own executable, %s, and none is %s nor in the plugin search path %s ($%s, plugin_dirs); build it: CGO_ENABLED=0 go build -o %s ./cmd/%s (or go install %s/cmd/...)",
		b.Name, b.Executable, beside, where, EnvPluginPath, target, b.Executable, ModulePath)
}

// linked holds the constructors registered with Register, by name.
var linked = struct {
	sync.RWMutex
	m map[string]func() backend.TerminalBackend
}{m: map[string]func() backend.TerminalBackend{}}

// Register makes a driver runnable in process under name, as database/sql.Register
// makes a database driver usable: each built-in driver's package (local, docker,
// containerd, kubernetes) calls it from its init, so a program that imports the
// package (import _ "github.com/berth-sh/berth/docker") can run that driver inside
// itself (Linked), and one that does not import it links none of its runtime's SDK.
// The berth binary imports only local; the others reach it as their own executables
// (Command). newFn returns a new, unconfigured driver whose Info reports name.
//
// Register panics when newFn is nil or name is already registered (two drivers
// under one name are a build mistake, as in database/sql).
func Register(name string, newFn func() backend.TerminalBackend) {
	if newFn == nil {
		panic("catalog: Register of driver " + name + " with a nil constructor")
	}
	linked.Lock()
	defer linked.Unlock()
	if _, dup := linked.m[name]; dup {
		panic("catalog: Register called twice for driver " + name)
	}
	linked.m[name] = newFn
}

// Linked returns the constructor registered under name (Register), and whether
// this program links that driver.
func Linked(name string) (func() backend.TerminalBackend, bool) {
	linked.RLock()
	defer linked.RUnlock()
	f, ok := linked.m[name]
	return f, ok
}

// LinkedNames returns the names of the drivers registered with Register, sorted (a
// new slice): the drivers this program can run in process.
func LinkedNames() []string {
	linked.RLock()
	defer linked.RUnlock()
	names := make([]string, 0, len(linked.m))
	for n := range linked.m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
