package output

import (
	"os"
	"path/filepath"
)

// DefaultSpillMax is the default cap of a full-output file, in bytes (64 MiB).
const DefaultSpillMax = 64 << 20

// Spill writes a whole stream to the file path as it passes, once the stream has grown
// past threshold bytes (before that it only buffers them, so short streams cost no
// file), up to max bytes; bytes past max are counted, not written. The file and its
// directory are created private (0600 in a 0700 directory): it is meant for a
// host-only directory that no sandbox can write. Spill is an io.Writer that never
// fails; the first file error is kept for Close. It is not safe for concurrent writes.
type Spill struct {
	path      string
	threshold int64
	max       int64
	buf       []byte
	f         *os.File
	written   int64
	dropped   int64
	err       error
}

// NewSpill returns a Spill to path that starts writing once threshold bytes are
// exceeded, and writes at most max bytes.
func NewSpill(path string, threshold, max int64) *Spill {
	return &Spill{path: path, threshold: threshold, max: max}
}

// Write buffers or writes b; it always returns len(b), nil.
func (s *Spill) Write(b []byte) (int, error) {
	n := len(b)
	if s.err != nil {
		return n, nil
	}
	if s.f == nil {
		if int64(len(s.buf)+len(b)) <= s.threshold {
			s.buf = append(s.buf, b...)
			return n, nil
		}
		if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
			s.err = err
			return n, nil
		}
		f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			s.err = err
			return n, nil
		}
		s.f = f
		head := s.buf
		s.buf = nil
		s.write(head)
	}
	s.write(b)
	return n, nil
}

func (s *Spill) write(b []byte) {
	if room := s.max - s.written; int64(len(b)) > room {
		s.dropped += int64(len(b)) - max(room, 0)
		b = b[:max(room, 0)]
	}
	if len(b) == 0 || s.err != nil {
		return
	}
	k, err := s.f.Write(b)
	s.written += int64(k)
	if err != nil {
		s.err = err
	}
}

// Close closes the file and returns its path ("" when the stream never outgrew the
// threshold, so no file was made), the bytes beyond max that it left out, and the
// first error met writing it (the file may then be short).
func (s *Spill) Close() (path string, dropped int64, err error) {
	if s.f == nil {
		return "", 0, s.err
	}
	if cerr := s.f.Close(); s.err == nil {
		s.err = cerr
	}
	return s.path, s.dropped, s.err
}
