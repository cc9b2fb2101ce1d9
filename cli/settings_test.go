package cli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
)

// The settings' precedence: flags over BERTH_* environment over the config file over
// defaults (XDG paths), for the config file, the state dir and the log level.
func TestSettingsPrecedence(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fileA := write("a.hcl", "state_dir = \""+dir+"/from-a\"\nlog_level = \"info\"\nscope \"*\" {\n  env = { FROM = \"a\" }\n}\n")
	fileB := write("b.hcl", "state_dir = \""+dir+"/from-b\"\nlog_level = \"error\"\nscope \"*\" {\n  env = { FROM = \"b\" }\n}\n")
	xdgConfig := filepath.Join(dir, "xdg-config")
	os.MkdirAll(filepath.Join(xdgConfig, "berth"), 0o700)
	os.WriteFile(filepath.Join(xdgConfig, "berth", "config.hcl"), []byte("scope \"*\" {\n  env = { FROM = \"xdg\" }\n}\n"), 0o600)
	t.Setenv("XDG_CONFIG_HOME", xdgConfig)
	t.Setenv("XDG_STATE_HOME", filepath.Join(dir, "xdg-state"))
	t.Setenv(config.EnvConfig, "")
	t.Setenv(config.EnvStateDir, "")
	t.Setenv(config.EnvLog, "")
	t.Setenv(envClockOffset, "")

	type got struct {
		from, stateDir, path string
		level                hclog.Level
	}
	open := func(g *globals) (got, error) {
		t.Helper()
		g.log = &logSink{}
		r, err := g.open(context.Background())
		if err != nil {
			return got{}, err
		}
		defer r.Close()
		rule, _, _ := r.Config().Match("main")
		log, err := g.resolveLogger(r.Config())
		if err != nil {
			t.Fatal(err)
		}
		return got{rule.Env["FROM"], r.StateDir(), r.Config().Path, log.GetLevel()}, nil
	}
	check := func(what string, g *globals, want got) {
		t.Helper()
		if r, err := open(g); err != nil || r != want {
			t.Errorf("%s: %+v, %v; want %+v", what, r, err, want)
		}
	}
	check("defaults: the XDG config file and state dir", &globals{},
		got{"xdg", filepath.Join(dir, "xdg-state", "berth"), filepath.Join(xdgConfig, "berth", "config.hcl"), hclog.Warn})
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "empty"))
	check("no config file anywhere: config.Default", &globals{}, got{"", filepath.Join(dir, "xdg-state", "berth"), "", hclog.Warn})
	t.Setenv(config.EnvConfig, fileA)
	check("the config file beats the defaults", &globals{}, got{"a", dir + "/from-a", fileA, hclog.Info})
	t.Setenv(config.EnvStateDir, dir+"/from-env")
	t.Setenv(config.EnvLog, "debug")
	check("the environment beats the config file", &globals{}, got{"a", dir + "/from-env", fileA, hclog.Debug})
	check("flags beat the environment", &globals{configPath: fileB, stateDir: dir + "/from-flag", logLevel: "trace"},
		got{"b", dir + "/from-flag", fileB, hclog.Trace})

	// A named config file must exist; a bad level is refused, naming its source.
	for _, c := range []struct {
		what, env, level, want string
		g                      *globals
	}{
		{"missing --config", "", "", dir + "/missing.hcl does not exist", &globals{configPath: dir + "/missing.hcl"}},
		{"missing BERTH_CONFIG", dir + "/missing-env.hcl", "", "missing-env.hcl", &globals{}},
		{"bad BERTH_LOG", "", "loud", `BERTH_LOG "loud" is not a log level`, &globals{}},
		{"bad --log-level", "", "", `--log-level "loud" is not a log level`, &globals{logLevel: "loud"}},
	} {
		t.Setenv(config.EnvConfig, c.env)
		t.Setenv(config.EnvLog, c.level)
		if _, err := open(c.g); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid containing %q", c.what, err, c.want)
		}
	}
	// Relative and "~/" flags: made absolute, home expanded.
	t.Setenv(config.EnvLog, "")
	t.Chdir(dir)
	t.Setenv("HOME", filepath.Join(dir, "home"))
	check("relative --state-dir", &globals{stateDir: "rel"}, got{"", filepath.Join(dir, "rel"), "", hclog.Warn})
	t.Setenv(config.EnvStateDir, "~/st")
	check("~/ in BERTH_STATE_DIR", &globals{}, got{"", filepath.Join(dir, "home", "st"), "", hclog.Warn})
}

// BERTH_CLOCK_OFFSET shifts the registry's clock; a bad one is refused, named.
func TestSettingsClockOffset(t *testing.T) {
	for v, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "-1h": -time.Hour} {
		t.Setenv(envClockOffset, v)
		if d, err := clockOffset(); err != nil || d != want {
			t.Errorf("%s=%s: offset %v, %v; want %v", envClockOffset, v, d, err, want)
		}
	}
	t.Setenv(envClockOffset, "soon")
	if _, err := clockOffset(); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), `BERTH_CLOCK_OFFSET="soon"`) {
		t.Errorf("bad offset: %v", err)
	}
	t.Setenv(envClockOffset, "")
	if d, err := clockOffset(); d != 0 || err != nil {
		t.Errorf("unset: %v", err)
	}
}
