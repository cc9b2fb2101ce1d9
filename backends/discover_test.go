package backends

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/backends/catalog"
	"github.com/berth-sh/berth/internal/testsupport/testwait"
)

func writeExec(t *testing.T, path, content string, mode os.FileMode) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSearchPathOrder(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	t.Setenv(catalog.EnvPluginPath, a+"::relative/dir:"+b)
	bin := filepath.Join(t.TempDir(), "berth")
	got := catalog.SearchPath([]string{"/etc/berth/plugins", a}, bin)
	want := []string{a, b, "/etc/berth/plugins", filepath.Dir(bin)}
	if !slices.Equal(got, want) {
		t.Errorf("SearchPath = %v, want %v (env first, relative and empty entries dropped, no duplicates, berth's dir last)", got, want)
	}
	t.Setenv(catalog.EnvPluginPath, "")
	if got := catalog.SearchPath(nil, ""); len(got) != 0 {
		t.Errorf("SearchPath with nothing = %v", got)
	}
}

func TestDiscoverAndFind(t *testing.T) {
	first, second := t.TempDir(), t.TempDir()
	writeExec(t, filepath.Join(first, "berth-driver-alpha"), "#!/bin/sh\n", 0o755)
	writeExec(t, filepath.Join(second, "berth-driver-alpha"), "#!/bin/sh\n", 0o755)
	writeExec(t, filepath.Join(second, "berth-driver-beta"), "#!/bin/sh\n", 0o644) // listed: Launch explains
	writeExec(t, filepath.Join(second, "berth-driver-Bad~"), "", 0o755)
	writeExec(t, filepath.Join(second, "other"), "", 0o755)
	if err := os.Mkdir(filepath.Join(second, "berth-driver-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	dirs := []string{filepath.Join(t.TempDir(), "missing"), first, second}
	got := catalog.Discover(dirs)
	want := []catalog.Plugin{{Name: "alpha", Path: filepath.Join(first, "berth-driver-alpha")}, {Name: "beta", Path: filepath.Join(second, "berth-driver-beta")}}
	if !slices.Equal(got, want) {
		t.Errorf("Discover = %v, want %v", got, want)
	}

	if p, err := catalog.FindPlugin("alpha", "", dirs); err != nil || p != want[0].Path {
		t.Errorf("catalog.FindPlugin(alpha) = %q, %v; want the first directory's", p, err)
	}
	if p, err := catalog.FindPlugin("x", "berth-driver-beta", dirs); err != nil || p != want[1].Path {
		t.Errorf("FindPlugin by file name = %q, %v", p, err)
	}
	abs := writeExec(t, filepath.Join(t.TempDir(), "custom"), "#!/bin/sh\n", 0o755)
	if p, err := catalog.FindPlugin("x", abs, nil); err != nil || p != abs {
		t.Errorf("FindPlugin by path = %q, %v", p, err)
	}
	_, err := catalog.FindPlugin("gamma", "", dirs)
	if !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), "berth-driver-gamma") ||
		!strings.Contains(err.Error(), first) || !strings.Contains(err.Error(), catalog.EnvPluginPath) || !strings.Contains(err.Error(), "plugin_dirs") {
		t.Errorf("catalog.FindPlugin(gamma): %v", err)
	}
	_, err = catalog.FindPlugin("x", filepath.Join(first, "nope"), nil)
	if !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), filepath.Join(first, "nope")) {
		t.Errorf("catalog.FindPlugin(missing path): %v", err)
	}
}

func TestChecksumPin(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	p := writeExec(t, filepath.Join(t.TempDir(), "berth-driver-pinned"), "#!/bin/sh\ntouch "+marker+"\nsleep 300\n", 0o755)
	sum, err := catalog.FileSHA256(p)
	if err != nil || !catalog.ValidSHA256(sum) {
		t.Fatalf("FileSHA256: %q %v", sum, err)
	}
	if err := catalog.VerifySHA256(p, strings.ToUpper(sum), ""); err != nil {
		t.Errorf("VerifySHA256 with the right sum (upper case): %v", err)
	}
	wrong := strings.Repeat("0", 64)
	_, err = Launch(ctxT(t), LaunchOptions{Path: p, SHA256: wrong})
	if !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("Launch with a wrong pin: %v, want ErrInvalid", err)
	}
	msg := err.Error()
	for _, w := range []string{p, sum, wrong, "sha256 = \"" + sum + "\""} {
		if !strings.Contains(msg, w) {
			t.Errorf("error lacks %q: %s", w, msg)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the plugin ran although its checksum did not match")
	}
	if catalog.ValidSHA256("abc") || catalog.ValidSHA256(strings.Repeat("g", 64)) {
		t.Error("ValidSHA256 accepts junk")
	}
}

func TestDescribe(t *testing.T) {
	desc, err := Describe(ctxT(t), pluginBin)
	if err != nil {
		t.Fatalf("Describe: %v", err)
	}
	if desc.Name != "test" || !slices.Equal(desc.ProtocolVersions, []int{ProtocolVersion}) || len(desc.ConfigSchema) != 1 || desc.ConfigSchema[0].Name != "root" {
		t.Errorf("Describe = %+v", desc)
	}

	// Not a berth driver: a program that ignores "describe" and prints no JSON.
	junk := writeExec(t, filepath.Join(t.TempDir(), "berth-driver-junk"), "#!/bin/sh\necho not json\n", 0o755)
	if _, err := Describe(ctxT(t), junk); !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), junk) || !strings.Contains(err.Error(), "not a JSON description") {
		t.Errorf("Describe(junk): %v", err)
	}
	failing := writeExec(t, filepath.Join(t.TempDir(), "berth-driver-fail"), "#!/bin/sh\necho broken install >&2\nexit 4\n", 0o755)
	if _, err := Describe(ctxT(t), failing); err == nil || !strings.Contains(err.Error(), "broken install") || !strings.Contains(err.Error(), "exit status 4") {
		t.Errorf("Describe(failing): %v", err)
	}
	plain := writeExec(t, filepath.Join(t.TempDir(), "berth-driver-plain"), "", 0o644)
	if _, err := Describe(ctxT(t), plain); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "chmod +x") {
		t.Errorf("Describe(not executable): %v", err)
	}
}

// TestDescribeHangKilled: a plugin that never answers describe is killed with its
// children when the context ends.
func TestDescribeHangKilled(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	p := writeExec(t, filepath.Join(t.TempDir(), "berth-driver-hang"), "#!/bin/sh\necho $$ > "+pidfile+"\nsleep 300 &\necho $! >> "+pidfile+"\nwait\n", 0o755)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	errCh := make(chan error, 1)
	go func() {
		_, err := Describe(ctx, p)
		errCh <- err
	}()
	// The context ends once the script and its child run (not after a fixed time
	// that a slow start could outlast).
	testwait.Until(t, "the hanging describe to start its child", func() bool {
		b, _ := os.ReadFile(pidfile)
		return len(strings.Fields(string(b))) == 2
	})
	cancel()
	if err := <-errCh; err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("Describe(hang): %v", err)
	}
	waitGone(t, readPids(t, pidfile)...)
}

// A plugin built against protocol 1 (exec through the driver; before the host
// reached agents itself) is refused with both version lists, not half used.
func TestProtocolOneRefused(t *testing.T) {
	_, err := Launch(ctxT(t), LaunchOptions{Path: pluginBin, Env: []string{"BERTH_TESTPLUGIN_MODE=future", "BERTH_TESTPLUGIN_VERSIONS=1"}})
	if err == nil || !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "[1]") || !strings.Contains(err.Error(), "[2]") {
		t.Fatalf("protocol-1 plugin: %v, want a refusal naming [1] and [2]", err)
	}
}

func TestProtocolMismatchRefused(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pids")
	_, err := Launch(ctxT(t), LaunchOptions{Path: pluginBin, Env: []string{"BERTH_TESTPLUGIN_MODE=future", "BERTH_TESTPLUGIN_PIDFILE=" + pidfile}})
	if err == nil {
		t.Fatal("Launch of a plugin that speaks only protocol 98 and 99 succeeded")
	}
	t.Log(err)
	msg := err.Error()
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(msg, pluginBin) || !strings.Contains(msg, "[98 99]") || !strings.Contains(msg, "[2]") {
		t.Errorf("error does not name the file and both version lists: %v", err)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("want one line: %q", msg)
	}
	if pids := readPids(t, pidfile); len(pids) != 1 || alive(pids[0]) {
		t.Errorf("plugin %v left running", pids)
	}
	if got := HostProtocolVersions(); !slices.Equal(got, []int{ProtocolVersion}) {
		t.Errorf("HostProtocolVersions = %v", got)
	}
	if v, ok := CommonVersion([]int{1, 2}, []int{2, 3}); !ok || v != 2 {
		t.Errorf("CommonVersion = %d %v", v, ok)
	}
	if _, ok := CommonVersion([]int{1}, []int{98, 99}); ok {
		t.Error("CommonVersion found one in disjoint lists")
	}
}

func TestMainArgs(t *testing.T) {
	var out, errb strings.Builder
	if code := mainArgs(stubDriver{}, []string{"bogus"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "describe") || out.Len() != 0 {
		t.Errorf("bogus argument: code %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := mainArgs(stubDriver{}, []string{"describe"}, &out, &errb); code != 0 || !strings.Contains(out.String(), `"name": "stub"`) || !strings.Contains(out.String(), `"config_schema": []`) {
		t.Errorf("describe: code %d, stdout %q", code, out.String())
	}
}

// stubDriver is a TerminalBackend with only Info.
type stubDriver struct{ backend.TerminalBackend }

func (stubDriver) Info(context.Context) (backend.Info, error) {
	return backend.Info{Name: "stub", Version: "1"}, nil
}
func (stubDriver) Close() error { return nil }

// The sum cache is keyed by the file's identity including its ctime: an in-place
// rewrite of the same size with its mtime set back is still noticed.
func TestCachedFileSHA256(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	p := writeExec(t, filepath.Join(t.TempDir(), "berth-driver-c"), "#!/bin/sh\necho one\n", 0o755)
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	first, err := catalog.CachedFileSHA256(p, cache)
	if want, _ := catalog.FileSHA256(p); err != nil || first != want {
		t.Fatalf("CachedFileSHA256 = %q %v, want %q", first, err, want)
	}
	if ents, _ := os.ReadDir(cache); len(ents) != 1 {
		t.Fatalf("cache holds %d entries, want 1", len(ents))
	}
	if again, err := catalog.CachedFileSHA256(p, cache); err != nil || again != first {
		t.Errorf("second call: %q %v", again, err)
	}
	// Same size, mtime restored: only the ctime tells.
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho two\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	changed, err := catalog.CachedFileSHA256(p, cache)
	if want, _ := catalog.FileSHA256(p); err != nil || changed != want || changed == first {
		t.Errorf("after an in-place rewrite: %q %v, want the new sum %q", changed, err, want)
	}
	if err := catalog.VerifySHA256(p, first, ""); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("VerifySHA256 with the old pin after the rewrite: %v", err)
	}
}
