package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// MaxStdinBuffered is the most stdin bytes, in bytes (1 GiB), that a streamed exec
// request (a request body of input events) may have sent ahead of what its command
// has read. Up to it, serve reads the body as fast as the client sends it, into a
// file, so that a client that sends its whole body before it reads the answer never
// waits on the command (no deadlock against output flow control); past it, serve
// reads on only as the command reads.
const MaxStdinBuffered = 1 << 30

// spoolDir is the directory under the state dir that holds stdin spool files; each
// is unlinked as soon as it is made, so nothing is left there even by a kill -9.
const spoolDir = "tmp"

// punchEvery is how many bytes the reader consumes between two hole punches that
// give the consumed part of a spool file back to the file system.
const punchEvery = 4 << 20

// spool is a pipe whose buffer is an unlinked file in the state dir: Write (one
// writer: the request body's reader) never waits for the reader until max unread
// bytes are buffered; Read (one reader: the command's stdin) waits for data, the
// end (CloseWrite) or Close. The part the reader has consumed is punched out of
// the file (FALLOC_FL_PUNCH_HOLE), so the disk holds at most about max bytes
// whatever the stdin's size. A hand-written type: no library offers a file-backed
// pipe; io.Pipe has no buffer, and an in-memory one would grow with the stdin.
type spool struct {
	dir  string   // where the file is made, at the first byte written
	f    *os.File // nil until then: a call without stdin makes no file
	max  int64
	mu   sync.Mutex
	cond *sync.Cond
	w, r int64 // bytes written, bytes read
	hole int64 // bytes at the start of the file already punched out
	eof  bool  // CloseWrite was called
	done bool  // Close was called
}

// newSpool makes a spool whose file will be in STATE/tmp (made 0700 when missing).
// The file is made by the first Write of any bytes: most execs send no stdin, and
// making a file per call was a tenth of serve's CPU per exec of `true`.
func newSpool(stateDir string, max int64) *spool {
	s := &spool{dir: filepath.Join(stateDir, spoolDir), max: max}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// open makes the spool's file (an unlinked temporary file in s.dir), once: only
// the one writer calls it. None is made after Close (one made while Close ran is
// closed at once).
func (s *spool) open() error {
	s.mu.Lock()
	skip := s.f != nil || s.done
	s.mu.Unlock()
	if skip {
		return nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("stdin spool: %w", err)
	}
	f, err := os.CreateTemp(s.dir, ".stdin-*")
	if err != nil {
		return fmt.Errorf("stdin spool: %w", err)
	}
	os.Remove(f.Name())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		f.Close()
		return nil
	}
	s.f = f
	return nil
}

// Write appends b, waiting while max bytes are unread. After Close it drops b (the
// command no longer reads) and reports success, so that the body is still drained;
// after CloseWrite it refuses b (errWriteAfterEnd): nothing after the end of the
// stdin reaches the command.
func (s *spool) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	ended := s.eof && !s.done
	s.mu.Unlock()
	if ended {
		return 0, errWriteAfterEnd
	}
	if err := s.open(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	for !s.done && s.w-s.r+int64(len(b)) > s.max && s.w > s.r {
		s.cond.Wait()
	}
	if s.done {
		s.mu.Unlock()
		return len(b), nil
	}
	off := s.w
	s.mu.Unlock()
	// The one writer owns the bytes past s.w: no lock needed for the write itself.
	n, err := s.f.WriteAt(b, off)
	s.mu.Lock()
	s.w += int64(n)
	s.cond.Broadcast()
	s.mu.Unlock()
	if err != nil {
		return n, fmt.Errorf("stdin spool: %w", err)
	}
	return n, nil
}

// errWriteAfterEnd is Write's error after CloseWrite.
var errWriteAfterEnd = errors.New("stdin spool: write after the end of the stdin")

// CloseWrite marks the end of the stdin: Read returns io.EOF once it has read the rest.
func (s *spool) CloseWrite() {
	s.mu.Lock()
	s.eof = true
	s.cond.Broadcast()
	s.mu.Unlock()
}

// Read reads buffered bytes, waiting for some, for the end, or for Close.
func (s *spool) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	for s.r == s.w && !s.eof && !s.done {
		s.cond.Wait()
	}
	if s.done {
		s.mu.Unlock()
		return 0, io.ErrClosedPipe
	}
	if s.r == s.w {
		s.mu.Unlock()
		return 0, io.EOF
	}
	off, n := s.r, min(int64(len(p)), s.w-s.r)
	s.mu.Unlock()
	got, err := s.f.ReadAt(p[:n], off)
	s.mu.Lock()
	s.r += int64(got)
	if s.r-s.hole >= punchEvery {
		// Best effort: a file system without hole punching keeps the bytes until
		// the spool is closed.
		unix.Fallocate(int(s.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, s.hole, s.r-s.hole)
		s.hole = s.r
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	if err != nil && got == 0 {
		return 0, fmt.Errorf("stdin spool: %w", err)
	}
	return got, nil
}

// Close ends the spool: a waiting Read returns, later writes are dropped, and the
// file (already unlinked) is closed.
func (s *spool) Close() error {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil
	}
	s.done = true
	s.cond.Broadcast()
	f := s.f
	s.mu.Unlock()
	if f == nil {
		return nil
	}
	return f.Close()
}
