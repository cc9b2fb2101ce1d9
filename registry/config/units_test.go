package config

import (
	"crypto/sha256"
	"encoding/hex"
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
	for _, in := range []string{"", "7", "d", "-1h", "+1h", "7days", "1w", "1h-2m", "abc", "1.2.3h", "99999999999d"} {
		if got, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want error", in, got)
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
}
