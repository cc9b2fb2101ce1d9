// Package testbin builds the static berth binary that tests use as the agent and as the
// plugin of built-in drivers. It builds once per test process, with CGO_ENABLED=0 so the
// binary can run inside sandboxes that have their own root filesystem.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
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
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Berth returns the path of a static berth binary built from this checkout, building it
// on first use. Errors name the failing go build with its output.
func Berth() (string, error) {
	once.Do(func() {
		dir, err = os.MkdirTemp("", "berth-testbin-")
		if err != nil {
			return
		}
		out := filepath.Join(dir, "berth")
		cmd := exec.Command("go", "build", "-o", out, "./cmd/berth")
		cmd.Dir = ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, e := cmd.CombinedOutput(); e != nil {
			err = fmt.Errorf("building static berth: %v\n%s", e, b)
			return
		}
		path = out
	})
	return path, err
}

// Cleanup removes the built binary; call it from TestMain after m.Run.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// Main is a TestMain body for packages whose tests need the binary: it builds berth,
// stores its path in *bin, runs the tests and removes the binary. It returns the exit
// code for os.Exit; a failed build prints the go build output and returns 1.
func Main(m *testing.M, bin *string) int {
	defer Cleanup()
	path, err := Berth()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*bin = path
	return m.Run()
}
