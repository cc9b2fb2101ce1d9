package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/berth-sh/berth/backend"
	"golang.org/x/text/unicode/norm"
)

// MaxSessionLen is the longest session name, in characters (Unicode code points of
// its NFC form): at most 4·MaxSessionLen = 512 bytes of UTF-8.
const MaxSessionLen = 128

// maxGlobLen bounds a scope glob, in characters (code points of its NFC form).
const maxGlobLen = 256

// sessionRule is the rule text that ValidateSession's errors quote.
const sessionRule = "a session name is 1 to 128 characters: A-Z a-z 0-9 . _ - : @ / and " +
	"printable non-ASCII characters (letters, marks, digits, punctuation, symbols; no spaces, " +
	"control or format characters), compared in Unicode NFC, " +
	"with no empty, \".\" or \"..\" path component and no leading \"/\""

// sessionChar reports whether r may occur in a session name: the ASCII alphabet
// A–Z a–z 0–9 . _ - : @ / (ASCII punctuation such as * ? [ and the space stay out,
// so globs stay unambiguous and names stay shell-friendly), or a printable non-ASCII
// character: a letter, mark, number, punctuation or symbol (unicode.IsPrint, which
// leaves out every space, control (Cc), format (Cf), line and paragraph separator
// (Zl, Zp), private-use, surrogate and unassigned code point). U+FFFD, which is also
// what invalid UTF-8 decodes to, is refused.
func sessionChar(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' ||
			r == '.' || r == '_' || r == '-' || r == ':' || r == '@' || r == '/'
	}
	return r != utf8.RuneError && unicode.IsPrint(r)
}

// quoteInput quotes a user-supplied name for an error message, shortening a long one
// to its first 48 characters and its length in characters.
func quoteInput(s string) string {
	n := utf8.RuneCountInString(s)
	if n <= 64 {
		return fmt.Sprintf("%q", s)
	}
	head, count := s, 0
	for i := range s {
		if count == 48 {
			head = s[:i]
			break
		}
		count++
	}
	return fmt.Sprintf("%q… (%d characters)", head, n)
}

// NormalizeSession returns name in Unicode Normalization Form C, the form in which
// session names are compared, hashed, stored and labelled, after checking it against
// DESIGN.md's rules (see ValidateSession). A name typed in NFD ("e" + U+0301) and one
// in NFC ("é") are the same session. Errors wrap backend.ErrInvalid, name the input
// and state the rule.
func NormalizeSession(name string) (string, error) {
	n := norm.NFC.String(name)
	bad := func(why string) (string, error) {
		return "", backend.Errorf(backend.ErrInvalid, "session name %s: %s; %s", quoteInput(name), why, sessionRule)
	}
	if name == "" {
		return bad("is empty")
	}
	if !utf8.ValidString(name) {
		return bad("is not valid UTF-8")
	}
	if count := utf8.RuneCountInString(n); count > MaxSessionLen {
		return bad(fmt.Sprintf("is %d characters long", count))
	}
	if n[0] == '/' {
		return bad("starts with \"/\"")
	}
	pos := 0
	for _, r := range n {
		pos++
		if !sessionChar(r) {
			return bad(fmt.Sprintf("character %s at position %d is not allowed", describeRune(r), pos))
		}
	}
	for _, part := range strings.Split(n, "/") {
		switch part {
		case "":
			return bad("has an empty path component (\"//\" or a trailing \"/\")")
		case ".", "..":
			return bad(fmt.Sprintf("has a %q path component", part))
		}
	}
	return n, nil
}

// describeRune names r for an error: quoted, with its code point when it is not
// plain printable ASCII.
func describeRune(r rune) string {
	if r >= 0x21 && r < 0x7f {
		return fmt.Sprintf("%q", r)
	}
	return fmt.Sprintf("%q (U+%04X)", r, r)
}

// ValidateSession checks a session name against DESIGN.md's rules: 1–128 characters
// (code points, counted in NFC) of A–Z a–z 0–9 . _ - : @ / and printable non-ASCII
// characters (no space, control, format or separator characters), no empty, "." or
// ".." component between slashes, no leading "/". The rules apply to the name's NFC
// form, which is what every Registry call uses (NormalizeSession returns it). The
// error wraps backend.ErrInvalid, names the input and states the rule.
func ValidateSession(name string) error {
	_, err := NormalizeSession(name)
	return err
}

// SandboxName returns the sandbox name of a session-isolated session or a shared
// rule's name for the installation owner: "b-" + the first 8 hex digits of
// sha256(owner) + "-" + the first 16 hex digits of sha256(key). The result is 27
// characters of a–z 0–9 -, valid for every driver, and contains no raw session text.
// key is hashed as given: callers pass the NFC form (NormalizeSession).
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

// NormalizeGlob returns a scope glob in NFC (so that it matches names typed in NFD
// or NFC alike; see NormalizeSession) after checking it: 1–256 characters of the
// session alphabet plus the wildcards * and ?. The error wraps backend.ErrInvalid
// and names the glob and the offending character.
func NormalizeGlob(glob string) (string, error) {
	if glob == "" {
		return "", backend.Errorf(backend.ErrInvalid, "scope glob is empty; use \"*\" to match every session")
	}
	if !utf8.ValidString(glob) {
		return "", backend.Errorf(backend.ErrInvalid, "scope glob %s is not valid UTF-8", quoteInput(glob))
	}
	g := norm.NFC.String(glob)
	if utf8.RuneCountInString(g) > maxGlobLen {
		return "", backend.Errorf(backend.ErrInvalid, "scope glob %s is longer than %d characters", quoteInput(glob), maxGlobLen)
	}
	pos := 0
	for _, r := range g {
		pos++
		if r == '*' || r == '?' || sessionChar(r) {
			continue
		}
		return "", backend.Errorf(backend.ErrInvalid,
			"scope glob %s: character %s at position %d is not allowed; a glob is made of the characters of session names (A-Z a-z 0-9 . _ - : @ / and printable non-ASCII characters) and the wildcards * (any run of characters) and ? (one character)",
			quoteInput(glob), describeRune(r), pos)
	}
	return g, nil
}

// ValidateGlob checks a scope glob as NormalizeGlob does.
func ValidateGlob(glob string) error {
	_, err := NormalizeGlob(glob)
	return err
}

// GlobMatch reports whether glob matches the whole of name. In glob, * matches any
// run of characters including "/" and ":" (also the empty run), ? matches exactly one
// character (a Unicode code point, not a byte), and every other character matches
// itself. Both are compared as given (byte for byte per character): Config's globs
// and the Registry's session names are in NFC. The match runs in
// O(len(glob)·len(name)) time at worst.
func GlobMatch(glob, name string) bool {
	g, n := 0, 0
	starG, starN := -1, 0
	for n < len(name) {
		_, w := utf8.DecodeRuneInString(name[n:]) // the name's next character: name[n:n+w]
		switch {
		case g < len(glob) && glob[g] == '*':
			starG, starN = g, n
			g++
		case g < len(glob) && glob[g] == '?':
			g++
			n += w
		case strings.HasPrefix(glob[g:], name[n:n+w]):
			g += w
			n += w
		case starG >= 0:
			// Let the last * swallow one more character and retry.
			_, sw := utf8.DecodeRuneInString(name[starN:])
			starN += sw
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
