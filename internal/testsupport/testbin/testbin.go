// Package testbin builds the static berth binary that tests use as the agent and as the
// plugin of the local driver, and beside it the executables of the drivers that are
// not compiled into berth (berth-driver-docker, berth-driver-containerd), where berth
// looks for them first. It builds once per test process, with CGO_ENABLED=0 so the
// binaries can run inside sandboxes that have their own root filesystem.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/berth-sh/berth/backends/catalog"
)

var (
	once sync.Once
	path string
	err  error
	dir  string
)

// ModuleRoot returns the repository root (the directory holding go.mod).
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// Packages are the main packages Berth builds into one directory: berth (the thin
// front), berth-cli (the full command line, the agent and the local driver's
// plugin), the HTTP API's server berth-serve, the stand-alone agent berth-agent, and
// the executables of the built-in drivers that have their own (catalog.Builtins).
func Packages() []string {
	pkgs := []string{"./cmd/berth", "./cmd/berth-cli", "./cmd/berth-serve", "./cmd/berth-agent"}
	for _, b := range catalog.Builtins {
		if b.Executable != "" {
			pkgs = append(pkgs, "./cmd/"+b.Executable)
		}
	}
	return pkgs
}

// Berth returns the path of a static berth binary (the thin front, as users run it)
// built from this checkout, with berth-cli, berth-serve and the built-in drivers'
// executables beside it, building them on first use (one go build).
// Errors name the failing go build with its output.
func Berth() (string, error) {
	once.Do(func() {
		dir, err = os.MkdirTemp("", "berth-testbin-")
		if err != nil {
			return
		}
		cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, Packages()...)...)
		cmd.Dir = ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, e := cmd.CombinedOutput(); e != nil {
			err = fmt.Errorf("building static berth and its driver executables: %v\n%s", e, b)
			return
		}
		path = filepath.Join(dir, "berth")
	})
	return path, err
}

// DriverCommand returns the command that serves the built-in driver name as a
// plugin, as berth-cli (built by Berth) runs it: catalog.BuiltinDriver.Command with no
// plugin dirs, for backends.LaunchOptions.Path and Args. It fails t when berth cannot
// be built or name is no built-in driver.
func DriverCommand(t testing.TB, name string) (string, []string) {
	t.Helper()
	bin, err := Berth()
	if err != nil {
		t.Fatal(err)
	}
	b, ok := catalog.LookupBuiltin(name)
	if !ok {
		t.Fatalf("no built-in driver %q", name)
	}
	p, args, err := b.Command(CLI(bin), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, args
}

// Cleanup removes the built binaries; call it from TestMain after m.Run.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// Main is a TestMain body for packages whose tests need the binaries: it builds berth
// and the executables beside it (Packages), stores berth's path (the front, Berth)
// in *bin, runs the tests and removes the binaries. It returns the exit code for
// os.Exit; a failed build prints the go build output and returns 1.
func Main(m *testing.M, bin *string) int {
	return main(m, bin, func(front string) string { return front })
}

// MainCLI is Main storing the path of berth-cli instead (CLI): the berth binary of
// package registry (registry.WithBerthBinary), the agent and the local driver's
// plugin, for the packages whose tests use berth in those roles.
func MainCLI(m *testing.M, bin *string) int { return main(m, bin, CLI) }

func main(m *testing.M, bin *string, pick func(front string) string) int {
	defer Cleanup()
	path, err := Berth()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*bin = pick(path)
	return m.Run()
}

// CLI returns the berth-cli beside path (a berth front or any executable Berth
// built): berth's full command line, the agent and the local driver's plugin.
func CLI(path string) string { return filepath.Join(filepath.Dir(path), "berth-cli") }

// Front returns the berth front beside path (berth-cli or any executable Berth
// built): the berth that users run.
func Front(path string) string { return filepath.Join(filepath.Dir(path), "berth") }
