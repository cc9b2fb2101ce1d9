package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/berth-sh/berth/backend"
)

// Fuzz targets of the config's decoders (docs/fuzzing.md). Each checks what the
// decoder promises for every input: no panic; an error wraps backend.ErrInvalid and
// says where (file:line:col) or what (the input); an accepted value keeps the rules
// that the rest of berth relies on.

// fuzzDrivers are the drivers FuzzParse's configs may name: the built-in ones and
// one third-party driver.
var fuzzDrivers = append(slices.Clone(DefaultKnownDrivers), "fake")

// fuzzSchema is the schema FuzzParse decodes every driver block against: one field of
// each type DecodeDriverConfig knows, one of them required.
var fuzzSchema = []backend.ConfigField{
	{Name: "s", Type: "string"}, {Name: "n", Type: "number"}, {Name: "b", Type: "bool"},
	{Name: "d", Type: "duration"}, {Name: "l", Type: "list(string)"}, {Name: "req", Type: "string", Required: true},
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		goodConfig,
		"",
		`scope "*" { driver = "local" }`,
		`scope "chat:*" {
  image = "busybox"
  pull = "never"
  resources {
    cpus = 0.5
    memory = "1.5GiB"
    pids = 64
  }
  retention {
    on_close = "stop"
    idle_ttl = "1d12h"
    idle_action = "remove"
    max_age = "7d"
  }
}
scope "*" {}
`,
		`scope "sub:*" {
  isolation = "shared"
  name = "pool/a"
}
scope "sub2:*" {
  isolation = "shared"
  name = "pool/a"
}
`,
		`driver "fake" {
  plugin = "plugins/berth-driver-fake"
  sha256 = "` + strings.Repeat("ab", 32) + `"
  start_timeout = "3s"
  s = "x"
  n = 1e3
  b = true
  d = "2d"
  l = ["a", "b"]
  req = "r"
}
scope "*" { driver = "fake" }
`,
		`driver "docker" {
  req = 1
  l = [null]
  d = "-1s"
}
`,
		`state_dir = "~/state"
agent_path = "relative"
agent_timeout = "0"
output_max_total = "unlimited"
output_max_age = "999999999999d"
plugin_dirs = ["/a", "b"]
log_level = "loud"
`,
		`scope "a" {
  env = { "" = "x", "A=B" = "y", C = "\u0000" }
  env_passthrough = ["PATH", ""]
  mount {
    source = "/src"
    target = "dst"
  }
  max_output = 9223372036854775807
}
`,
		`scope "*" {}
scope "x" {}
scope "x" {}
scope "bad glob" {}
`,
		"scope \"${x}\" {\n  driver = local\n}\n",
		"scope \"*\" {\n  resources {\n    cpus = 1e999999\n    memory = 0.5\n    pids = 1.5\n  }\n}\n",
		"\xef\xbb\xbfscope \"*\" {}\n",
		"scope \"*\" { driver = \"local\" \n",
		"a = <<EOT\nx\nEOT\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		const file = "/etc/berth/fuzz.hcl"
		cfg, err := Parse(src, file, WithKnownDrivers(fuzzDrivers...))
		if err != nil {
			checkConfigError(t, err, file)
			return
		}
		checkConfig(t, cfg, file)
	})
}

// checkConfigError checks an error of Parse: a *Error wrapping ErrInvalid whose
// every diagnostic points into file.
func checkConfigError(t *testing.T, err error, file string) {
	t.Helper()
	var ce *Error
	if !errors.As(err, &ce) || !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("error %T %q is not a *Error wrapping ErrInvalid", err, err)
	}
	if len(ce.Diagnostics) == 0 || !ce.Diagnostics.HasErrors() {
		t.Fatalf("error %q holds no error diagnostic", err)
	}
	for _, d := range ce.Diagnostics {
		if d.Subject == nil || d.Subject.Filename != file || d.Subject.Start.Line < 1 || d.Subject.Start.Column < 1 {
			t.Fatalf("diagnostic %q has no position in %s: %+v", d.Summary, file, d.Subject)
		}
	}
	if !strings.HasPrefix(err.Error(), file+":") {
		t.Fatalf("error does not start with file:line:col: %q", err)
	}
}

// checkConfig checks the invariants of a config that Parse accepted.
func checkConfig(t *testing.T, cfg *Config, file string) {
	t.Helper()
	if len(cfg.Rules) == 0 {
		t.Fatal("an accepted config has no rules")
	}
	if !slices.IsSorted(cfg.KnownDrivers) {
		t.Errorf("KnownDrivers not sorted: %v", cfg.KnownDrivers)
	}
	for _, p := range []string{cfg.StateDir, cfg.AgentPath} {
		if p != "" && (!filepath.IsAbs(p) || filepath.Clean(p) != p) {
			t.Errorf("path %q is not absolute and clean", p)
		}
	}
	for _, p := range cfg.PluginDirs {
		if !filepath.IsAbs(p) {
			t.Errorf("plugin dir %q is not absolute", p)
		}
	}
	if cfg.AgentTimeout < 0 || cfg.OutputMaxAge < 0 || cfg.OutputMaxTotal < -1 {
		t.Errorf("negative setting: agent_timeout %v output_max_age %v output_max_total %d", cfg.AgentTimeout, cfg.OutputMaxAge, cfg.OutputMaxTotal)
	}
	if cfg.LogLevel != "" && !slices.Contains(LogLevels, cfg.LogLevel) {
		t.Errorf("log level %q", cfg.LogLevel)
	}
	for name, b := range cfg.Drivers {
		if name != b.Name || !slices.Contains(cfg.KnownDrivers, name) {
			t.Errorf("driver block %q (%q) is not a known driver", name, b.Name)
		}
		if b.StartTimeout < 0 || b.SHA256 != "" && len(b.SHA256) != 64 || b.Plugin != "" && strings.Contains(b.Plugin, "/") && !filepath.IsAbs(b.Plugin) {
			t.Errorf("driver block %q: %+v", name, b)
		}
		checkDriverConfig(t, cfg, name, file, fuzzSchema)
	}
	shared := map[string]string{}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		if r.Index != i || !slices.Contains(cfg.KnownDrivers, r.Driver) {
			t.Errorf("rule %d: index %d, driver %q (known %v)", i, r.Index, r.Driver, cfg.KnownDrivers)
		}
		if err := ValidateGlob(r.Glob); err != nil {
			t.Errorf("rule %d has an invalid glob: %v", i, err)
		}
		if !strings.HasPrefix(r.Pos(), file+":") && !(len(cfg.Rules) == 1 && r.Pos() == "(built-in default)") {
			t.Errorf("rule %d at %q", i, r.Pos())
		}
		switch r.Isolation {
		case IsolationSession:
			if r.Name != "" {
				t.Errorf("rule %d: a session-isolated rule with name %q", i, r.Name)
			}
		case IsolationShared:
			if err := ValidateSession(r.Name); err != nil {
				t.Errorf("rule %d: shared name: %v", i, err)
			}
			// Rules that share a sandbox ask for the same one.
			h := r.Driver + " " + SpecHash(r.Spec("", ""))
			if prev, ok := shared[r.Name]; ok && prev != h {
				t.Errorf("rule %d shares %q with a rule of another driver or spec", i, r.Name)
			}
			shared[r.Name] = h
		default:
			t.Errorf("rule %d: isolation %q", i, r.Isolation)
		}
		ret := r.Retention
		if !slices.Contains([]OnClose{OnCloseKeep, OnCloseStop, OnCloseRemove}, ret.OnClose) ||
			!slices.Contains([]IdleAction{IdleStop, IdleRemove}, ret.IdleAction) || ret.IdleTTL < 0 || ret.MaxAge < 0 {
			t.Errorf("rule %d: retention %+v", i, ret)
		}
		if r.Workdir != "" && !filepath.IsAbs(r.Workdir) {
			t.Errorf("rule %d: workdir %q", i, r.Workdir)
		}
		for _, m := range r.Mounts {
			if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
				t.Errorf("rule %d: mount %+v", i, m)
			}
		}
		res := r.Resources
		if res.CPUs < 0 || math.IsNaN(res.CPUs) || math.IsInf(res.CPUs, 0) || res.MemoryBytes < 0 || res.Pids < 0 || r.MaxOutput < 0 {
			t.Errorf("rule %d: resources %+v, max_output %d", i, res, r.MaxOutput)
		}
		if (r.Image == "") != (r.Pull == "") {
			t.Errorf("rule %d: image %q with pull %q", i, r.Image, r.Pull)
		}
		for k, v := range r.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
				t.Errorf("rule %d: env %q=%q", i, k, v)
			}
		}
		// A session that the rule's glob matches is matched by it or an earlier rule.
		name := strings.NewReplacer("*", "", "?", "q").Replace(r.Glob)
		if ValidateSession(name) == nil && GlobMatch(r.Glob, name) {
			got, j, err := cfg.Match(name)
			if err != nil || j > i || got != &cfg.Rules[j] || !GlobMatch(got.Glob, name) {
				t.Errorf("Match(%q) = rule %d, %v; rule %d (%q) matches it", name, j, err, i, r.Glob)
			}
			spec := r.Spec("0123456789abcdef0123456789abcdef", name)
			if err := backend.ValidateSandboxName(spec.Name); err != nil || spec.Name != r.SandboxName("0123456789abcdef0123456789abcdef", name) {
				t.Errorf("rule %d: sandbox name %q: %v", i, spec.Name, err)
			}
		}
	}
	if _, _, err := cfg.Match("../x"); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Match of an invalid name: %v", err)
	}
}

// checkDriverConfig decodes driver's block against schema: an error is a *Error
// pointing into file (a driver without a block has nothing to point at) or, for a
// schema of a type the host does not know, says the driver is at fault; a result is
// a JSON object of the schema's fields, typed as the schema says, with every
// required one.
func checkDriverConfig(t *testing.T, cfg *Config, driver, file string, schema []backend.ConfigField) {
	t.Helper()
	js, err := cfg.DriverConfig(driver, schema)
	if err != nil {
		var ce *Error
		switch {
		case !errors.Is(err, backend.ErrInvalid):
			t.Fatalf("DriverConfig(%q): %v does not wrap ErrInvalid", driver, err)
		case !errors.As(err, &ce):
			if !strings.Contains(err.Error(), "bug in the driver") {
				t.Fatalf("DriverConfig(%q): %v", driver, err)
			}
		case cfg.Drivers[driver] != nil:
			checkConfigError(t, err, file)
		}
		return
	}
	var out map[string]any
	if err := json.Unmarshal(js, &out); err != nil {
		t.Fatalf("DriverConfig(%q) = %q: %v", driver, js, err)
	}
	for _, f := range schema {
		if _, ok := out[f.Name]; f.Required && !ok {
			t.Errorf("DriverConfig(%q) = %s without the required field %q", driver, js, f.Name)
		}
	}
	for k, v := range out {
		// The last field of a name is the one decoded.
		i := -1
		for j, f := range schema {
			if f.Name == k {
				i = j
			}
		}
		if i < 0 {
			t.Fatalf("DriverConfig(%q) = %s: field %q is not in the schema", driver, js, k)
		}
		ok := false
		switch schema[i].Type {
		case "string":
			_, ok = v.(string)
		case "number":
			_, ok = v.(float64)
		case "bool":
			_, ok = v.(bool)
		case "duration":
			var s string
			if s, ok = v.(string); ok {
				d, err := time.ParseDuration(s)
				ok = err == nil && d >= 0
			}
		case "list(string)":
			var l []any
			if l, ok = v.([]any); ok {
				for _, e := range l {
					_, isStr := e.(string)
					ok = ok && isStr
				}
			}
		}
		if !ok {
			t.Errorf("DriverConfig(%q) = %s: field %q is not a %s", driver, js, k, schema[i].Type)
		}
	}
}

// FuzzDriverConfig decodes the driver blocks of a config against a schema that a
// (hostile or broken) plugin declares, as package backends hands it over: the
// plugin's ConfigSchemaResponse fields copied one to one into backend.ConfigField
// values (here their JSON form, so that this package's tests need none of the
// plugin protocol's code).
func FuzzDriverConfig(f *testing.F) {
	for _, c := range []struct {
		src    string
		schema []backend.ConfigField
	}{
		{"driver \"fake\" {\n  x = \"1\"\n  n = 2\n}\n", []backend.ConfigField{{Name: "x", Type: "string"}, {Name: "n", Type: "number", Required: true}}},
		{"driver \"fake\" {\n  d = \"7d\"\n  l = [\"a\"]\n  b = false\n}\n", []backend.ConfigField{{Name: "d", Type: "duration"}, {Name: "l", Type: "list(string)"}, {Name: "b", Type: "bool"}}},
		{"driver \"fake\" {\n  x = 1\n}\n", []backend.ConfigField{{Name: "x", Type: "string"}, {Name: "x", Type: "number"}}},
		{"driver \"fake\" {\n  x = 1\n}\n", []backend.ConfigField{{Name: "x", Type: "map(string)"}}},
		{"driver \"fake\" {\n  plugin = \"/p\"\n  sub {\n  }\n}\n", []backend.ConfigField{{Name: "", Type: "string", Required: true}, {Name: "plugin", Type: "string", Required: true}}},
		{"", []backend.ConfigField{{Name: "req", Type: "string", Required: true}}},
	} {
		schema, err := json.Marshal(c.schema)
		if err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(c.src), schema)
	}
	f.Fuzz(func(t *testing.T, src, schemaJSON []byte) {
		var schema []backend.ConfigField
		if json.Unmarshal(schemaJSON, &schema) != nil {
			return
		}
		const file = "/etc/berth/fuzz.hcl"
		cfg, err := Parse(src, file, WithKnownDrivers(fuzzDrivers...))
		if err != nil {
			return
		}
		for _, name := range []string{"fake", "local"} {
			checkDriverConfig(t, cfg, name, file, schema)
		}
	})
}

// durationUnitNS are the units of ParseDuration in nanoseconds, for the reference.
var durationUnitNS = map[string]int64{
	"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9, "d": 24 * 3600e9,
}

// exactDuration is the reference ParseDuration: the exact value of s in nanoseconds
// and the number of its parts, or ok false when s is not of the accepted form.
func exactDuration(s string) (exact *big.Rat, parts int, ok bool) {
	t := strings.TrimSpace(s)
	if t == "0" {
		return new(big.Rat), 1, true
	}
	if t == "" {
		return nil, 0, false
	}
	total := new(big.Rat)
	for t != "" {
		i := strings.IndexFunc(t, func(r rune) bool { return r != '.' && (r < '0' || r > '9') })
		if i <= 0 {
			return nil, 0, false
		}
		num := t[:i]
		t = t[i:]
		j := strings.IndexFunc(t, func(r rune) bool { return r == '.' || r >= '0' && r <= '9' })
		if j < 0 {
			j = len(t)
		}
		unit := t[:j]
		t = t[j:]
		ns, ok := durationUnitNS[unit]
		v, vok := exactDecimal(num)
		if !ok || !vok {
			return nil, 0, false
		}
		total.Add(total, v.Mul(v, new(big.Rat).SetInt64(ns)))
		parts++
	}
	return total, parts, true
}

// exactDecimal parses digits with at most one ".", and at least one digit.
func exactDecimal(num string) (*big.Rat, bool) {
	whole, frac, _ := strings.Cut(num, ".")
	if whole+frac == "" || strings.Contains(frac, ".") {
		return nil, false
	}
	v, ok := new(big.Rat).SetString("0" + whole + "." + frac + "0")
	return v, ok
}

func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{
		"0", "90s", "36h", "1h30m", "7d", "1d12h", "1.5d", ".5s", "5.s", "1µs", "1us", "250ms",
		"-1s", "+1s", "", " ", "1", "d", "1x", "1.2.3s", "..s",
		"106751d", "106751.99116730063d", "106751.991167300641d", "106752d", "999999999999d",
		"2562047h47m16.854775807s", "2562047h47m16.854775808s", "9223372036854775807ns", "9223372036854775808ns",
		"106751d23h47m16s", "106751d23h47m17s", "1d2562047h", "0.000000000000000000001h",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		exact, parts, ok := exactDuration(s)
		max := new(big.Rat).SetInt64(math.MaxInt64)
		if err != nil {
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
				t.Fatalf("ParseDuration(%q): the error does not name the input: %v", s, err)
			}
			// Refused: not of the form, or too large (the reference allows for the
			// rounding of fractional days next to the limit).
			if ok && exact.Cmp(new(big.Rat).Sub(max, new(big.Rat).Mul(max, big.NewRat(1, 1<<48)))) < 0 {
				t.Fatalf("ParseDuration(%q) refused a duration of %s ns: %v", s, exact.FloatString(0), err)
			}
			return
		}
		if d < 0 {
			t.Fatalf("ParseDuration(%q) = %v: negative (an overflow wrapped)", s, d)
		}
		if !ok {
			t.Fatalf("ParseDuration(%q) = %v, but it is not of the documented form", s, d)
		}
		if exact.Cmp(max) > 0 {
			t.Fatalf("ParseDuration(%q) = %v, but the duration is %s ns, more than the largest", s, d, exact.FloatString(0))
		}
		// time.ParseDuration truncates each part to the nanosecond; fractional days
		// are computed in float64.
		diff := new(big.Rat).Sub(exact, new(big.Rat).SetInt64(int64(d)))
		tol := new(big.Rat).Add(big.NewRat(int64(parts), 1), new(big.Rat).Mul(exact, big.NewRat(1, 1<<48)))
		if diff.Abs(diff).Cmp(tol) > 0 {
			t.Fatalf("ParseDuration(%q) = %d ns, want %s", s, d, exact.FloatString(3))
		}
		// Go's own rendering of the result reads back as the same duration.
		if back, err := ParseDuration(d.String()); err != nil || back != d {
			t.Fatalf("ParseDuration(%q) = %v, whose String reads back as %v, %v", s, d, back, err)
		}
	})
}

// exactBytes is the reference ParseBytes: the exact size, or ok false when s is not
// of the accepted form.
func exactBytes(s string) (*big.Rat, bool) {
	t := strings.ToLower(strings.TrimSpace(s))
	i := strings.IndexFunc(t, func(r rune) bool { return r != '.' && (r < '0' || r > '9') })
	if i < 0 {
		i = len(t)
	}
	v, ok := exactDecimal(t[:i])
	mult, uok := byteUnits[t[i:]]
	if !ok || !uok {
		return nil, false
	}
	return v.Mul(v, new(big.Rat).SetFloat64(mult)), true
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{
		"1048576", "512m", "2g", "1.5GiB", "64KB", "1t", "1TiB", " 7 ", "0", "0.5", "1.5", "1k5", "k", "", "-1", "1e3",
		"99999999999999999999999t", "1.0000000000000000001k",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBytes(s)
		exact, ok := exactBytes(s)
		if err != nil {
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
				t.Fatalf("ParseBytes(%q): the error does not name the input: %v", s, err)
			}
			if ok && exact.IsInt() && exact.Cmp(big.NewRat(1, 1)) >= 0 && exact.Cmp(new(big.Rat).SetInt64(math.MaxInt64/2)) <= 0 {
				t.Fatalf("ParseBytes(%q) refused %s bytes: %v", s, exact.FloatString(0), err)
			}
			return
		}
		if !ok {
			t.Fatalf("ParseBytes(%q) = %d, but it is not of the documented form", s, n)
		}
		if n < 1 || n > math.MaxInt64/2 {
			t.Fatalf("ParseBytes(%q) = %d: out of range", s, n)
		}
		// A size written as a whole number is exact; one with a fraction is within
		// float64's precision of the exact value.
		if !strings.Contains(s, ".") && exact.Cmp(new(big.Rat).SetInt64(n)) != 0 {
			t.Fatalf("ParseBytes(%q) = %d, want %s", s, n, exact.FloatString(0))
		}
		diff := new(big.Rat).Sub(exact, new(big.Rat).SetInt64(n))
		if diff.Abs(diff).Cmp(new(big.Rat).Mul(exact, big.NewRat(1, 1<<50))) > 0 {
			t.Fatalf("ParseBytes(%q) = %d, want %s", s, n, exact.FloatString(3))
		}
	})
}

func FuzzSessionName(f *testing.F) {
	for _, s := range []string{
		"main", "chat:4711", "subagent:4711/2", "a@b.c_d-e", "a..b", "x/.y", strings.Repeat("a", 128), strings.Repeat("a", 129),
		"", "/", "/main", "a//b", "a/", "a/./b", "a/../b", "..", ".", "a b", "a\x00b", "a\nb", "a\x1b[31mb", "chat:général",
		"chat:ge\u0301ne\u0301ral", "a\u200bb", "a\u202eb", "\xff", "a*", "a?",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := ValidateSession(name)
		if err != nil {
			if !errors.Is(err, backend.ErrInvalid) {
				t.Fatalf("ValidateSession(%q): %v does not wrap ErrInvalid", name, err)
			}
			for _, r := range err.Error() {
				if !unicode.IsPrint(r) && r != ' ' {
					t.Fatalf("ValidateSession(%q): the error holds the unprintable %q: %q", name, r, err)
				}
			}
			return
		}
		if !utf8.ValidString(name) {
			t.Fatalf("ValidateSession accepted %q, which is not UTF-8", name)
		}
		if utf8.RuneCountInString(name) > MaxSessionLen || strings.HasPrefix(name, "/") {
			t.Fatalf("ValidateSession accepted %q", name)
		}
		for _, part := range strings.Split(name, "/") {
			if part == "" || part == "." || part == ".." {
				t.Fatalf("ValidateSession accepted %q with the path component %q", name, part)
			}
		}
		for _, r := range name {
			if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '*' || r == '?' || r == '\\' {
				t.Fatalf("ValidateSession accepted %q with the character %q", name, r)
			}
		}
		const owner = "0123456789abcdef0123456789abcdef"
		sb, shared := SandboxName(owner, name), SharedSandboxName(owner, name)
		for _, n := range []string{sb, shared} {
			if err := backend.ValidateSandboxName(n); err != nil {
				t.Fatalf("sandbox name of %q: %v", name, err)
			}
		}
		if sb == shared {
			t.Fatalf("session %q and the shared rule named so get one sandbox %s", name, sb)
		}
		// A name is a glob that matches itself, and "*" matches every name.
		if err := ValidateGlob(name); err != nil || !GlobMatch(name, name) || !GlobMatch("*", name) {
			t.Fatalf("glob %q: %v; matches itself %v, * matches it %v", name, err, GlobMatch(name, name), GlobMatch("*", name))
		}
	})
}

// refMatch is the reference glob match: * any run of characters, ? one character,
// by dynamic programming over runes.
func refMatch(glob, name string) bool {
	n := []rune(name)
	// m[j]: the glob so far matches name[:j].
	m := make([]bool, len(n)+1)
	m[0] = true
	for _, c := range glob {
		next := make([]bool, len(n)+1)
		for j := 0; j <= len(n); j++ {
			switch {
			case c == '*':
				next[j] = m[j] || j > 0 && next[j-1]
			case j > 0 && (c == '?' || c == n[j-1]):
				next[j] = m[j-1]
			}
		}
		m = next
	}
	return m[len(n)]
}

func FuzzGlobMatch(f *testing.F) {
	for _, c := range [][2]string{
		{"*", "main"}, {"chat:*", "chat:1"}, {"chat:*", "chat:"}, {"sub?:*", "sub1:x/y"}, {"a*b*c", "aXbYc"}, {"a*b*c", "abcb"},
		{"*a*a*a*a*b", strings.Repeat("a", 100)}, {"?", "é"}, {"??", "é"}, {"*/*", "a/b/c"}, {"main", "main2"}, {"", "x"},
		{"x", "x"}, {"a*", "b"}, {"**?", "a"}, {"*?*?", "a"},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, glob, name string) {
		if ValidateGlob(glob) != nil || ValidateSession(name) != nil {
			return
		}
		if got, want := GlobMatch(glob, name), refMatch(glob, name); got != want {
			t.Fatalf("GlobMatch(%q, %q) = %v, want %v", glob, name, got, want)
		}
	})
}
