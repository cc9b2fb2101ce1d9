// Package output bounds what a command's output streams cost: Capture keeps a
// stream's head and tail within a byte budget as UTF-8 text, with one marker line that
// gives the exact number of bytes left out; Spill writes the whole stream to a
// host-only file once it outgrows that budget, up to its own cap.
package output

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Capture keeps at most max bytes of a stream: all of it when it fits, otherwise its
// head, a marker line and its tail, together within max bytes of UTF-8 text (see
// Text). It is an io.Writer that never fails; it is not safe for concurrent writes.
type Capture struct {
	max   int64
	head  []byte
	tail  []byte // ring buffer
	tpos  int
	total int64
}

// NewCapture returns a Capture of at most max bytes (max >= 0).
func NewCapture(max int64) *Capture { return &Capture{max: max} }

// Marker is the format of the line that stands for the bytes left out of a capped
// stream; %d is their exact number.
const Marker = "\n[... %d bytes truncated ...]\n"

// Write keeps what the head and the tail need of b; it always returns len(b), nil.
func (c *Capture) Write(b []byte) (int, error) {
	n := len(b)
	c.total += int64(n)
	headCap := c.max / 2
	if room := headCap - int64(len(c.head)); room > 0 {
		k := int64(len(b))
		if k > room {
			k = room
		}
		c.head = append(c.head, b[:k]...)
		b = b[k:]
	}
	tailCap := int(c.max - headCap)
	if tailCap <= 0 {
		return n, nil
	}
	for len(b) > 0 {
		if len(c.tail) < tailCap {
			k := min(tailCap-len(c.tail), len(b))
			c.tail = append(c.tail, b[:k]...)
			b = b[k:]
			continue
		}
		k := copy(c.tail[c.tpos:], b)
		c.tpos = (c.tpos + k) % tailCap
		b = b[k:]
	}
	return n, nil
}

// Total returns the number of bytes written so far.
func (c *Capture) Total() int64 { return c.total }

// Text returns the captured output as UTF-8 (invalid bytes replaced by U+FFFD) and the
// number of bytes left out. The result is at most max bytes long, counted after the
// replacement (a replaced byte grows to three), and when output was left out it is the
// head, the marker and the tail, the budget shared between head and tail. A character
// cut by the head/tail split is left out whole rather than replaced.
func (c *Capture) Text() (string, int64) {
	tail := append(append([]byte(nil), c.tail[c.tpos:]...), c.tail[:c.tpos]...)
	if c.total <= c.max {
		if s := strings.ToValidUTF8(string(c.head)+string(tail), "\uFFFD"); int64(len(s)) <= c.max {
			return s, 0
		}
	}
	h0 := c.head[:len(c.head)-partialSuffix(c.head)]
	t0 := tail[partialPrefix(tail):]
	// The marker's length with the largest possible count bounds the real one.
	budget := max(c.max-int64(len(fmt.Sprintf(Marker, c.total))), 0)
	_, hlen := fitPrefix(h0, budget/2)
	k, tlen := fitSuffix(t0, budget-hlen)
	tail = t0[len(t0)-k:]
	k, _ = fitPrefix(h0, budget-tlen) // the tail may have left room
	head := h0[:k]
	for {
		dropped := c.total - int64(len(head)) - int64(len(tail))
		marker := fmt.Sprintf(Marker, dropped)
		hs := strings.ToValidUTF8(string(head), "\uFFFD")
		ts := strings.ToValidUTF8(string(tail), "\uFFFD")
		over := int64(len(hs)+len(marker)+len(ts)) - c.max
		switch {
		case over <= 0:
			return hs + marker + ts, dropped
		case len(tail) > 0: // not expected: the fit above is exact
			tail = tail[min(int(over), len(tail)):]
			tail = tail[partialPrefix(tail):]
		case len(head) > 0:
			head = head[:len(head)-min(int(over), len(head))]
			head = head[:len(head)-partialSuffix(head)]
		default: // the marker alone does not fit (ASCII: cut it)
			return marker[:c.max], dropped
		}
	}
}

// fitPrefix returns the length of b's longest prefix, ending at a character boundary,
// whose text with invalid bytes replaced is at most n bytes, and that text's length.
// As in strings.ToValidUTF8, a run of invalid bytes becomes one 3-byte U+FFFD.
func fitPrefix(b []byte, n int64) (int, int64) {
	var out int64
	i, prevBad := 0, false
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		w, bad := validWidth(r, size, prevBad)
		if out+w > n {
			break
		}
		out += w
		i += size
		prevBad = bad
	}
	return i, out
}

// fitSuffix is fitPrefix for b's longest suffix starting at a character boundary.
func fitSuffix(b []byte, n int64) (int, int64) {
	var out int64
	j, nextBad := len(b), false
	for j > 0 {
		r, size := utf8.DecodeLastRune(b[:j])
		w, bad := validWidth(r, size, nextBad)
		if out+w > n {
			break
		}
		out += w
		j -= size
		nextBad = bad
	}
	return len(b) - j, out
}

// validWidth returns how many bytes a decoded character takes once invalid bytes are
// replaced: its own size, or 3 for the first invalid byte of a run and 0 for the rest.
func validWidth(r rune, size int, neighbourBad bool) (int64, bool) {
	if r != utf8.RuneError || size != 1 {
		return int64(size), false
	}
	if neighbourBad {
		return 0, true
	}
	return int64(utf8.RuneLen(utf8.RuneError)), true
}

// partialSuffix returns how many bytes at the end of b are the start of a UTF-8
// character whose remaining bytes are missing.
func partialSuffix(b []byte) int {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		if c := b[len(b)-i]; utf8.RuneStart(c) {
			if c >= 0xC0 && !utf8.FullRune(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}

// partialPrefix returns how many continuation bytes (the rest of a character that
// started before b) b starts with, at most utf8.UTFMax-1.
func partialPrefix(b []byte) int {
	n := 0
	for n < len(b) && n < utf8.UTFMax-1 && !utf8.RuneStart(b[n]) {
		n++
	}
	return n
}
