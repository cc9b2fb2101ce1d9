package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ParseDuration parses a Go duration ("90s", "36h", "1h30m") extended with the unit
// d, 24 hours ("7d", "1d12h", "1.5d"). Negative durations are refused; "0" is zero.
// Errors name the input and the accepted form.
func ParseDuration(s string) (time.Duration, error) {
	bad := func() (time.Duration, error) {
		return 0, fmt.Errorf("invalid duration %q: use a number with a unit, e.g. \"90s\", \"36h\", \"7d\" (units ns us ms s m h d)", s)
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
		var d time.Duration
		if unit == "d" {
			f, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return bad()
			}
			h := f * 24 * float64(time.Hour)
			if h > math.MaxInt64 {
				return bad()
			}
			d = time.Duration(h)
		} else {
			if unit == "" {
				return bad()
			}
			var err error
			d, err = time.ParseDuration(num + unit)
			if err != nil {
				return bad()
			}
		}
		if total > math.MaxInt64-d {
			return bad()
		}
		total += d
	}
	return total, nil
}

// ParseBytes parses a memory size: a plain number of bytes ("1048576"), or a number
// with a unit k, m, g or t (powers of 1024), optionally followed by "b" or "ib" in any
// case ("512m", "2g", "1.5GiB", "64KB"). The result, in bytes, must be a positive
// whole number no larger than math.MaxInt64/2. Errors name the input, what is wrong
// and the accepted form.
func ParseBytes(s string) (int64, error) {
	bad := func(why string) (int64, error) {
		return 0, fmt.Errorf("invalid memory size %q: %s; use bytes or a number with k, m, g or t, e.g. \"512m\" or \"2g\"", s, why)
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
	v := f * mult
	if v < 1 || v > math.MaxInt64/2 {
		return bad("out of range")
	}
	if v != math.Trunc(v) {
		return bad("not a whole number of bytes")
	}
	return int64(v), nil
}

// byteUnits maps every accepted (lower-cased) memory unit to its multiplier.
var byteUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
