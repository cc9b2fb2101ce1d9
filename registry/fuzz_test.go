package registry

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/berth-sh/berth/config"
)

// FuzzFormatDuration checks that what FormatDuration shows reads back with
// config.ParseDuration as the same duration rounded to the second, in the canonical
// form: whole days first, then hours below 24 (docs/fuzzing.md).
func FuzzFormatDuration(f *testing.F) {
	for _, d := range []time.Duration{
		0, time.Millisecond, 499 * time.Millisecond, 500 * time.Millisecond, time.Second, 90 * time.Second, time.Hour,
		36 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour,
		24*time.Hour + 59*time.Minute + 59*time.Second + 600*time.Millisecond, math.MaxInt64 - time.Second,
	} {
		f.Add(int64(d))
	}
	f.Fuzz(func(t *testing.T, ns int64) {
		d := time.Duration(ns)
		if d < 0 || d > math.MaxInt64-time.Second {
			return // negative: no duration of the config; the top second cannot round up
		}
		s := FormatDuration(d)
		back, err := config.ParseDuration(s)
		if err != nil {
			t.Fatalf("FormatDuration(%v) = %q, which ParseDuration refuses: %v", d, s, err)
		}
		if back != d.Round(time.Second) {
			t.Fatalf("FormatDuration(%v) = %q, which reads back as %v, want %v", d, s, back, d.Round(time.Second))
		}
		if days, rest, ok := strings.Cut(s, "d"); ok {
			if r, err := time.ParseDuration(rest); rest != "" && (err != nil || r >= 24*time.Hour || r <= 0) {
				t.Fatalf("FormatDuration(%v) = %q: %q after %s days is not below a day", d, s, rest, days)
			}
		}
	})
}
