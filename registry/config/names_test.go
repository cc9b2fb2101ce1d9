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
	good := []string{"main", "chat:4711", "subagent:4711/2", "a", "A.b_c-d:e@f/g", "x/..y", "..a", strings.Repeat("x", 128), "a/b/c", "@", "-"}
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
		"chat 1":                 `character ' ' at byte 5`,
		"café":                   `character 'é' at byte 4`,
		"a\x00b":                 `character '\x00' at byte 2`,
		"name*":                  `character '*' at byte 5`,
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
		if !strings.Contains(msg, why) || !strings.Contains(msg, "1 to 128 characters of A-Z a-z 0-9 . _ - : @ /") {
			t.Errorf("ValidateSession(%q) = %q, want it to say %q and state the rule", s, msg, why)
		}
		named := fmt.Sprintf("%q", s)
		if len(s) > 64 {
			named = fmt.Sprintf("%q… (%d characters)", s[:48], len(s))
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
	}
	for _, c := range cases {
		if got := GlobMatch(c.glob, c.name); got != c.want {
			t.Errorf("GlobMatch(%q, %q) = %v, want %v", c.glob, c.name, got, c.want)
		}
	}
}

func TestValidateGlob(t *testing.T) {
	for _, g := range []string{"*", "chat:*", "sub?/x", "a.b_c-d@e/f"} {
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
