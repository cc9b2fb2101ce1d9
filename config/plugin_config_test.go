package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
)

func TestDriverBlockHostKeys(t *testing.T) {
	sum := strings.Repeat("AB", 32)
	src := `scope "*" {
  driver = "bwrap"
}
driver "bwrap" {
  plugin        = "plugins/berth-driver-bwrap"
  sha256        = "` + sum + `"
  start_timeout = "3s"
  ro_binds      = ["/opt"]
}
driver "other" {
  plugin = "berth-driver-other2"
}
`
	cfg, err := Parse([]byte(src), "/etc/berth/config.hcl", WithPluginFinder(nil))
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Drivers["bwrap"]
	if b == nil || b.Plugin != "/etc/berth/plugins/berth-driver-bwrap" || b.SHA256 != strings.ToLower(sum) || b.StartTimeout != 3*time.Second {
		t.Fatalf("bwrap block: %+v", b)
	}
	if o := cfg.Drivers["other"]; o == nil || o.Plugin != "berth-driver-other2" {
		t.Errorf("other block: %+v", o)
	}
	if !slices.Contains(cfg.KnownDrivers, "bwrap") || !slices.Contains(cfg.KnownDrivers, "other") {
		t.Errorf("drivers with a plugin key are not known: %v", cfg.KnownDrivers)
	}
	// The driver's own keys are decoded against its schema without the host keys.
	js, err := cfg.DriverConfig("bwrap", []backend.ConfigField{{Name: "ro_binds", Type: "list(string)"}})
	if err != nil || string(js) != `{"ro_binds":["/opt"]}` {
		t.Errorf("DriverConfig = %s, %v", js, err)
	}
	_, err = cfg.DriverConfig("bwrap", nil)
	if err == nil || !strings.Contains(err.Error(), "config.hcl:8:3") || !strings.Contains(err.Error(), `no setting "ro_binds"`) {
		t.Errorf("a key the schema lacks: %v", err)
	}
}

func TestDriverBlockHostKeysBad(t *testing.T) {
	for _, c := range []struct{ name, src, want string }{
		{"sha256 not hex", "driver \"x\" {\n  plugin = \"/p\"\n  sha256 = \"xyz\"\n}\n", `config.hcl:3:12: error: Invalid sha256: sha256 must be 64 hex digits`},
		{"plugin on a built-in", "driver \"local\" {\n  plugin = \"/p\"\n}\n", `config.hcl:2:3: error: Plugin for a built-in driver`},
		{"sha256 on a built-in", "driver \"local\" {\n  sha256 = \"" + strings.Repeat("0", 64) + "\"\n}\n", `config.hcl:2:3: error: Checksum for a built-in driver`},
		{"bad start_timeout", "driver \"x\" {\n  plugin = \"/p\"\n  start_timeout = \"soon\"\n}\n", `config.hcl:3:19: error: Invalid duration`},
		{"unknown third-party", "scope \"*\" {\n  driver = \"nope\"\n}\n", `berth-driver-nope in $BERTH_PLUGIN_PATH, plugin_dirs or beside berth`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.src), "/etc/berth/config.hcl", WithPluginFinder(nil))
			if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

// A berth-driver-NAME in plugin_dirs makes NAME usable in scope rules, through
// DiscoverPlugins, which also searches $BERTH_PLUGIN_PATH and the berth binary's
// directory; without a finder (the default) it is not known.
func TestDiscoveredDriversKnown(t *testing.T) {
	dir, envDir, binDir := t.TempDir(), t.TempDir(), t.TempDir()
	for _, p := range []string{filepath.Join(dir, "berth-driver-found"), filepath.Join(envDir, "berth-driver-fromenv"),
		filepath.Join(binDir, "berth-driver-besides"), filepath.Join(binDir, "berth-driver-local")} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("BERTH_PLUGIN_PATH", envDir)
	find := WithPluginFinder(DiscoverPlugins(filepath.Join(binDir, "berth")))
	src := "plugin_dirs = [\"" + dir + "\"]\nscope \"a*\" {\n  driver = \"found\"\n}\nscope \"*\" {\n  driver = \"fromenv\"\n}\n"
	cfg, err := Parse([]byte(src), "/etc/berth/config.hcl", find)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rules[0].Driver != "found" || cfg.Rules[1].Driver != "fromenv" {
		t.Errorf("rules: %+v", cfg.Rules)
	}
	want := []string{"besides", "containerd", "docker", "found", "fromenv", "kubernetes", "local"}
	if !slices.Equal(cfg.KnownDrivers, want) {
		t.Errorf("KnownDrivers = %v, want %v (sorted, a built-in name found as a plugin counted once)", cfg.KnownDrivers, want)
	}
	// Without discovery the same config fails, naming the driver.
	if _, err := Parse([]byte(src), "/etc/berth/config.hcl"); err == nil || !strings.Contains(err.Error(), `driver "found" is not known`) {
		t.Errorf("without discovery: %v", err)
	}
	// Default finds with no plugin_dirs.
	if got := Default(WithKnownDrivers("local"), find).KnownDrivers; !slices.Equal(got, []string{"besides", "fromenv", "local"}) {
		t.Errorf("Default with the finder: KnownDrivers = %v", got)
	}
	if got := Default().KnownDrivers; !slices.Equal(got, []string{"containerd", "docker", "kubernetes", "local"}) {
		t.Errorf("Default(): KnownDrivers = %v", got)
	}
}
