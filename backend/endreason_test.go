package backend_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/berth-sh/berth/backend"
)

func TestSanitizeEndMessage(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"OOMKilled", "OOMKilled"},
		{"  The node was low on resource: memory.  ", "The node was low on resource: memory."},
		{"a\n\tb\x1b[31mc\x00d", "a b [31mc d"},
		{"bad \xff utf-8", "bad utf-8"},
		{"Ünïcode stays", "Ünïcode stays"},
		{strings.Repeat("y", backend.MaxEndMessage), strings.Repeat("y", backend.MaxEndMessage)},
	} {
		if got := backend.SanitizeEndMessage(c.in); got != c.want {
			t.Errorf("SanitizeEndMessage(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	long := strings.Repeat("é", backend.MaxEndMessage) // 2 bytes each
	got := backend.SanitizeEndMessage(long)
	if len(got) > backend.MaxEndMessage || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
		t.Errorf("SanitizeEndMessage of %d bytes = %d bytes %q, want at most %d valid bytes ending in ...", len(long), len(got), got, backend.MaxEndMessage)
	}
}
