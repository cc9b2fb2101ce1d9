package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sh/berth/config/units"
)

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

// MaxDuration is the longest duration ParseDuration accepts (units.MaxDuration).
const MaxDuration = units.MaxDuration

// ParseDuration parses a duration as berth's config takes it: units.ParseDuration,
// whose doc gives the accepted form and the errors.
func ParseDuration(s string) (time.Duration, error) { return units.ParseDuration(s) }
