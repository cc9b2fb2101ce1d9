package config

import (
	"errors"
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

// ParseBytes parses a size (memory, output caps, cp --max-size): a plain number of bytes ("1048576"), or a number
// with a unit k, m, g or t (powers of 1024), optionally followed by "b" or "ib" in any
// case ("512m", "2g", "1.5GiB", "64KB"). The result, in bytes, must be a positive
// whole number no larger than MaxBytes. Errors name the input, what is wrong
// and the accepted form.
func ParseBytes(s string) (int64, error) {
	bad := func(why string) (int64, error) {
		return 0, fmt.Errorf("invalid size %q: %s; use bytes or a number with k, m, g or t, e.g. \"512m\" or \"2g\"", s, why)
	}
	t := strings.ToLower(strings.TrimSpace(s))
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	if i == 0 {
		return bad("no number")
	}
	f, err := strconv.ParseFloat(t[:i], 64)
	if err != nil {
		return bad("bad number")
	}
	mult, ok := byteUnits[t[i:]]
	if !ok {
		return bad(fmt.Sprintf("unknown unit %q", t[i:]))
	}
	tooLarge := func() (int64, error) {
		return 0, fmt.Errorf("invalid size %q: too large; the largest is %d bytes (4 EiB less one byte)", s, int64(MaxBytes))
	}
	if n, err := strconv.ParseUint(t[:i], 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		// A whole number: exact arithmetic, so the limit is exact too.
		m := uint64(mult)
		switch {
		case err != nil || n > MaxBytes/m:
			return tooLarge()
		case n == 0:
			return bad("less than 1 byte")
		}
		return int64(n * m), nil
	}
	v := f * mult
	if v < 1 {
		return bad("less than 1 byte")
	}
	if v >= MaxBytes+1 { // 2^62, exact as a float64
		return tooLarge()
	}
	if v != math.Trunc(v) {
		return bad("not a whole number of bytes")
	}
	return int64(v), nil
}

// MaxBytes is the largest size ParseBytes accepts: math.MaxInt64/2 bytes, 2^62-1.
const MaxBytes = math.MaxInt64 / 2

// byteUnits maps every accepted (lower-cased) memory unit to its multiplier.
var byteUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
