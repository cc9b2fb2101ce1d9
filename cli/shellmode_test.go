package cli

import (
	"strings"
	"testing"
)

// The stderr line of a capped stream says the file holds the whole stream only when
// it does.
func TestSpillNote(t *testing.T) {
	if n := spillNote("", 0); n != "" {
		t.Errorf("no file: %q", n)
	}
	if n := spillNote("/s/output/x.stdout", 0); n != "; the whole stream is in /s/output/x.stdout" {
		t.Errorf("whole file: %q", n)
	}
	n := spillNote("/s/output/x.stdout", 12)
	if strings.Contains(n, "whole") || !strings.Contains(n, "first 67108864 bytes are in /s/output/x.stdout (12 more were not kept)") {
		t.Errorf("cut file: %q", n)
	}
}
