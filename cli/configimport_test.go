package cli

import (
	"strings"
	"testing"
)

// TestConfigImportHermes translates a hermes-agent config.yaml, checks the
// result with berth config check, and runs a command in a session of the
// translated rule.
func TestConfigImportHermes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	work := t.TempDir()
	yaml := e.writeFile("config.yaml", `model:
  default: "anthropic/claude-opus-4.6"
terminal:
  backend: local
  cwd: `+work+`
  timeout: 180
  persistent_shell: true
`)
	r := e.must("config", "import", "hermes", yaml)
	if !strings.Contains(r.stdout, `scope "hermes:*"`) || !strings.Contains(r.stdout, `workdir = "`+work+`"`) {
		t.Errorf("translation:\n%v", r)
	}
	for _, s := range []string{yaml + ":6:3: terminal.timeout:", yaml + ":7:3: terminal.persistent_shell:"} {
		if !strings.Contains(r.stderr, "berth: note: "+s) {
			t.Errorf("stderr does not note %q\n%v", s, r)
		}
	}
	e.config = e.writeFile("config.hcl", r.stdout)
	if c := e.must("config", "check"); !strings.Contains(c.stdout, "ok, 1 scope rule\n") {
		t.Errorf("config check of the translation\n%v", c)
	}
	if p := e.must("exec", "-s", "hermes:t1", "--", "pwd"); strings.TrimSpace(p.stdout) != work {
		t.Errorf("a hermes session starts in %q, want the hermes cwd %s\n%v", p.stdout, work, p)
	}

	bad := e.writeFile("bad.yaml", "terminal:\n  backend: modal\n")
	r = e.run("config", "import", "hermes", bad)
	if r.code != 125 || r.stdout != "" || !strings.Contains(r.stderr, bad+`:2:12: terminal.backend "modal" has no berth driver`) {
		t.Errorf("a backend without a driver\n%v", r)
	}
	r = e.run("config", "import", "hermes", e.dir+"/missing.yaml")
	if r.code != 125 || !strings.Contains(r.stderr, "missing.yaml") {
		t.Errorf("a missing file\n%v", r)
	}
}
