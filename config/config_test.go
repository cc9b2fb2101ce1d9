package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/berth-sh/berth/backend"
)

const goodConfig = `
state_dir   = "/var/lib/berth-test"
agent_path  = "/opt/berth/berth"
plugin_dirs = ["/opt/berth/plugins"]
log_level   = "debug"

driver "local" {
  note = "hello"
}

scope "main" {
  driver = "local"
  env = { B = "2", A = "1" }
  env_passthrough = ["PATH", "HOME"]
  workdir = "/tmp"
  retention {
    on_close = "stop"
  }
}

scope "chat:*" {
  isolation = "session"
  image = "busybox:latest"
  user = "1000:1000"
  network = "none"
  allow_host_paths = true
  mount {
    source = "/srv/data"
    target = "/data"
    read_only = true
  }
  mount {
    source = "/srv/cache"
    target = "/cache"
  }
  resources {
    cpus   = 1.5
    memory = "512m"
    pids   = 256
  }
  retention {
    on_close = "remove"
    idle_ttl = "7d"
    max_age  = "36h"
  }
}

scope "chat:7" {
}

scope "sub?:*" {
  isolation = "shared"
  name = "pool"
  resources {
    memory = 1048576
  }
}

scope "*" {
  driver = "other"
}
`

func TestParse(t *testing.T) {
	cfg, err := Parse([]byte(goodConfig), "/etc/berth/config.hcl", WithKnownDrivers("local", "other"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir != "/var/lib/berth-test" || cfg.AgentPath != "/opt/berth/berth" || cfg.LogLevel != "debug" ||
		len(cfg.PluginDirs) != 1 || cfg.PluginDirs[0] != "/opt/berth/plugins" {
		t.Errorf("top-level attributes: %+v", cfg)
	}
	if cfg.Drivers["local"] == nil || len(cfg.Rules) != 5 {
		t.Fatalf("drivers %v, %d rules", cfg.Drivers, len(cfg.Rules))
	}
	main := cfg.Rules[0]
	if main.Glob != "main" || main.Env["A"] != "1" || main.Workdir != "/tmp" || main.Retention.OnClose != OnCloseStop ||
		main.Isolation != IsolationSession || main.Pos() != "/etc/berth/config.hcl:11:1" {
		t.Errorf("main rule: %+v (pos %s)", main, main.Pos())
	}
	spec := main.Spec("owner", "main")
	if strings.Join(spec.Env, ",") != "A=1,B=2" || strings.Join(spec.EnvAllowlist, ",") != "PATH,HOME" {
		t.Errorf("spec env %v allowlist %v", spec.Env, spec.EnvAllowlist)
	}
	chat := cfg.Rules[1]
	want := backend.Resources{CPUs: 1.5, MemoryBytes: 512 << 20, Pids: 256}
	if chat.Resources != want || chat.Image != "busybox:latest" || chat.User != "1000:1000" || !chat.AllowHostPaths ||
		len(chat.Mounts) != 2 || chat.Mounts[0] != (backend.Mount{Source: "/srv/data", Target: "/data", ReadOnly: true}) ||
		chat.Mounts[1].ReadOnly || chat.Retention != (Retention{OnClose: OnCloseRemove, IdleTTL: 7 * 24 * time.Hour, IdleAction: IdleStop, MaxAge: 36 * time.Hour}) ||
		chat.Driver != "local" {
		t.Errorf("chat rule: %+v", chat)
	}
	if cfg.Rules[2].Retention.OnClose != OnCloseKeep || cfg.Rules[2].Driver != "local" {
		t.Errorf("defaults of an empty rule: %+v", cfg.Rules[2])
	}
	sub := cfg.Rules[3]
	if sub.Isolation != IsolationShared || sub.Name != "pool" || sub.Resources.MemoryBytes != 1<<20 || sub.Key("sub1:x") != "pool" {
		t.Errorf("shared rule: %+v", sub)
	}
	if cfg.Rules[4].Driver != "other" {
		t.Errorf("last rule: %+v", cfg.Rules[4])
	}
	for i, r := range cfg.Rules {
		if r.Index != i {
			t.Errorf("rule %d has Index %d", i, r.Index)
		}
	}
}

func TestMatchOrder(t *testing.T) {
	cfg, err := Parse([]byte(goodConfig), "config.hcl", WithKnownDrivers("local", "other"))
	if err != nil {
		t.Fatal(err)
	}
	for session, wantGlob := range map[string]string{
		"main":       "main",
		"main2":      "*",
		"chat:7":     "chat:*", // "chat:*" comes first, so it decides, not "chat:7"
		"chat:1/2":   "chat:*",
		"subA:1":     "sub?:*",
		"sub:1":      "*", // ? needs exactly one character
		"subAB:1":    "*",
		"x/y@z":      "*",
		"chat":       "*",
		"Main":       "*",
		"subZ:q/r/s": "sub?:*",
	} {
		r, idx, err := cfg.Match(session)
		if err != nil {
			t.Errorf("Match(%q): %v", session, err)
			continue
		}
		if r.Glob != wantGlob || cfg.Rules[idx].Glob != wantGlob {
			t.Errorf("Match(%q) = rule %q (#%d), want %q", session, r.Glob, idx, wantGlob)
		}
	}
	// Reordering changes the decision: first match wins.
	cfg2, err := Parse([]byte(`
scope "chat:7" {
  retention { on_close = "stop" }
}
scope "chat:*" {
  retention { on_close = "remove" }
}
`), "c.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if r, _, _ := cfg2.Match("chat:7"); r.Glob != "chat:7" || r.Retention.OnClose != OnCloseStop {
		t.Errorf("chat:7 matched %q", r.Glob)
	}
	if r, _, _ := cfg2.Match("chat:8"); r.Glob != "chat:*" {
		t.Errorf("chat:8 matched %q", r.Glob)
	}
	if _, _, err := cfg2.Match("main"); err == nil || !errors.Is(err, backend.ErrInvalid) ||
		!strings.Contains(err.Error(), `session "main" matches no scope rule in c.hcl`) ||
		!strings.Contains(err.Error(), `scope "*"`) || !strings.Contains(err.Error(), `"chat:7", "chat:*"`) {
		t.Errorf("no matching rule: %v", err)
	}
	if _, _, err := cfg2.Match("../x"); err == nil || !strings.Contains(err.Error(), `session name "../x"`) {
		t.Errorf("bad session through Match: %v", err)
	}
}

func TestDefault(t *testing.T) {
	cfg := Default()
	for _, s := range []string{"main", "chat:1", "a/b"} {
		r, idx, err := cfg.Match(s)
		if err != nil || idx != 0 || r.Driver != "local" || r.Isolation != IsolationSession || r.Retention.OnClose != OnCloseKeep {
			t.Errorf("Default().Match(%q) = %+v, %d, %v", s, r, idx, err)
		}
	}
	if r, _, _ := cfg.Match("main"); r.Pos() != "(built-in default)" {
		t.Errorf("Pos = %q", r.Pos())
	}
	// A config file without scope rules behaves the same.
	c, err := Parse([]byte(`log_level = "info"`), "c.hcl")
	if err != nil || len(c.Rules) != 1 || c.Rules[0].Glob != "*" || c.Rules[0].Driver != "local" {
		t.Errorf("config without rules: %+v, %v", c, err)
	}
}

// TestConfigBadInput checks each bad input gets an error wrapping ErrInvalid at the
// right file:line:col that says what is wrong and what to do.
func TestConfigBadInput(t *testing.T) {
	cases := []struct {
		name, src string
		want      []string
	}{
		{"unknown driver", "scope \"*\" {\n  driver = \"dockr\"\n}\n",
			[]string{"config.hcl:2:12: error: Unknown driver", `driver "dockr" is not known; known drivers: local`}},
		{"unknown driver block", "driver \"dockr\" {\n}\n",
			[]string{"config.hcl:1:8: error: Unknown driver", `"dockr"`}},
		{"bad glob char", "scope \"chat[0-9]\" {\n}\n",
			[]string{"config.hcl:1:7: error: Invalid scope glob", `character '[' at position 5`, "wildcards"}},
		{"empty glob", "scope \"\" {}\n",
			[]string{"config.hcl:1:7: error: Invalid scope glob", `use "*" to match every session`}},
		{"bad duration", "scope \"*\" {\n  retention {\n    idle_ttl = \"7days\"\n  }\n}\n",
			[]string{"config.hcl:3:16: error: Invalid duration", `"idle_ttl": invalid duration "7days"`, `"7d"`}},
		{"bad max_age", "scope \"*\" {\n  retention { max_age = \"-1h\" }\n}\n",
			[]string{"config.hcl:2:25: error: Invalid duration", `"-1h"`}},
		{"unknown top key", "stat_dir = \"/x\"\n",
			[]string{"config.hcl:1:1: error: Unsupported argument", `"stat_dir"`, `Did you mean "state_dir"?`, "Valid arguments in the config file: state_dir, agent_path, plugin_dirs, log_level, agent_timeout, output_max_total, output_max_age; valid blocks: driver, scope."}},
		{"unknown scope key", "scope \"*\" {\n  drivr = \"local\"\n}\n",
			[]string{"config.hcl:2:3: error: Unsupported argument", `Did you mean "driver"?`, `Valid arguments in scope "*": driver, name, image, pull, env, env_passthrough, workdir, user, network, allow_host_paths, isolation, max_output, runtime; valid blocks: mount, resources, retention, pool.`}},
		{"unknown block", "scope \"*\" {\n  limits {}\n}\n",
			[]string{"config.hcl:2:3: error: Unsupported block type", `"limits"`, "valid blocks: mount, resources, retention"}},
		{"unknown retention key", "scope \"*\" {\n  retention {\n    on_clos = \"stop\"\n  }\n}\n",
			[]string{"config.hcl:3:5: error: Unsupported argument", `Valid arguments in scope "*" retention: on_close, idle_ttl, idle_action, max_age.`}},
		{"bad on_close", "scope \"*\" {\n  retention { on_close = \"delete\" }\n}\n",
			[]string{"config.hcl:2:26: error: Invalid on_close", `"delete" is not "keep", "stop" or "remove"`}},
		{"bad idle_action", "scope \"*\" {\n  retention { idle_action = \"delete\" }\n}\n",
			[]string{"config.hcl:2:29: error: Invalid idle_action", `"delete" is not "stop" or "remove"`}},
		{"pool on shared rule", "scope \"*\" {\n  isolation = \"shared\"\n  name = \"all\"\n  pool { size = 2 }\n}\n",
			[]string{"config.hcl:4:3: error: Pool with shared isolation", `use isolation = "session"`}},
		{"pool size zero", "scope \"*\" {\n  pool { size = 0 }\n}\n",
			[]string{"config.hcl:2:17: error: Invalid pool size", "from 1 to 256", "got 0"}},
		{"pool size fraction", "scope \"*\" {\n  pool { size = 1.5 }\n}\n",
			[]string{"config.hcl:2:17: error: Invalid pool size", "got 1.5"}},
		{"pool size too big", "scope \"*\" {\n  pool { size = 1000 }\n}\n",
			[]string{"config.hcl:2:17: error: Invalid pool size", "got 1000"}},
		{"pool without size", "scope \"*\" {\n  pool { max_idle = \"1h\" }\n}\n",
			[]string{"config.hcl:2:10: error: Missing required argument", `"size"`}},
		{"pool bad max_idle", "scope \"*\" {\n  pool {\n    size = 1\n    max_idle = \"soon\"\n  }\n}\n",
			[]string{"config.hcl:4:16: error: Invalid duration", `"max_idle"`}},
		{"two pools", "scope \"*\" {\n  pool { size = 1 }\n  pool { size = 2 }\n}\n",
			[]string{"config.hcl:3:3: error: Duplicate block", "already has a pool block at"}},
		{"bad isolation", "scope \"*\" {\n  isolation = \"pooled\"\n}\n",
			[]string{"config.hcl:2:15: error: Invalid isolation", `"pooled"`}},
		{"shared without name", "scope \"x:*\" {\n  isolation = \"shared\"\n}\n",
			[]string{"config.hcl:1:1: error: Missing shared name", `add name = "SANDBOX-NAME"`}},
		{"name without shared", "scope \"x:*\" {\n  name = \"pool\"\n}\n",
			[]string{"config.hcl:2:3: error: Name without shared isolation", `isolation = "shared"`}},
		{"bad shared name", "scope \"x:*\" {\n  isolation = \"shared\"\n  name = \"../p\"\n}\n",
			[]string{"config.hcl:3:10: error: Invalid shared name", `".." path component`}},
		{"bad cpu_shares", "scope \"*\" {\n  resources { cpu_shares = 1 }\n}\n",
			[]string{"config.hcl:2:28: error: Invalid cpu_shares", "from 2 to 262144"}},
		{"bad memory", "scope \"*\" {\n  resources {\n    memory = \"lots\"\n  }\n}\n",
			[]string{"config.hcl:3:14: error: Invalid memory", `invalid size "lots"`, `"512m"`}},
		{"bad pids", "scope \"*\" {\n  resources { pids = 1.5 }\n}\n",
			[]string{"config.hcl:2:22: error: Invalid pids", "positive whole number"}},
		{"bad cpus type", "scope \"*\" {\n  resources { cpus = \"two\" }\n}\n",
			[]string{"config.hcl:2:22: error: Incorrect attribute value type", `"cpus" must be a number`}},
		{"relative workdir", "scope \"*\" {\n  workdir = \"src\"\n}\n",
			[]string{"config.hcl:2:13: error: Invalid path", `"workdir" must be an absolute path; got "src"`}},
		{"relative mount", "scope \"*\" {\n  mount {\n    source = \"data\"\n    target = \"/data\"\n  }\n}\n",
			[]string{"config.hcl:3:14: error: Invalid path", `"source" must be an absolute path`}},
		{"mount missing target", "scope \"*\" {\n  mount {\n    source = \"/data\"\n  }\n}\n",
			[]string{"config.hcl:2:9: error: Missing required argument", `"target"`}},
		{"after catch-all", "scope \"*\" {}\nscope \"chat:*\" {}\n",
			[]string{"config.hcl:2:7: error: Unreachable scope rule", "config.hcl:1:7", "Move the catch-all rule to the end"}},
		{"duplicate glob", "scope \"a\" {}\nscope \"a\" {}\n",
			[]string{"config.hcl:2:7: error: Unreachable scope rule", "same glob"}},
		{"bad output_max_total", "output_max_total = \"lots\"\n",
			[]string{"config.hcl:1:20: error: Invalid output_max_total", `"lots"`}},
		{"negative output_max_total", "output_max_total = -5\n",
			[]string{"config.hcl:1:20: error: Invalid output_max_total", "positive whole number"}},
		{"zero output_max_age", "output_max_age = \"0s\"\n",
			[]string{"config.hcl:1:18: error: Invalid duration", `output_max_age must be positive`}},
		{"bad log level", "log_level = \"loud\"\n",
			[]string{"config.hcl:1:13: error: Invalid log level", "trace, debug, info, warn, error, off"}},
		{"relative state dir", "state_dir = \"state\"\n",
			[]string{"config.hcl:1:13: error: Invalid path", `or start with "~/"`}},
		{"bad env", "scope \"*\" {\n  env = { \"A=B\" = \"x\" }\n}\n",
			[]string{"config.hcl:2:9: error: Invalid environment variable", `"A=B" is not a valid variable name`}},
		{"NUL in env value", "scope \"*\" {\n  env = { GOOD = \"a\\u0000b\" }\n}\n",
			[]string{"config.hcl:2:9: error: Invalid environment variable", "the value of GOOD holds a NUL byte (at byte 2)"}},
		{"huge duration", "scope \"*\" {\n  retention {\n    idle_ttl = \"999999999999d\"\n  }\n}\n",
			[]string{"config.hcl:3:16: error: Invalid duration", `"999999999999d": too large; the longest is 106751d23h47m16s`}},
		{"huge memory", "scope \"*\" {\n  resources { memory = \"99999999t\" }\n}\n",
			[]string{"error: Invalid memory", "too large; the largest is 4611686018427387903 bytes"}},
		{"huge memory number", "scope \"*\" {\n  resources { memory = 99999999999999999999 }\n}\n",
			[]string{"error: Invalid memory", "99999999999999999999 bytes is too large; the largest is 4611686018427387903 bytes"}},
		{"syntax error", "scope \"*\" {\n  driver = \n}\n",
			[]string{"config.hcl:2:"}},
		{"missing label", "scope {}\n",
			[]string{"config.hcl:1:7: error: Missing glob for scope"}},
		{"duplicate retention", "scope \"*\" {\n  retention {}\n  retention {}\n}\n",
			[]string{"config.hcl:3:3: error: Duplicate block", "config.hcl:2:3"}},
		{"conflicting shared", "scope \"a:*\" {\n  isolation = \"shared\"\n  name = \"p\"\n}\nscope \"b:*\" {\n  isolation = \"shared\"\n  name = \"p\"\n  image = \"x\"\n}\n",
			[]string{"config.hcl:5:7: error: Conflicting shared sandbox", "config.hcl:1:1"}},
		{"variables not allowed", "scope \"*\" {\n  image = var.x\n}\n",
			[]string{"config.hcl:2:11: error: Variables not allowed"}},
		{"unquoted string", "scope \"*\" {\n  driver = local\n}\n",
			[]string{`config.hcl:2:12: error: Unquoted string: "driver" must be a string, and a bare word is read as a variable; write driver = "local".`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.src), "/etc/berth/config.hcl")
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, backend.ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			var ce *Error
			sum := sha256.Sum256([]byte(c.src))
			if !errors.As(err, &ce) {
				t.Errorf("error is not a *Error: %T", err)
			} else if ce.Path != "/etc/berth/config.hcl" || ce.SHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("error names %q, sha256 %q; want the file and its bytes' sum", ce.Path, ce.SHA256)
			}
			msg := err.Error()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error\n%s\ndoes not contain\n%s", msg, w)
				}
			}
			if !strings.HasPrefix(msg, "/etc/berth/config.hcl:") {
				t.Errorf("error does not start with file:line:col: %s", msg)
			}
		})
	}
	// Identical shared rules may share a sandbox.
	if _, err := Parse([]byte("scope \"a:*\" {\n isolation = \"shared\"\n name = \"p\"\n}\nscope \"b:*\" {\n isolation = \"shared\"\n name = \"p\"\n}\n"), "c.hcl"); err != nil {
		t.Errorf("identical shared rules: %v", err)
	}
}

// TestResourcesUnlimited: memory = "unlimited" is UnlimitedMemory, and cpu_shares a
// weight; a rule without them leaves both to the driver (zero).
func TestResourcesUnlimited(t *testing.T) {
	cfg, err := Parse([]byte("scope \"a:*\" {\n  resources {\n    memory = \"unlimited\"\n    cpu_shares = 1024\n  }\n}\nscope \"*\" {}\n"), "c.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Rules[0].Resources; r.MemoryBytes != backend.UnlimitedMemory || r.CPUShares != 1024 || r.Limited() == false {
		t.Errorf("resources %+v", r)
	}
	if r := cfg.Rules[1].Resources; r != (backend.Resources{}) || r.Limited() {
		t.Errorf("a rule without resources: %+v", r)
	}
	if r := (backend.Resources{MemoryBytes: backend.UnlimitedMemory}); r.Limited() {
		t.Errorf("unlimited memory alone counts as a limit")
	}
}

// TestOutputLimits checks output_max_total takes a size, a byte count or "unlimited",
// and output_max_age a duration.
func TestOutputLimits(t *testing.T) {
	for _, c := range []struct {
		src   string
		total int64
		age   time.Duration
	}{
		{"", 0, 0},
		{"output_max_total = \"1g\"\noutput_max_age = \"2d\"\n", 1 << 30, 48 * time.Hour},
		{"output_max_total = 4096\n", 4096, 0},
		{"output_max_total = \"unlimited\"\n", -1, 0},
	} {
		cfg, err := Parse([]byte(c.src), "c.hcl")
		if err != nil {
			t.Errorf("%q: %v", c.src, err)
			continue
		}
		if cfg.OutputMaxTotal != c.total || cfg.OutputMaxAge != c.age {
			t.Errorf("%q: total %d age %v, want %d %v", c.src, cfg.OutputMaxTotal, cfg.OutputMaxAge, c.total, c.age)
		}
	}
}

func TestConfigSeveralErrors(t *testing.T) {
	_, err := Parse([]byte("bogus = 1\nscope \"*\" {\n  driver = \"nope\"\n  retention { idle_ttl = \"x\" }\n}\n"), "c.hcl")
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "c.hcl:1:1:") || !strings.HasPrefix(lines[1], "c.hcl:3:12:") || !strings.HasPrefix(lines[2], "c.hcl:4:26:") {
		t.Errorf("want three errors sorted by position, got:\n%s", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load("/nonexistent/berth.hcl")
	if err == nil || !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "/nonexistent/berth.hcl does not exist") {
		t.Errorf("Load of a missing file: %v", err)
	}
}

func TestFormatDiagnostics(t *testing.T) {
	diags := hcl.Diagnostics{
		{Severity: hcl.DiagWarning, Summary: "W", Detail: "w detail", Subject: &hcl.Range{Filename: "f.hcl", Start: hcl.Pos{Line: 9, Column: 2}}},
		{Severity: hcl.DiagError, Summary: "E", Subject: &hcl.Range{Filename: "f.hcl", Start: hcl.Pos{Line: 3, Column: 4}}},
		{Severity: hcl.DiagError, Summary: "No subject", Detail: "d"},
	}
	want := "error: No subject: d\nf.hcl:3:4: error: E\nf.hcl:9:2: warning: W: w detail"
	if got := FormatDiagnostics(diags); got != want {
		t.Errorf("FormatDiagnostics =\n%s\nwant\n%s", got, want)
	}
}

func driverBody(t *testing.T, src string) hcl.Body {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(src), "d.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return f.Body
}

var testSchema = []backend.ConfigField{
	{Name: "socket", Type: "string", Required: true, Description: "the runtime's socket"},
	{Name: "timeout", Type: "duration"},
	{Name: "retries", Type: "number"},
	{Name: "debug", Type: "bool"},
	{Name: "tags", Type: "list(string)"},
}

func TestDecodeDriverConfig(t *testing.T) {
	js, err := DecodeDriverConfig("docker", driverBody(t, `
socket  = "/run/docker.sock"
timeout = "2d"
retries = 3
debug   = true
tags    = ["a", "b"]
`), testSchema)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatal(err)
	}
	if got["socket"] != "/run/docker.sock" || got["timeout"] != "48h0m0s" || got["retries"] != 3.0 || got["debug"] != true ||
		len(got["tags"].([]any)) != 2 {
		t.Errorf("decoded %s", js)
	}
	if d, err := time.ParseDuration(got["timeout"].(string)); err != nil || d != 48*time.Hour {
		t.Errorf("duration not Go-parseable: %v", err)
	}
	// Optional fields left out.
	js, err = DecodeDriverConfig("docker", driverBody(t, `socket = "/s"`), testSchema)
	if err != nil || string(js) != `{"socket":"/s"}` {
		t.Errorf("minimal: %s %v", js, err)
	}
	// No block, no required fields.
	js, err = DecodeDriverConfig("local", nil, []backend.ConfigField{{Name: "x", Type: "string"}})
	if err != nil || string(js) != `{}` {
		t.Errorf("no block: %s %v", js, err)
	}

	bad := []struct {
		src  string
		want []string
	}{
		{"socket = \"/s\"\nsockit = \"/t\"\n", []string{"d.hcl:2:1: error: Unsupported argument", `driver "docker" has no setting "sockit"`, "Valid settings: debug (bool), retries (number), socket (string), tags (list(string)), timeout (duration)."}},
		{"socket = \"/s\"\ntimeout = \"soon\"\n", []string{"d.hcl:2:11: error: Invalid duration", `"soon"`}},
		{"socket = \"/s\"\nretries = \"many\"\n", []string{"d.hcl:2:11: error: Incorrect attribute value type", `"retries" must be a number`}},
		{"socket = \"/s\"\ntags = \"a\"\n", []string{"d.hcl:2:8: error: Incorrect attribute value type", "list of strings"}},
		{"timeout = \"1s\"\n", []string{"error: Missing required driver setting", `driver "docker" needs "socket" (string: the runtime's socket)`}},
		{"socket = \"/s\"\nopts {\n}\n", []string{"d.hcl:2:1: error: Unexpected \"opts\" block"}},
	}
	for _, c := range bad {
		_, err := DecodeDriverConfig("docker", driverBody(t, c.src), testSchema)
		if err == nil || !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("%q: error %v", c.src, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error\n%s\ndoes not contain %q", c.src, err, w)
			}
		}
	}
	_, err = DecodeDriverConfig("docker", nil, testSchema)
	if err == nil || !strings.Contains(err.Error(), `add driver "docker" { socket = ... } to the config`) {
		t.Errorf("missing block with a required field: %v", err)
	}
	_, err = DecodeDriverConfig("x", nil, []backend.ConfigField{{Name: "f", Type: "map"}})
	if err == nil || !strings.Contains(err.Error(), `unsupported type "map"`) {
		t.Errorf("bad schema type: %v", err)
	}
	_, err = DecodeDriverConfig("x", driverBody(t, `a = 1`), nil)
	if err == nil || !strings.Contains(err.Error(), "This driver takes no settings") {
		t.Errorf("no schema: %v", err)
	}
}

func TestSpecHash(t *testing.T) {
	cfg, err := Parse([]byte(goodConfig), "c.hcl", WithKnownDrivers("local", "other"))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Rules[1].Spec("o", "chat:1")
	if a.Labels[backend.LabelSpecHash] != SpecHash(a) || len(SpecHash(a)) != 64 {
		t.Fatal("spec hash label")
	}
	b := a
	b.Labels = map[string]string{"other": "labels"}
	if SpecHash(b) != SpecHash(a) {
		t.Error("labels changed the hash")
	}
	b.Pull = backend.PullNever
	if SpecHash(b) != SpecHash(a) {
		t.Error("the pull policy changed the hash: it says when the image is fetched, not what runs")
	}
	b.Resources.Pids++
	if SpecHash(b) == SpecHash(a) {
		t.Error("resources did not change the hash")
	}
	// Env map order never matters.
	for i := 0; i < 20; i++ {
		if h := cfg.Rules[0].Spec("o", "main").Labels[backend.LabelSpecHash]; h != cfg.Rules[0].Spec("o", "main").Labels[backend.LabelSpecHash] {
			t.Fatal("hash not stable")
		}
	}
	if a.Labels[backend.LabelOwner] != "o" || a.Labels[backend.LabelSession] != "chat:1" || a.Labels[backend.LabelScope] != "chat:*" {
		t.Errorf("labels %v", a.Labels)
	}
	s := cfg.Rules[3].Spec("o", "subA:1")
	if s.Labels[backend.LabelSession] != "pool" || s.Name != SharedSandboxName("o", "pool") || s.Name != cfg.Rules[3].Spec("o", "subB:2").Name {
		t.Errorf("shared spec %+v", s)
	}
}

func TestPullConfig(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"scope \"*\" {\n  image = \"x\"\n  pull = \"sometimes\"\n}\n", `pull "sometimes" is not "missing", "always" or "never"`},
		{"scope \"*\" {\n  pull = \"always\"\n}\n", "pull only applies to a rule with an image"},
	} {
		_, err := Parse([]byte(c.src), "config.hcl", WithKnownDrivers("local"))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "config.hcl:") {
			t.Errorf("%q: %v, want an error at file:line saying %q", c.src, err, c.want)
		}
	}
}

func TestExampleSession(t *testing.T) {
	for glob, want := range map[string]string{"*": "x", "chat:*": "chat:x", "sub?:*/?": "subx:x/x", "main": "main"} {
		r := &Rule{Glob: glob}
		got := r.ExampleSession()
		if got != want || !GlobMatch(glob, got) {
			t.Errorf("ExampleSession of %q = %q, want %q, matched by the glob", glob, got, want)
		}
		if err := ValidateSession(got); err != nil {
			t.Errorf("ExampleSession of %q: %v", glob, err)
		}
	}
}

// A rule's runtime reaches the spec and its hash; a spec without one hashes as specs
// did before the field existed (its JSON has no "runtime" key), so upgrading berth
// reports no drift on existing sandboxes; a bad runtime name is refused at its
// position.
func TestRuntimeConfig(t *testing.T) {
	src := "scope \"u:*\" {\n  driver = \"other\"\n  runtime = \"runsc\"\n}\nscope \"*\" {\n  driver = \"other\"\n}\n"
	cfg, err := Parse([]byte(src), "c.hcl", WithKnownDrivers("local", "other"))
	if err != nil {
		t.Fatal(err)
	}
	g, p := cfg.Rules[0].Spec("o", "u:1"), cfg.Rules[1].Spec("o", "u:1")
	if g.Runtime != "runsc" || p.Runtime != "" {
		t.Fatalf("runtimes %q and %q, want runsc and none", g.Runtime, p.Runtime)
	}
	p.Labels, g.Labels = nil, nil
	if SpecHash(g) == SpecHash(p) {
		t.Error("runtime did not change the hash")
	}
	js, _ := json.Marshal(p)
	if strings.Contains(string(js), "runtime") {
		t.Errorf("a spec without runtime marshals with it: %s (its hash would change on upgrade)", js)
	}
	for _, bad := range []string{"", "-x", "run sc", "a/b", strings.Repeat("r", 65)} {
		src := fmt.Sprintf("scope \"*\" {\n  runtime = %q\n}\n", bad)
		_, err := Parse([]byte(src), "c.hcl", WithKnownDrivers("local"))
		if err == nil || !strings.Contains(err.Error(), "c.hcl:2:") || !strings.Contains(err.Error(), "is not a runtime name") {
			t.Errorf("runtime %q: %v, want an error at c.hcl:2 saying it is not a runtime name", bad, err)
		}
	}
}

func TestConfigPool(t *testing.T) {
	src := "scope \"task:*\" {\n  pool {\n    size = 4\n    max_idle = \"30m\"\n  }\n}\nscope \"*\" {}\n"
	cfg, err := Parse([]byte(src), "config.hcl")
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Rules[0].Pool
	if p == nil || p.Size != 4 || p.MaxIdle != 30*time.Minute {
		t.Fatalf("pool = %+v, want size 4, max_idle 30m", p)
	}
	if cfg.Rules[1].Pool != nil {
		t.Fatalf("rule without a pool block has pool %+v", cfg.Rules[1].Pool)
	}
	owner := strings.Repeat("a", 32)
	rule := &cfg.Rules[0]
	a, b := rule.MemberSpec(owner, "0123456789abcdef"), rule.MemberSpec(owner, "fedcba9876543210")
	if a.Name == b.Name || a.Name != PoolMemberName(owner, "0123456789abcdef") {
		t.Fatalf("member names %q and %q: want distinct PoolMemberNames", a.Name, b.Name)
	}
	if err := backend.ValidateSandboxName(a.Name); err != nil {
		t.Fatal(err)
	}
	if a.Name == rule.SandboxName(owner, "task:0123456789abcdef") {
		t.Fatal("a member's name equals a session's sandbox name")
	}
	h := rule.PoolHash(owner)
	if a.Labels[backend.LabelSpecHash] != h || b.Labels[backend.LabelSpecHash] != h {
		t.Fatalf("members' spec hashes %q, %q; want the pool hash %q for both", a.Labels[backend.LabelSpecHash], b.Labels[backend.LabelSpecHash], h)
	}
	if _, ok := a.Labels[backend.LabelSession]; ok || a.Labels[backend.LabelPool] != "0123456789abcdef" || a.Labels[backend.LabelScope] != "task:*" {
		t.Fatalf("member labels %v", a.Labels)
	}
	// A spec change is drift for the pool: the hash moves.
	cfg2, err := Parse([]byte(strings.Replace(src, "pool {", "env = { A = \"1\" }\n  pool {", 1)), "config.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if cfg2.Rules[0].PoolHash(owner) == h {
		t.Fatal("pool hash unchanged by an env change")
	}
}
