package output

import (
	"crypto/rand"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

var markerRE = regexp.MustCompile(`\[\.\.\. (\d+) bytes truncated \.\.\.\]`)

func randByte() byte {
	var b [1]byte
	rand.Read(b[:])
	return b[0]
}

// A Capture stays within its cap in bytes of valid UTF-8, whatever the output
// and however it is split into writes.
func TestCaptureWithinCap(t *testing.T) {
	t.Parallel()
	alphabet := [][]byte{[]byte("a"), []byte("é"), []byte("€"), []byte("😀"), {0xff}, {0xe2, 0x82}, {0x80}}
	for i := 0; i < 3000; i++ {
		var in []byte
		n := int(randByte()) * int(randByte()%8+1)
		for len(in) < n {
			in = append(in, alphabet[int(randByte())%len(alphabet)]...)
		}
		capBytes := int64(randByte()) % 300
		c := NewCapture(capBytes)
		for rest := in; len(rest) > 0; {
			k := min(int(randByte()%64)+1, len(rest))
			c.Write(rest[:k])
			rest = rest[k:]
		}
		s, dropped := c.Text()
		if int64(len(s)) > capBytes || !utf8.ValidString(s) {
			t.Fatalf("cap %d, input %q: %d bytes %q", capBytes, in, len(s), s)
		}
		if dropped == 0 && s != strings.ToValidUTF8(string(in), "\uFFFD") {
			t.Fatalf("cap %d, input %q: nothing dropped but %q", capBytes, in, s)
		}
		if m := markerRE.FindStringSubmatch(s); dropped > 0 && m != nil && m[1] != strconv.FormatInt(dropped, 10) {
			t.Fatalf("cap %d, input %q: marker %q, dropped %d", capBytes, in, m[0], dropped)
		}
	}
}

func TestSpill(t *testing.T) {
	dir := t.TempDir()
	short := NewSpill(dir+"/out/short", 10, 100)
	short.Write([]byte("0123456789"))
	if p, d, err := short.Close(); p != "" || d != 0 || err != nil {
		t.Errorf("a stream within the threshold made a file: %q %d %v", p, d, err)
	}
	long := NewSpill(dir+"/out/long", 10, 25)
	for i := 0; i < 6; i++ {
		long.Write([]byte("abcde"))
	}
	p, d, err := long.Close()
	if p != dir+"/out/long" || d != 5 || err != nil {
		t.Fatalf("Close: %q %d %v, want the path and 5 bytes left out", p, d, err)
	}
	b, _ := os.ReadFile(p)
	if string(b) != strings.Repeat("abcde", 5) {
		t.Errorf("file %q, want the first 25 bytes", b)
	}
	for path, want := range map[string]os.FileMode{p: 0o600, dir + "/out": 0o700 | os.ModeDir} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
		}
	}
	// An existing file is never overwritten.
	again := NewSpill(p, 0, 10)
	again.Write([]byte("x"))
	if _, _, err := again.Close(); err == nil {
		t.Error("a Spill over an existing file reported no error")
	}
}
