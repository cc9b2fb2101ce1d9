package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/berth-sh/berth/backend"
)

func TestValidateSession(t *testing.T) {
	good := []string{"main", "chat:4711", "subagent:4711/2", "a", "A.b_c-d:e@f/g", "x/..y", "..a", strings.Repeat("x", 128), "a/b/c", "@", "-",
		"chat:général", "café", "チャット:1", "канал/2", "emoji:🎉", "math:∑", strings.Repeat("é", 128), ".\u0301", "x/..\u0301"}
	for _, s := range good {
		if err := ValidateSession(s); err != nil {
			t.Errorf("ValidateSession(%q) = %v, want nil", s, err)
		}
	}
	bad := map[string]string{
		"":                       "is empty",
		"..":                     `".." path component`,
		".":                      `"." path component`,
		"a/../b":                 `".." path component`,
		"a/./b":                  `"." path component`,
		"a/..":                   `".." path component`,
		"/main":                  `starts with "/"`,
		"a//b":                   "empty path component",
		"a/":                     "empty path component",
		strings.Repeat("x", 129): "is 129 characters long",
		strings.Repeat("y", 300): "is 300 characters long",
		"chat 1":                 `character ' ' (U+0020) at position 5`,
		"a\x00b":                 `character '\x00' (U+0000) at position 2`,
		"name*":                  `character '*' at position 5`,
		"a\u200bb":               `character '\u200b' (U+200B) at position 2`, // zero-width space, Cf
		"a\u202eb":               `(U+202E) at position 2`,                    // right-to-left override, Cf
		"a\ufeffb":               `(U+FEFF) at position 2`,                    // BOM, Cf
		"a\u2028b":               `(U+2028) at position 2`,                    // line separator, Zl
		"a\u2029b":               `(U+2029) at position 2`,                    // paragraph separator, Zp
		"a\u00a0b":               `(U+00A0) at position 2`,                    // no-break space, Zs
		"a\u3000b":               `(U+3000) at position 2`,                    // ideographic space, Zs
		"a\u0085b":               `(U+0085) at position 2`,                    // next line, Cc
		"a\ue000b":               `(U+E000) at position 2`,                    // private use, Co
		"a\U000e0001b":           `(U+E0001) at position 2`,                   // language tag, Cf
		"a\ufffdb":               `(U+FFFD) at position 2`,                    // replacement character
		"a\xffb":                 "is not valid UTF-8",
		"chat:#général":          `character '#' at position 6`, // ASCII keeps its alphabet
		"é/\u0000":               `(U+0000) at position 3`,
		strings.Repeat("é", 129): "is 129 characters long",
		"/é":                     `starts with "/"`,
		"é//x":                   "empty path component",
	}
	for s, why := range bad {
		err := ValidateSession(s)
		if err == nil {
			t.Errorf("ValidateSession(%q) = nil, want error", s)
			continue
		}
		if !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("ValidateSession(%q) = %v, does not wrap ErrInvalid", s, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, why) || !strings.Contains(msg, "1 to 128 characters: A-Z a-z 0-9 . _ - : @ / and printable non-ASCII characters") {
			t.Errorf("ValidateSession(%q) = %q, want it to say %q and state the rule", s, msg, why)
		}
		named := fmt.Sprintf("%q", s)
		if r := []rune(s); len(r) > 64 {
			named = fmt.Sprintf("%q… (%d characters)", string(r[:48]), len(r))
		}
		if !strings.Contains(msg, "session name "+named) {
			t.Errorf("ValidateSession(%q) = %q, does not name the input as %s", s, msg, named)
		}
	}
}

func TestSandboxName(t *testing.T) {
	a := SandboxName("owner1", "chat:1")
	if !regexp.MustCompile(`^b-[0-9a-f]{8}-[0-9a-f]{16}$`).MatchString(a) {
		t.Fatalf("SandboxName = %q, bad shape", a)
	}
	if err := backend.ValidateSandboxName(a); err != nil {
		t.Fatal(err)
	}
	// sha256("owner1")[:8] and sha256("chat:1")[:16], computed independently.
	if a != "b-"+sha("owner1")[:8]+"-"+sha("chat:1")[:16] {
		t.Fatalf("SandboxName = %q", a)
	}
	if SandboxName("owner1", "chat:2") == a || SandboxName("owner2", "chat:1") == a {
		t.Fatal("different inputs gave the same sandbox name")
	}
	if strings.Contains(a, "chat") {
		t.Fatal("raw session text in the sandbox name")
	}
}

func TestGlobMatch(t *testing.T) {
	cases := []struct {
		glob, name string
		want       bool
	}{
		{"*", "main", true},
		{"*", "a/b:c", true},
		{"chat:*", "chat:4711", true},
		{"chat:*", "chat:", true},
		{"chat:*", "chat", false},
		{"chat:*", "xchat:1", false},
		{"chat:*", "chat:1/2", true}, // * crosses / and :
		{"sub*/2", "subagent:4711/2", true},
		{"sub*/2", "subagent:4711/23", false},
		{"?", "a", true},
		{"?", "", false},
		{"?", "ab", false},
		{"chat:?", "chat:7", true},
		{"chat:?", "chat:77", false},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "aXbY", false},
		{"a*b*c", "acb", false},
		{"*.x", "a.b.x", true},
		{"main", "main", true},
		{"main", "mainx", false},
		{"main", "Main", false},
		{"**", "", true},
		{"a**", "a", true},
		{"*a*a*a*a*b", strings.Repeat("a", 60), false}, // backtracking stays bounded
		// ? and * count characters, not bytes.
		{"chat:?", "chat:é", true},
		{"chat:??", "chat:é", false},
		{"chat:?", "chat:🎉", true},
		{"?????", "チャット:", true},
		{"*ral", "chat:général", true},
		{"chat:g?n?ral", "chat:général", true},
		{"chat:g*n?ral", "chat:gén", false},
		{"é", "é", true},
		{"é", "è", false}, // same first byte (0xC3), different character
		{"*è", "é", false},
		{"チ*", "チャット", true},
		{"*?", "🎉", true},
	}
	for _, c := range cases {
		if got := GlobMatch(c.glob, c.name); got != c.want {
			t.Errorf("GlobMatch(%q, %q) = %v, want %v", c.glob, c.name, got, c.want)
		}
	}
}

func TestValidateGlob(t *testing.T) {
	for _, g := range []string{"*", "chat:*", "sub?/x", "a.b_c-d@e/f", "chat:général*", "チャット:?"} {
		if err := ValidateGlob(g); err != nil {
			t.Errorf("ValidateGlob(%q) = %v", g, err)
		}
	}
	for g, why := range map[string]string{
		"":                       "empty",
		"chat[0-9]":              `'['`,
		"a b":                    `' '`,
		"x{y}":                   `'{'`,
		strings.Repeat("a", 257): "longer than 256",
		strings.Repeat("é", 257): "longer than 256",
		"chat:\u200b*":           "(U+200B) at position 6",
		"a\xff":                  "not valid UTF-8",
	} {
		err := ValidateGlob(g)
		if err == nil || !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), why) {
			t.Errorf("ValidateGlob(%q) = %v, want ErrInvalid saying %q", g, err, why)
		}
	}
}

// TestSharedSandboxNameIsSeparate: a session named like a shared rule's name gets its
// own sandbox, not the shared one.
func TestSharedSandboxNameIsSeparate(t *testing.T) {
	if SharedSandboxName("o", "tools") == SandboxName("o", "tools") {
		t.Fatal("shared rule name and session name map to the same sandbox")
	}
	if err := backend.ValidateSandboxName(SharedSandboxName("o", "tools")); err != nil {
		t.Fatal(err)
	}
}

// TestNormalizeSession: a name is the same session whether it is typed in NFC or NFD
// (é as one code point or as e + U+0301), so both give the NFC form, the same
// sandbox name and the same rule; the length limit counts characters of the NFC
// form, not bytes.
func TestNormalizeSession(t *testing.T) {
	nfc, nfd := "chat:g\u00e9n\u00e9ral", "chat:ge\u0301ne\u0301ral"
	a, err := NormalizeSession(nfc)
	if err != nil || a != nfc {
		t.Fatalf("NormalizeSession(NFC) = %q, %v", a, err)
	}
	b, err := NormalizeSession(nfd)
	if err != nil || b != nfc {
		t.Fatalf("NormalizeSession(NFD) = %q, %v; want the NFC form %q", b, err, nfc)
	}
	if SandboxName("o", a) != SandboxName("o", b) {
		t.Fatal("NFC and NFD spellings give different sandbox names")
	}
	// 128 characters of NFD that compose to 64: within the limit; 129 é in NFD
	// (258 code points) compose to 129: over it.
	if _, err := NormalizeSession(strings.Repeat("e\u0301", 64)); err != nil {
		t.Errorf("64 é in NFD: %v", err)
	}
	if _, err := NormalizeSession(strings.Repeat("e\u0301", 129)); err == nil || !strings.Contains(err.Error(), "is 129 characters long") {
		t.Errorf("129 é in NFD: %v, want 129 characters", err)
	}
	// 128 four-byte characters are 512 bytes: allowed.
	if _, err := NormalizeSession(strings.Repeat("🎉", 128)); err != nil {
		t.Errorf("128 emoji: %v", err)
	}

	cfg, err := Parse([]byte("scope \"chat:ge\u0301n*\" {\n}\nscope \"*\" {\n  isolation = \"shared\"\n  name = \"re\u0301st\"\n}\n"), "c.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rules[0].Glob != "chat:g\u00e9n*" || cfg.Rules[1].Name != "r\u00e9st" {
		t.Errorf("the config's glob %q and shared name %q are not in NFC", cfg.Rules[0].Glob, cfg.Rules[1].Name)
	}
	for _, s := range []string{nfc, nfd} {
		if _, idx, err := cfg.Match(s); err != nil || idx != 0 {
			t.Errorf("Match(%q) = rule %d, %v; want rule 0 (its glob is written in NFD)", s, idx, err)
		}
	}
}
