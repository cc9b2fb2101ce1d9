package config

import (
	"path/filepath"
	"testing"
)

// ResolvePath: the flag over $BERTH_CONFIG over the XDG default; named files are
// explicit and made absolute ("~/" expanded), the default is not explicit.
func TestResolvePath(t *testing.T) {
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "xdg"))
	t.Setenv(EnvConfig, "")
	t.Chdir(dir)
	for _, c := range []struct {
		flag, env, want string
		explicit        bool
	}{
		{"", "", filepath.Join(dir, "xdg", "berth", "config.hcl"), false},
		{"", "~/env.hcl", filepath.Join(home, "env.hcl"), true},
		{"rel.hcl", "/env.hcl", filepath.Join(dir, "rel.hcl"), true},
		{"~/flag.hcl", "", filepath.Join(home, "flag.hcl"), true},
	} {
		t.Setenv(EnvConfig, c.env)
		p, explicit, err := ResolvePath(c.flag)
		if err != nil || p != c.want || explicit != c.explicit {
			t.Errorf("ResolvePath(%q) with %s=%q = %q, %v, %v; want %q, %v", c.flag, EnvConfig, c.env, p, explicit, err, c.want, c.explicit)
		}
	}
	// A relative XDG_CONFIG_HOME is ignored, as the spec says.
	t.Setenv(EnvConfig, "")
	t.Setenv("XDG_CONFIG_HOME", "rel")
	if p, _ := DefaultPath(); p != filepath.Join(home, ".config", "berth", "config.hcl") {
		t.Errorf("DefaultPath with a relative XDG_CONFIG_HOME = %q", p)
	}
}

func TestDefaultStateDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_STATE_HOME", dir)
	if d, err := DefaultStateDir(); err != nil || d != filepath.Join(dir, "berth") {
		t.Errorf("DefaultStateDir = %q, %v", d, err)
	}
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/h")
	if d, err := DefaultStateDir(); err != nil || d != "/h/.local/state/berth" {
		t.Errorf("DefaultStateDir without XDG_STATE_HOME = %q, %v", d, err)
	}
}

func TestExpandHome(t *testing.T) {
	t.Setenv("HOME", "/home/u")
	for in, want := range map[string]string{"~": "/home/u", "~/a": "/home/u/a", "~u/a": "~u/a", "a/~": "a/~", "/abs": "/abs"} {
		if got := ExpandHome(in); got != want {
			t.Errorf("ExpandHome(%q) = %q, want %q", in, got, want)
		}
	}
}
