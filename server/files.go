package server

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sh/berth/agent"
	"github.com/berth-sh/berth/config"
	"github.com/berth-sh/berth/server/apiv1"
)

// Files over the API: a tar stream of a path each way (/archive), and one small
// file's bytes each way (/files). docs/api.md describes them.

// pathParam returns the query parameter path, which must be set and hold no NUL.
func pathParam(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	switch {
	case p == "":
		return "", errorf("invalid", "give the sandbox path as the query parameter path, e.g. ?path=/work/out (a relative one is relative to the sandbox's default directory)")
	case strings.ContainsRune(p, 0):
		return "", errorf("invalid", "path holds a NUL character")
	}
	return p, nil
}

// sessionPath returns the session name (as given and normal) and the query
// parameter path of a files call; a bad one is answered 400 and ok is false.
func (s *Server) sessionPath(w http.ResponseWriter, r *http.Request) (name, session, p string, ok bool) {
	name, session, ok = s.sessionName(w, r)
	if !ok {
		return name, session, "", false
	}
	p, err := pathParam(r)
	if err != nil {
		s.writeError(w, r, err, name)
		return name, session, "", false
	}
	return name, session, p, true
}

// maxSizeParam reads the query parameter max_size: a size as berth cp --max-size
// takes it (config.ParseBytes, or "unlimited": -1); absent means
// agent.DefaultMaxCopyBytes.
func maxSizeParam(r *http.Request) (int64, error) {
	s := r.URL.Query().Get("max_size")
	switch {
	case s == "":
		return agent.DefaultMaxCopyBytes, nil
	case strings.EqualFold(s, "unlimited"):
		return -1, nil
	}
	n, err := config.ParseBytes(s)
	if err != nil {
		return 0, errorf("invalid", "max_size: %v (or unlimited)", err)
	}
	return n, nil
}

// bodyReader is a request body read with the server's body timeout as an idle
// limit: each read must bring data within it (a large upload may take as long as it
// needs while bytes keep coming). It records the body's first error other than EOF,
// so that a handler can tell a broken body from bad content.
type bodyReader struct {
	r       io.Reader
	rc      *http.ResponseController
	timeout time.Duration
	err     error
}

func (s *Server) newBodyReader(w http.ResponseWriter, r io.Reader) *bodyReader {
	return &bodyReader{r: r, rc: http.NewResponseController(w), timeout: s.bodyTimeout}
}

func (b *bodyReader) Read(p []byte) (int, error) {
	b.rc.SetReadDeadline(time.Now().Add(b.timeout))
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

// done clears the read deadline: net/http's read that notices a client going away
// must not time out while the call goes on.
func (b *bodyReader) done() { b.rc.SetReadDeadline(time.Time{}) }

// problem classifies the body's error: too_large, request_timeout, or canceled
// (the client went away); nil when the body had none.
func (b *bodyReader) problem(w http.ResponseWriter) error {
	var tooLarge *http.MaxBytesError
	var ne net.Error
	switch {
	case b.err == nil:
		return nil
	case errors.As(b.err, &tooLarge):
		w.Header().Set("Connection", "close")
		return errorf(apiv1.KindTooLarge, "the request body is larger than the limit of %d bytes; use PUT /v1/sessions/{name}/archive for larger files", tooLarge.Limit)
	case errors.Is(b.err, os.ErrDeadlineExceeded) || (errors.As(b.err, &ne) && ne.Timeout()):
		w.Header().Set("Connection", "close")
		return errorf(apiv1.KindRequestTimeout, "the request body stopped arriving: no data for %v", b.timeout)
	}
	return errorf(apiv1.KindCanceled, "reading the request body: %v", b.err)
}

// putArchive is PUT /v1/sessions/{name}/archive?path=DIR[&max_size=SIZE]: extract the
// tar stream of the body into the existing directory DIR of the sandbox. The stream
// is hostile (agent.CheckTar's rules) and checked whole before the agent gets any of
// it, spooled meanwhile to an unlinked file in STATE/tmp (bounded by max_size,
// never held in memory), so a refused stream leaves the sandbox unchanged.
func (s *Server) putArchive(w http.ResponseWriter, r *http.Request) {
	name, session, ok := s.sessionName(w, r)
	if !ok {
		return
	}
	dir, err := pathParam(r)
	var limit int64
	if err == nil {
		limit, err = maxSizeParam(r)
	}
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	ref := s.acquire()
	defer s.release(ref)
	reg := ref.reg
	spool, err := uploadSpool(reg.StateDir())
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	defer spool.Close()
	body := s.newBodyReader(w, r.Body)
	bw := bufio.NewWriterSize(spool, 256<<10)
	entries, size, err := agent.CheckTar(body, bw, limit)
	body.done()
	if err == nil {
		err = bw.Flush()
	}
	switch perr := body.problem(w); {
	case perr != nil:
		err = perr
	case errors.Is(err, agent.ErrTarTooLarge):
		w.Header().Set("Connection", "close")
		err = errorf(apiv1.KindTooLarge, "upload into %s: %v; nothing was written (raise max_size, or say max_size=unlimited)", dir, err)
	case err != nil:
		err = errorf("invalid", "upload into %s: %v; nothing was written", dir, err)
	}
	if err == nil {
		if _, err = spool.Seek(0, io.SeekStart); err == nil {
			err = reg.CopyIn(r.Context(), session, dir, spool)
		}
	}
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	s.log.Info("upload", "session", session, "path", dir, "entries", entries, "bytes", size)
	writeJSON(w, http.StatusOK, apiv1.ArchiveUpload{Entries: entries, Bytes: size})
}

// uploadSpool makes the unlinked file that holds an upload while it is checked, in
// STATE/tmp (made 0700 when missing; the directory of berth serve's spool files).
func uploadSpool(stateDir string) (*os.File, error) {
	dir := filepath.Join(stateDir, "tmp")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the upload's spool directory: %v", err)
	}
	f, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return nil, fmt.Errorf("making the upload's spool file: %v", err)
	}
	os.Remove(f.Name()) // unlinked: nothing is left behind, whatever happens
	return f, nil
}

// tarAnswer is a streamed answer whose header (200, application/x-tar) is sent with
// its first byte, so that an error before it gets an ordinary error answer.
type tarAnswer struct {
	w     http.ResponseWriter
	begun bool
}

func (t *tarAnswer) Write(b []byte) (int, error) {
	if !t.begun {
		t.begun = true
		t.w.Header().Set("Content-Type", apiv1.TarType)
		t.w.Header().Set("X-Content-Type-Options", "nosniff")
		t.w.WriteHeader(http.StatusOK)
	}
	return t.w.Write(b)
}

// getArchive is GET /v1/sessions/{name}/archive?path=PATH: the file or directory
// PATH as a tar stream whose top entry is PATH's base name, streamed as the sandbox
// sends it (flow-controlled: nothing is buffered whole). The stream comes from the
// sandbox and is not checked here: the client extracts it as hostile (berth cp
// does, agent.ExtractTar). An error once the stream has begun aborts the answer
// (no final chunk), so that a client never takes a cut stream for a whole one.
func (s *Server) getArchive(w http.ResponseWriter, r *http.Request) {
	name, session, p, ok := s.sessionPath(w, r)
	if !ok {
		return
	}
	ref := s.acquire()
	defer s.release(ref)
	ta := &tarAnswer{w: w}
	err := ref.reg.CopyOut(r.Context(), session, p, ta)
	switch {
	case err != nil && !ta.begun:
		s.writeError(w, r, err, name)
	case err != nil:
		s.log.Warn("download broke off", "session", session, "path", p, "error", err)
		panic(http.ErrAbortHandler)
	case !ta.begun:
		ta.Write(nil) // an empty stream: still a 200 answer
	}
}

// getFile is GET /v1/sessions/{name}/files?path=PATH: the regular file PATH's bytes
// (application/octet-stream, Content-Length its size, ModeHeader its mode,
// Last-Modified its mtime). A directory or symlink is 400 (invalid), a file over
// MaxFileBytes 413 (too_large), a missing one 404.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	name, session, p, ok := s.sessionPath(w, r)
	if !ok {
		return
	}
	ref := s.acquire()
	defer s.release(ref)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := ref.reg.CopyOut(ctx, session, p, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	// stop ends the copy (the rest of the stream is not wanted) and returns its error.
	stop := func() error {
		cancel()
		pr.CloseWithError(io.ErrClosedPipe)
		return <-done
	}
	tr := tar.NewReader(pr)
	hdr, err := tr.Next()
	if err != nil {
		if cerr := stop(); cerr != nil {
			err = cerr
		} else {
			err = fmt.Errorf("reading %s: the sandbox sent no file: %v", p, err)
		}
		s.writeError(w, r, err, name)
		return
	}
	switch {
	case hdr.Typeflag == tar.TypeDir:
		err = errorf("invalid", "%s is a directory; download it as a tar stream with GET /v1/sessions/{name}/archive?path=...", p)
	case hdr.Typeflag == tar.TypeSymlink:
		err = errorf("invalid", "%s is a symlink (to %s); read its target's path instead", p, strconv.Quote(hdr.Linkname))
	case hdr.Typeflag != tar.TypeReg:
		err = errorf("invalid", "%s is not a regular file (tar type %q)", p, hdr.Typeflag)
	case hdr.Size > apiv1.MaxFileBytes:
		err = errorf(apiv1.KindTooLarge, "%s is %d bytes, more than the %d bytes (16 MiB) that /files reads; use GET /v1/sessions/{name}/archive?path=...", p, hdr.Size, apiv1.MaxFileBytes)
	}
	if err != nil {
		stop()
		s.writeError(w, r, err, name)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(hdr.Size, 10))
	w.Header().Set(apiv1.ModeHeader, fmt.Sprintf("%04o", hdr.Mode&0o7777))
	if !hdr.ModTime.IsZero() {
		w.Header().Set("Last-Modified", hdr.ModTime.UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, tr); err != nil {
		// The header is out: a short body (Content-Length not met) tells the client.
		s.log.Warn("file read broke off", "session", session, "path", p, "error", err)
		stop()
		panic(http.ErrAbortHandler)
	}
	stop()
}

// putFile is PUT /v1/sessions/{name}/files?path=PATH[&mode=0644]: write the body,
// at most MaxFileBytes (413 beyond, before the sandbox is touched), as the regular
// file PATH, whose directory must exist; what is at PATH is replaced (a symlink
// there is replaced, never followed). mode is octal (default 0644, setuid, setgid
// and sticky allowed). The file belongs to the agent's user (root in containers).
func (s *Server) putFile(w http.ResponseWriter, r *http.Request) {
	name, session, ok := s.sessionName(w, r)
	if !ok {
		return
	}
	p, err := pathParam(r)
	base := path.Base(p)
	if err == nil && (strings.HasSuffix(p, "/") || base == "." || base == ".." || base == "/") {
		err = errorf("invalid", "path %q names no file; give the file's path, e.g. /work/notes.txt", p)
	}
	mode := int64(0o644)
	if m := r.URL.Query().Get("mode"); err == nil && m != "" {
		if mode, err = strconv.ParseInt(m, 8, 32); err != nil || mode < 0 || mode > 0o7777 {
			err = errorf("invalid", "mode %q: give octal permission bits from 0 to 7777, e.g. 0644 or 0755", m)
		}
	}
	if err == nil && r.ContentLength > apiv1.MaxFileBytes {
		w.Header().Set("Connection", "close")
		err = errorf(apiv1.KindTooLarge, "the body is %d bytes, more than the %d bytes (16 MiB) that /files writes; use PUT /v1/sessions/{name}/archive", r.ContentLength, apiv1.MaxFileBytes)
	}
	if err != nil {
		s.writeError(w, r, err, name)
		return
	}
	body := s.newBodyReader(w, http.MaxBytesReader(w, r.Body, apiv1.MaxFileBytes))
	data, _ := io.ReadAll(body)
	body.done()
	if err := body.problem(w); err != nil {
		s.writeError(w, r, err, name)
		return
	}
	// The one-entry tar stream is written as the agent reads it: the body is held
	// once, not twice.
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: base, Mode: mode, Size: int64(len(data)), ModTime: time.Now()})
		if err == nil {
			_, err = tw.Write(data)
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	defer pr.CloseWithError(io.ErrClosedPipe)
	ref := s.acquire()
	defer s.release(ref)
	if err := ref.reg.CopyIn(r.Context(), session, path.Dir(p), pr); err != nil {
		s.writeError(w, r, err, name)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
