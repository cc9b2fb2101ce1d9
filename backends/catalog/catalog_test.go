package catalog

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
)

func TestBuiltinCatalog(t *testing.T) {
	if got := BuiltinNames(); !slices.Equal(got, []string{"local", "docker", "containerd", "kubernetes"}) {
		t.Errorf("BuiltinNames = %v", got)
	}
	if _, ok := LookupBuiltin("nope"); ok {
		t.Error("LookupBuiltin(nope) found one")
	}
	local, ok := LookupBuiltin("local")
	if !ok || local.Executable != "" {
		t.Fatalf("local = %+v, %v; want served by berth", local, ok)
	}
	path, args, err := local.Command("/usr/bin/berth", []string{"/nowhere"})
	if err != nil || path != "/usr/bin/berth" || strings.Join(args, " ") != "driver serve local" {
		t.Errorf("local.Command = %s %v %v", path, args, err)
	}
	for _, name := range []string{"docker", "containerd", "kubernetes"} {
		if b, _ := LookupBuiltin(name); b.Executable != "berth-driver-"+name {
			t.Errorf("%s = %+v, want its own executable berth-driver-%s", name, b, name)
		}
	}
}

// touchExe makes an empty executable file dir/name.
func touchExe(t *testing.T, dir, name string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// A driver with its own executable is looked for beside berth first (the build that
// ships with it), then in $BERTH_PLUGIN_PATH and plugin_dirs; found nowhere, the
// error says what to build and where.
func TestBuiltinExecutableSearch(t *testing.T) {
	root := t.TempDir()
	bin := filepath.Join(root, "bin", "berth")
	envDir, cfgDir := filepath.Join(root, "env"), filepath.Join(root, "cfg")
	docker, _ := LookupBuiltin("docker")
	t.Setenv(EnvPluginPath, envDir)

	_, _, err := docker.Command(bin, []string{cfgDir})
	if !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("none anywhere: %v, want ErrNotFound", err)
	}
	for _, w := range []string{
		"the docker driver is its own executable, berth-driver-docker",
		"beside " + bin,
		"[" + envDir + " " + cfgDir + "]",
		"CGO_ENABLED=0 go build -o " + filepath.Join(root, "bin", "berth-driver-docker") + " ./cmd/berth-driver-docker",
		"go install github.com/berth-sh/berth/cmd/...",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error does not say %q: %v", w, err)
		}
	}

	inCfg := touchExe(t, cfgDir, "berth-driver-docker")
	if p, args, err := docker.Command(bin, []string{cfgDir}); err != nil || p != inCfg || len(args) != 0 {
		t.Errorf("in plugin_dirs: %s %v %v, want %s", p, args, err, inCfg)
	}
	inEnv := touchExe(t, envDir, "berth-driver-docker")
	if p, _, err := docker.Command(bin, []string{cfgDir}); err != nil || p != inEnv {
		t.Errorf("in $BERTH_PLUGIN_PATH too: %s %v, want %s (searched before plugin_dirs)", p, err, inEnv)
	}
	beside := touchExe(t, filepath.Dir(bin), "berth-driver-docker")
	if p, _, err := docker.Command(bin, []string{cfgDir}); err != nil || p != beside {
		t.Errorf("beside berth too: %s %v, want %s (searched first)", p, err, beside)
	}
	t.Setenv(EnvPluginPath, "")
	if _, _, err := docker.Command("", nil); err == nil || !strings.Contains(err.Error(), "beside berth") {
		t.Errorf("no berth binary: %v", err)
	}
}
