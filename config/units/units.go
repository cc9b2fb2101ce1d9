package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// MaxDuration is the longest duration ParseDuration accepts: time.Duration's
// largest value, 106751d23h47m16.854775807s (about 292 years).
const MaxDuration = time.Duration(math.MaxInt64)

// maxDurationText is MaxDuration in the config's units, for errors.
const maxDurationText = "106751d23h47m16s (about 292 years)"

// durationUnits are the units ParseDuration accepts, in nanoseconds.
var durationUnits = map[string]float64{
	"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6,
	"s": 1e9, "m": 60e9, "h": 3600e9, "d": 24 * 3600e9,
}

// ParseDuration parses a Go duration ("90s", "36h", "1h30m") extended with the unit
// d, 24 hours ("7d", "1d12h", "1.5d"). Negative durations are refused; "0" is zero.
// Errors name the input and the accepted form; a duration longer than MaxDuration
// is refused as too large, naming the maximum.
func ParseDuration(s string) (time.Duration, error) {
	bad := func() (time.Duration, error) {
		return 0, fmt.Errorf("invalid duration %q: use a number with a unit, e.g. \"90s\", \"36h\", \"7d\" (units ns us ms s m h d)", s)
	}
	tooLarge := func() (time.Duration, error) {
		return 0, fmt.Errorf("invalid duration %q: too large; the longest is %s", s, maxDurationText)
	}
	t := strings.TrimSpace(s)
	if t == "" || t[0] == '-' || t[0] == '+' {
		return bad()
	}
	if t == "0" {
		return 0, nil
	}
	var total time.Duration
	for t != "" {
		// number
		i := 0
		for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
			i++
		}
		if i == 0 {
			return bad()
		}
		num := t[:i]
		t = t[i:]
		// unit
		j := 0
		for j < len(t) && !(t[j] >= '0' && t[j] <= '9' || t[j] == '.') {
			j++
		}
		unit := t[:j]
		t = t[j:]
		mult, known := durationUnits[unit]
		f, err := strconv.ParseFloat(num, 64)
		if !known || err != nil {
			return bad()
		}
		var d time.Duration
		if unit == "d" {
			if f*mult >= math.MaxInt64 { // 2^63 as a float64: does not fit
				return tooLarge()
			}
			d = time.Duration(f * mult)
		} else if d, err = time.ParseDuration(num + unit); err != nil {
			// The number and the unit are valid: the only error left is that
			// the value does not fit.
			return tooLarge()
		}
		if total > MaxDuration-d {
			return tooLarge()
		}
		total += d
	}
	return total, nil
}
