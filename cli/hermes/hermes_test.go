package hermes

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/backend"
	"github.com/berth-sh/berth/config"
)

// importFile translates testdata/NAME and parses the result with berth's own
// config loader, as berth would read the file.
func importFile(t *testing.T, name string, opts Options) (*Result, *config.Config) {
	t.Helper()
	path := filepath.Join("testdata", name)
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Import(src, path, opts)
	if err != nil {
		t.Fatalf("Import %s: %v", name, err)
	}
	cfg, err := config.Parse(res.HCL, name+".hcl", config.WithKnownDrivers("local", "docker"))
	if err != nil {
		t.Fatalf("berth's config loader refuses the translation of %s: %v\n%s", name, err, res.HCL)
	}
	if len(cfg.Rules) != 1 {
		t.Fatalf("%s: %d rules, want 1\n%s", name, len(cfg.Rules), res.HCL)
	}
	return res, cfg
}

// noted returns the notes' keys, and fails unless each of want is among them
// with a position in the file.
func noted(t *testing.T, res *Result, file string, want ...string) map[string]Note {
	t.Helper()
	got := map[string]Note{}
	for _, n := range res.Notes {
		got[n.Key] = n
		if !strings.HasPrefix(n.Pos, filepath.Join("testdata", file)+":") || n.Message == "" {
			t.Errorf("note %q has no position in %s or no reason", n, file)
		}
	}
	for _, k := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("no note on %s; notes: %v", k, res.Notes)
		}
	}
	return got
}

func TestDocsDockerExample(t *testing.T) {
	res, cfg := importFile(t, "docs-docker.yaml", Options{})
	r := cfg.Rules[0]
	if r.Glob != DefaultGlob || r.Driver != "docker" || r.Image != "nikolaik/python-nodejs:python3.11-nodejs20" {
		t.Errorf("rule %+v", r)
	}
	if r.Isolation != config.IsolationShared || r.Name != DefaultSharedName || r.Retention.OnClose != config.OnCloseKeep {
		t.Errorf("hermes's default shared container: isolation %q name %q on_close %q", r.Isolation, r.Name, r.Retention.OnClose)
	}
	if r.Network != "bridge" || r.User != "" {
		t.Errorf("network %q user %q, want bridge and the image's user", r.Network, r.User)
	}
	if r.Env["DEBUG"] != "1" || r.Env["PYTHONUNBUFFERED"] != "1" || len(r.Env) != 2 {
		t.Errorf("env %v", r.Env)
	}
	want := []backend.Mount{{Source: "/home/user/projects", Target: "/workspace/projects"}, {Source: "/home/user/data", Target: "/data", ReadOnly: true}}
	if len(r.Mounts) != 2 || r.Mounts[0] != want[0] || r.Mounts[1] != want[1] {
		t.Errorf("mounts %+v, want %+v", r.Mounts, want)
	}
	if r.Resources.CPUs != 1 || r.Resources.MemoryBytes != 5120<<20 {
		t.Errorf("resources %+v, want 1 CPU and 5120 MiB", r.Resources)
	}
	notes := noted(t, res, "docs-docker.yaml", "terminal.docker_forward_env", "terminal.docker_extra_args",
		"terminal.container_disk", "terminal.container_persistent", "terminal.timeout", "terminal.lifetime_seconds",
		"terminal.docker_orphan_reaper", "terminal.docker_mount_cwd_to_workspace")
	for _, k := range []string{"terminal.docker_image", "terminal.docker_env", "terminal.docker_volumes", "terminal.container_cpu", "terminal.container_memory", "terminal.docker_network", "terminal.backend"} {
		if _, ok := notes[k]; ok {
			t.Errorf("%s is translated but has a note %q", k, notes[k])
		}
	}
	if n := notes["terminal.container_disk"]; n.Pos != "testdata/docs-docker.yaml:24:3" {
		t.Errorf("container_disk note at %s, want testdata/docs-docker.yaml:24:3", n.Pos)
	}
	for i := 1; i < len(res.Notes); i++ {
		if a, b := res.Notes[i-1].Pos, res.Notes[i].Pos; lineOf(a) > lineOf(b) {
			t.Errorf("notes out of file order: %s before %s", a, b)
		}
	}
}

func lineOf(pos string) int {
	var l int
	parts := strings.Split(pos, ":")
	for _, c := range parts[len(parts)-2] {
		l = l*10 + int(c-'0')
	}
	return l
}

// TestNonPersistent: container_persistent: false is hermes's container per session
// (tools/terminal_tool_backends.py _build_docker_env at 027fc66: session_scoped),
// removed at session close or after lifetime_seconds idle: a berth sandbox per
// session, removed on close and after that idle time.
func TestNonPersistent(t *testing.T) {
	res, cfg := importFile(t, "nonpersistent.yaml", Options{Home: "/home/me", Glob: "chat:*"})
	r := cfg.Rules[0]
	if r.Glob != "chat:*" || r.Isolation != config.IsolationSession || r.Image != "python:3.12-slim" || r.Name != "" {
		t.Errorf("rule %+v", r)
	}
	ret := r.Retention
	if ret.OnClose != config.OnCloseRemove || ret.IdleTTL != time.Hour || ret.IdleAction != config.IdleRemove {
		t.Errorf("retention %+v, want removed on close and after 1h idle", ret)
	}
	if r.Network != "none" || r.User != "host" || r.Workdir != "/workspace" {
		t.Errorf("network %q user %q workdir %q", r.Network, r.User, r.Workdir)
	}
	if r.Resources.CPUs != 1.5 || r.Resources.MemoryBytes != backend.UnlimitedMemory {
		t.Errorf("resources %+v: want 1.5 CPUs and no memory limit (container_memory: 0)", r.Resources)
	}
	if len(r.Mounts) != 1 || r.Mounts[0].Source != "/home/me/src" || r.Mounts[0].Target != "/workspace/src" {
		t.Errorf("mounts %+v: ~ is the home", r.Mounts)
	}
	if len(res.Notes) != 0 {
		t.Errorf("every key has an equivalent, yet notes %v", res.Notes)
	}
}

// TestNonPersistentDefaults: hermes's idle window defaults to 300 s; the shared
// container's key is noted as unused; docker_persist_across_processes is hermes's
// to turn off for session containers.
func TestNonPersistentDefaults(t *testing.T) {
	res, cfg := importFile(t, "nonpersistent-defaults.yaml", Options{})
	r := cfg.Rules[0]
	if r.Isolation != config.IsolationSession || r.Retention.OnClose != config.OnCloseRemove || r.Retention.IdleTTL != 5*time.Minute {
		t.Errorf("rule %+v retention %+v: want a sandbox per session removed on close and after 5m idle", r, r.Retention)
	}
	noted(t, res, "nonpersistent-defaults.yaml", "terminal.docker_shared_container_key", "terminal.docker_persist_across_processes")
}

// TestPRKeysLeftOut: the keys of hermes-agent PR #106219, which no hermes code
// reads, change nothing (hermes's default, one shared container, stands) and are
// noted as such.
func TestPRKeysLeftOut(t *testing.T) {
	res, cfg := importFile(t, "pr106219.yaml", Options{})
	r := cfg.Rules[0]
	if r.Isolation != config.IsolationShared || r.Name != DefaultSharedName || r.Retention.OnClose != config.OnCloseKeep || r.Retention.IdleTTL != 0 {
		t.Errorf("rule %+v retention %+v: want hermes's default shared sandbox", r, r.Retention)
	}
	if r.Image != DefaultDockerImage || r.Network != "bridge" || r.Resources.CPUs != 0 || r.Resources.MemoryBytes != 5120<<20 {
		t.Errorf("hermes's defaults: image %q network %q resources %+v", r.Image, r.Network, r.Resources)
	}
	notes := noted(t, res, "pr106219.yaml", "terminal.docker_container_scope", "terminal.docker_session_container_retention",
		"terminal.docker_session_container_ttl_seconds", "terminal.ssh_host", "terminal.home_mode")
	if !strings.Contains(notes["terminal.docker_container_scope"].Message, "not merged") {
		t.Errorf("docker_container_scope note: %q", notes["terminal.docker_container_scope"])
	}
	if !strings.Contains(notes["terminal.ssh_host"].Message, "another hermes backend") {
		t.Errorf("ssh_host note: %q", notes["terminal.ssh_host"])
	}
}

func TestLocal(t *testing.T) {
	res, cfg := importFile(t, "local.yaml", Options{})
	r := cfg.Rules[0]
	if r.Driver != "local" || r.Workdir != "/srv/work" || len(r.EnvPassthrough) != 1 || r.EnvPassthrough[0] != "SSH_AUTH_SOCK" {
		t.Errorf("rule %+v", r)
	}
	notes := noted(t, res, "local.yaml", "terminal.timeout", "terminal.docker_image")
	if !strings.Contains(notes["terminal.docker_image"].Message, "docker backend only") {
		t.Errorf("docker_image note %q", notes["terminal.docker_image"])
	}
}

func TestSharedKey(t *testing.T) {
	res, cfg := importFile(t, "shared-key.yaml", Options{})
	r := cfg.Rules[0]
	if r.Isolation != config.IsolationShared || r.Name != "tools" {
		t.Errorf("docker_shared_container_key names the shared sandbox: %+v", r)
	}
	if r.Retention.OnClose != config.OnCloseKeep || r.Retention.IdleTTL != 0 {
		t.Errorf("the shared sandbox is kept: %+v", r.Retention)
	}
	noted(t, res, "shared-key.yaml", "terminal.docker_persist_across_processes", "terminal.lifetime_seconds")
}

func TestRefusals(t *testing.T) {
	cases := []struct{ name, src, want string }{
		{"no-terminal", "model:\n  default: x\n", "no terminal: section"},
		{"not-yaml", "terminal: [\n", "not YAML"},
		{"empty", "", "is empty"},
		{"terminal-list", "terminal:\n  - backend\n", "2:3: terminal: is not a mapping"},
		{"modal", "terminal:\n  backend: modal\n", `x.yaml:2:12: terminal.backend "modal" has no berth driver`},
		{"persistent", "terminal:\n  backend: docker\n  container_persistent: sometimes\n", `3:25: terminal.container_persistent must be true or false, not "sometimes"`},
		{"relative-volume", "terminal:\n  backend: docker\n  docker_volumes: [\"data:/data\"]\n", `host path "data" is not absolute`},
		{"tilde-volume", "terminal:\n  backend: docker\n  docker_volumes: [\"~/x:/x\"]\n", "no home directory is known"},
		{"volume-mode", "terminal:\n  backend: docker\n  docker_volumes: [\"/a:/b:z\"]\n", `mode "z"`},
		{"volume-shape", "terminal:\n  backend: docker\n  docker_volumes: [\"/a\"]\n", "want HOST:CONTAINER"},
		{"bool", "terminal:\n  backend: docker\n  docker_network: maybe\n", `terminal.docker_network must be true or false, not "maybe"`},
		{"number", "terminal:\n  backend: docker\n  container_memory: lots\n", "terminal.container_memory must be a number"},
		{"negative", "terminal:\n  backend: docker\n  container_cpu: -1\n", "terminal.container_cpu must be a number"},
		{"env", "terminal:\n  backend: docker\n  docker_env: [A]\n", "terminal.docker_env must be a mapping"},
		{"env-name", "terminal:\n  backend: docker\n  docker_env: {\"A=B\": x}\n", "no = or NUL"},
		{"list", "terminal:\n  backend: docker\n  docker_volumes: /a:/b\n", "terminal.docker_volumes must be a list"},
		{"shared-key", "terminal:\n  backend: docker\n  docker_shared_container_key: \"a b\"\n", "cannot name berth's shared sandbox"},
		{"dup", "terminal:\n  backend: docker\n  backend: local\n", "backend"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := Import([]byte(c.src), "x.yaml", Options{})
			if err == nil {
				t.Fatalf("Import succeeded:\n%s", res.HCL)
			}
			if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q: want ErrInvalid saying %q", err, c.want)
			}
		})
	}
	if _, err := Import([]byte("terminal: {}\n"), "x.yaml", Options{Glob: "a b"}); err == nil || !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("a bad glob: %v", err)
	}
}

func TestRelativeCwdIsNoted(t *testing.T) {
	res, err := Import([]byte("terminal:\n  backend: docker\n  cwd: \".\"\n"), "x.yaml", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Notes) != 1 || res.Notes[0].Key != "terminal.cwd" || res.Notes[0].Pos != "x.yaml:3:8" || !strings.Contains(res.Notes[0].Message, "WORKDIR") {
		t.Errorf("notes %v: want one on terminal.cwd at x.yaml:3:8", res.Notes)
	}
	if strings.Contains(string(res.HCL), "workdir") {
		t.Errorf("a relative cwd became a workdir:\n%s", res.HCL)
	}
}

// TestDocsConfigParses keeps docs/hermes.md's berth config valid: every hcl
// block there parses with berth's loader.
func TestDocsConfigParses(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "hermes.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(doc), "```hcl\n")[1:]
	if len(blocks) == 0 {
		t.Fatal("docs/hermes.md has no hcl block")
	}
	for i, b := range blocks {
		src := b[:strings.Index(b, "```")]
		cfg, err := config.Parse([]byte(src), "docs/hermes.md", config.WithKnownDrivers("local", "docker"))
		if err != nil {
			t.Errorf("hcl block %d of docs/hermes.md: %v", i+1, err)
			continue
		}
		if r, _, err := cfg.Match("main"); err != nil || r.Driver != "local" {
			t.Errorf("block %d: main does not run on local (%v)", i+1, err)
		}
		r, _, err := cfg.Match("hermes:sub-1")
		if err != nil || r.Driver != "docker" || r.Isolation != config.IsolationSession || r.Retention.OnClose != config.OnCloseStop ||
			r.Retention.IdleTTL != 7*24*time.Hour || r.Retention.IdleAction != config.IdleRemove {
			t.Errorf("block %d: hermes:sub-1 gets %+v (%v), want its own docker sandbox, stopped on close, removed after 7 idle days", i+1, r, err)
		}
	}
}
