package config

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func TestParseDuration(t *testing.T) {
	good := map[string]time.Duration{
		"0":     0,
		"90s":   90 * time.Second,
		"36h":   36 * time.Hour,
		"7d":    7 * 24 * time.Hour,
		"1d12h": 36 * time.Hour,
		"1.5d":  36 * time.Hour,
		"1h30m": 90 * time.Minute,
		"250ms": 250 * time.Millisecond,
		" 2d ":  48 * time.Hour,
	}
	for in, want := range good {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "7", "d", "-1h", "+1h", "7days", "1w", "1h-2m", "abc", "1.2.3h", "."} {
		if got, err := ParseDuration(in); err == nil || !strings.Contains(err.Error(), "use a number with a unit") {
			t.Errorf("ParseDuration(%q) = %v, %v; want the error that shows the form", in, got, err)
		}
	}
	// The largest duration is accepted; anything longer is "too large", with the
	// maximum, not "use a number with a unit".
	for in, want := range map[string]time.Duration{
		"106751d":                    106751 * 24 * time.Hour,
		"106751d23h47m16.854775807s": MaxDuration,
		"9223372036854775807ns":      MaxDuration,
		"2562047h":                   2562047 * time.Hour,
	} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"999999999999d", "99999999999d", "106752d", "106751d24h", "2562048h", "9223372036854775808ns",
		"9223372037s", "106751d23h47m16.854775808s", "100000000000000000000000000000000000000000s", "106751d106751d"} {
		_, err := ParseDuration(in)
		if err == nil || !strings.Contains(err.Error(), "too large") || !strings.Contains(err.Error(), "106751d23h47m16s") || strings.Contains(err.Error(), "use a number") {
			t.Errorf("ParseDuration(%q): %v; want \"too large\" with the maximum", in, err)
		}
	}
}

func TestParseBytes(t *testing.T) {
	good := map[string]int64{
		"1048576": 1 << 20,
		"512m":    512 << 20,
		"512M":    512 << 20,
		"2g":      2 << 30,
		"2GB":     2 << 30,
		"1.5GiB":  3 << 29,
		"64k":     64 << 10,
		"1t":      1 << 40,
		"100b":    100,
	}
	for in, want := range good {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "m", "0", "-1m", "512x", "1.5", "0.1b", "512mi", "ib"} {
		if got, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %v, want error", in, got)
		}
	}
	if got, err := ParseBytes("4611686018427387903"); err != nil || got != MaxBytes {
		t.Errorf("ParseBytes(MaxBytes) = %v, %v", got, err)
	}
	for _, in := range []string{"4611686018427387904", "4194304t", "99999999t", "4194304.5t", "99999999999999999999999"} {
		if _, err := ParseBytes(in); err == nil || !strings.Contains(err.Error(), "too large") || !strings.Contains(err.Error(), "4611686018427387903 bytes") {
			t.Errorf("ParseBytes(%q): %v; want \"too large\" with the maximum", in, err)
		}
	}
}
