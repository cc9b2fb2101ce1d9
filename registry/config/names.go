package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/berth-sh/berth/backend"
)

// MaxSessionLen is the longest session name, in bytes (every allowed character is
// one byte).
const MaxSessionLen = 128

// maxGlobLen bounds a scope glob, in bytes.
const maxGlobLen = 256

// sessionRule is the rule text that ValidateSession's errors quote.
const sessionRule = "a session name is 1 to 128 characters of A-Z a-z 0-9 . _ - : @ /, " +
	"with no empty, \".\" or \"..\" path component and no leading \"/\""

func sessionChar(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-' || c == ':' || c == '@' || c == '/'
}

// quoteInput quotes a user-supplied name for an error message, shortening a long one
// to its head and its length.
func quoteInput(s string) string {
	if len(s) <= 64 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q… (%d characters)", s[:48], len(s))
}

// ValidateSession checks a session name against DESIGN.md's rules: 1–128 characters
// of A–Z a–z 0–9 . _ - : @ /, no empty, "." or ".." component between slashes, no
// leading "/". The error wraps backend.ErrInvalid, names the input and states the rule.
func ValidateSession(name string) error {
	bad := func(why string) error {
		return backend.Errorf(backend.ErrInvalid, "session name %s: %s; %s", quoteInput(name), why, sessionRule)
	}
	switch {
	case name == "":
		return bad("is empty")
	case len(name) > MaxSessionLen:
		return bad(fmt.Sprintf("is %d characters long", len(name)))
	case name[0] == '/':
		return bad("starts with \"/\"")
	}
	for i := 0; i < len(name); i++ {
		if !sessionChar(name[i]) {
			r := []rune(name[i:])[0]
			return bad(fmt.Sprintf("character %q at byte %d is not allowed", r, i+1))
		}
	}
	for _, part := range strings.Split(name, "/") {
		switch part {
		case "":
			return bad("has an empty path component (\"//\" or a trailing \"/\")")
		case ".", "..":
			return bad(fmt.Sprintf("has a %q path component", part))
		}
	}
	return nil
}

// SandboxName returns the sandbox name of a session-isolated session or a shared
// rule's name for the installation owner: "b-" + the first 8 hex digits of
// sha256(owner) + "-" + the first 16 hex digits of sha256(key). The result is 27
// characters of a–z 0–9 -, valid for every driver, and contains no raw session text.
//
// Shared rules' sandboxes are named by SharedSandboxName, so a session called like a
// shared rule's name never lands in that rule's sandbox.
func SandboxName(owner, key string) string {
	o := sha256.Sum256([]byte(owner))
	k := sha256.Sum256([]byte(key))
	return "b-" + hex.EncodeToString(o[:])[:8] + "-" + hex.EncodeToString(k[:])[:16]
}

// SharedSandboxName returns the sandbox name of the shared rule named name:
// SandboxName(owner, "\x00shared\x00"+name). A NUL cannot occur in a session name,
// so it never equals a session-isolated sandbox's name.
func SharedSandboxName(owner, name string) string {
	return SandboxName(owner, "\x00shared\x00"+name)
}

// ValidateGlob checks a scope glob: 1–256 characters of the session alphabet
// (A–Z a–z 0–9 . _ - : @ /) plus the wildcards * and ?. The error wraps
// backend.ErrInvalid and names the glob and the offending character.
func ValidateGlob(glob string) error {
	if glob == "" {
		return backend.Errorf(backend.ErrInvalid, "scope glob is empty; use \"*\" to match every session")
	}
	if len(glob) > maxGlobLen {
		return backend.Errorf(backend.ErrInvalid, "scope glob %s is longer than %d characters", quoteInput(glob), maxGlobLen)
	}
	for i := 0; i < len(glob); i++ {
		c := glob[i]
		if c == '*' || c == '?' || sessionChar(c) {
			continue
		}
		r := []rune(glob[i:])[0]
		return backend.Errorf(backend.ErrInvalid,
			"scope glob %s: character %q at byte %d is not allowed; a glob is made of A-Z a-z 0-9 . _ - : @ / and the wildcards * (any run of characters) and ? (one character)",
			quoteInput(glob), r, i+1)
	}
	return nil
}

// GlobMatch reports whether glob matches the whole of name. In glob, * matches any
// run of characters including "/" and ":" (also the empty run), ? matches exactly one
// character, and every other character matches itself. The match runs in
// O(len(glob)·len(name)) time at worst.
func GlobMatch(glob, name string) bool {
	g, n := 0, 0
	starG, starN := -1, 0
	for n < len(name) {
		switch {
		case g < len(glob) && glob[g] == '*':
			starG, starN = g, n
			g++
		case g < len(glob) && (glob[g] == '?' || glob[g] == name[n]):
			g++
			n++
		case starG >= 0:
			// Let the last * swallow one more character and retry.
			starN++
			g, n = starG+1, starN
		default:
			return false
		}
	}
	for g < len(glob) && glob[g] == '*' {
		g++
	}
	return g == len(glob)
}
