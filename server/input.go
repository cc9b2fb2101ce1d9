package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/berth-sh/berth/server/apiv1"
)

// A streamed exec request (Content-Type: application/x-ndjson) is one JSON object per
// line: the ExecRequest first, then input events as the client has them:
//
//	{"event":"stdin","data":"BASE64"}   bytes for the command's stdin
//	{"event":"eof"}                     the end of the stdin (so is the end of the body)
//	{"event":"signal","signal":2}       a signal for the command's process group
//	                                    (shell mode: ends the call, as cancel)
//	{"event":"cancel"}                  kill the command's tree; the answer still
//	                                    comes, with canceled set
//
// serve reads the body as it comes, whatever the command does, into a spool file
// (up to MaxStdinBuffered bytes ahead of the command): a client that writes its
// whole body before it reads the answer cannot deadlock against the output's flow
// control, and one that reads and writes at once gets its stdin to the command as
// it sends it.

// input is the input side of a streamed exec request. Its reader owns the rest of
// the request body: it reads it to its end, dropping what the call no longer takes
// (after a bad event, after the answer), so that the body's end is read while the
// handler runs; finish waits for that before the handler returns.
type input struct {
	br      *bufio.Reader
	limit   int64 // the longest event line
	sp      *spool
	signals chan int // signal events, for the command once it runs
	cancel  context.CancelFunc
	done    chan struct{} // closed when the reader has stopped
	mu      sync.Mutex
	bad     error // the first bad event: the call is cancelled and answers it
	eofAt   int   // the eof event's number (0: none yet); read's goroutine only
	// bodyErr is why the body did not end cleanly (nil: it did); set before done
	// is closed.
	bodyErr error
}

// isNDJSON reports whether r's body is declared as NDJSON.
func isNDJSON(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == apiv1.NDJSON
}

// readFirstLine reads the first line of a streamed request body within the server's
// size (per line) and time limits, and enables full duplex: the answer may be
// written while the body is still read. It returns the line and the reader of the
// rest.
func (s *Server) readFirstLine(w http.ResponseWriter, r *http.Request) ([]byte, *bufio.Reader, error) {
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		return nil, nil, errorf(apiv1.KindInternal, "a streamed request needs full duplex: %v", err)
	}
	rc.SetReadDeadline(time.Now().Add(s.bodyTimeout))
	// No deadline once the first line is in: the rest comes as the client has it.
	defer rc.SetReadDeadline(time.Time{})
	br := bufio.NewReaderSize(r.Body, 64<<10)
	line, err := readLine(br, s.maxBody)
	var ne net.Error
	switch {
	case err == nil || (errors.Is(err, io.EOF) && len(line) > 0):
		return line, br, nil
	case errors.Is(err, errLineTooLong):
		w.Header().Set("Connection", "close")
		return nil, nil, errorf(apiv1.KindTooLarge, "the request's first line is longer than the limit of %d bytes (berth serve --max-request-body); send large stdin as stdin events", s.maxBody)
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		w.Header().Set("Connection", "close")
		return nil, nil, errorf(apiv1.KindRequestTimeout, "the request's first line did not arrive within %v", s.bodyTimeout)
	case errors.Is(err, io.EOF):
		return nil, nil, errorf("invalid", "request body: empty; send the exec request as the first line")
	}
	// A body that broke off (a malformed chunk, an early end): what follows on the
	// connection is not a request.
	w.Header().Set("Connection", "close")
	return nil, nil, errorf("invalid", "reading the request body: %v", err)
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line (without its newline) of at most limit bytes.
func readLine(br *bufio.Reader, limit int64) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if int64(len(line)+len(chunk)) > limit+1 {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line, err
		}
	}
}

// newInput starts reading the input events of br into a spool in stateDir; cancel
// ends the call (a cancel event, a bad event).
func newInput(br *bufio.Reader, limit int64, stateDir string, cancel context.CancelFunc) *input {
	return startInput(br, limit, newSpool(stateDir, MaxStdinBuffered), cancel)
}

// discardInput starts reading the rest of a refused streamed request's body (br)
// and dropping it, so that finish can keep its connection for the next request.
func discardInput(br *bufio.Reader, limit int64) *input {
	sp := newSpool("", 0)
	sp.Close() // makes no file: every write is dropped
	return startInput(br, limit, sp, func() {})
}

func startInput(br *bufio.Reader, limit int64, sp *spool, cancel context.CancelFunc) *input {
	in := &input{br: br, limit: limit, sp: sp, signals: make(chan int, 16), cancel: cancel, done: make(chan struct{})}
	go in.read()
	return in
}

// read reads input events until the body ends or breaks. The clean end of the
// body ends the stdin (as eof does); a stdin that cannot be delivered whole (a
// line past the limit, a body that breaks off, stdin after eof) fails the call
// instead, and the command, which never sees the end of its stdin then, is
// cancelled.
func (in *input) read() {
	defer close(in.done)
	for n := 1; ; n++ {
		line, err := readLine(in.br, in.limit)
		switch {
		case errors.Is(err, errLineTooLong):
			in.fail(errorf(apiv1.KindTooLarge, "input event %d is longer than the limit of %d bytes (berth serve --max-request-body); the command's stdin could not be delivered whole, so the call was cancelled: send stdin in smaller events (32 KiB is a good size)", n, in.limit))
			in.drain()
			return
		case err != nil && !errors.Is(err, io.EOF):
			in.bodyErr = err
			var ne net.Error
			if errors.As(err, &ne) {
				// The connection failed (the client went away, or finish cut the
				// body): net/http has cancelled the call, which says so.
				in.cancel()
				return
			}
			in.fail(errorf("invalid", "the request body broke off at input event %d (%v); the command's stdin could not be delivered whole, so the call was cancelled", n, err))
			return
		case len(bytes.TrimSpace(line)) == 0 && err != nil:
			in.sp.CloseWrite() // the clean end of the body
			return
		}
		if !in.event(n, line) {
			in.drain()
			return
		}
		if err != nil { // the last line, without its newline
			in.sp.CloseWrite()
			return
		}
	}
}

// event applies input event n (line); false when it is bad (the call is failed).
func (in *input) event(n int, line []byte) bool {
	var ev apiv1.Event
	if derr := decodeStrict(line, &ev); derr != nil {
		in.fail(errorf("invalid", "input event %d: %v", n, derr))
		return false
	}
	switch ev.Event {
	case apiv1.InputStdin:
		if in.eofAt > 0 {
			in.fail(errorf("invalid", "input event %d: stdin after the eof of input event %d; the stdin had ended, so the call was cancelled: send eof last", n, in.eofAt))
			return false
		}
		if _, werr := in.sp.Write(ev.Data); werr != nil {
			in.fail(errorf(apiv1.KindInternal, "input event %d: %v", n, werr))
			return false
		}
	case apiv1.InputEOF:
		if in.eofAt == 0 {
			in.eofAt = n
		}
		in.sp.CloseWrite()
	case apiv1.InputSignal:
		if ev.Signal < 1 || ev.Signal > 64 {
			in.fail(errorf("invalid", "input event %d: signal %d: want a Linux signal number, 1 to 64", n, ev.Signal))
			return false
		}
		select {
		case in.signals <- ev.Signal:
		default: // 16 signals the command has not been sent yet: drop this one
		}
	case apiv1.InputCancel:
		in.cancel()
	default:
		in.fail(errorf("invalid", "input event %d: unknown event %q; want stdin, eof, signal or cancel", n, ev.Event))
		return false
	}
	return true
}

// drain reads the rest of the body and drops it (after a bad event: nothing more
// reaches the command); bodyErr is why it did not end cleanly.
func (in *input) drain() {
	_, in.bodyErr = io.Copy(io.Discard, in.br)
}

// fail records the first bad input event (an *httpError) and cancels the call.
func (in *input) fail(err error) {
	in.mu.Lock()
	if in.bad == nil {
		in.bad = err
	}
	in.mu.Unlock()
	in.cancel()
}

// settle waits until the body's reader has stopped, or bodyEndWait has passed (a
// client may keep a body open after a bad event, which the reader then drains):
// a call cancelled because its connection ended is then told from one whose body
// broke off (badEvent), which the reader sees at the same moment.
func (in *input) settle() {
	t := time.NewTimer(bodyEndWait)
	defer t.Stop()
	select {
	case <-in.done:
	case <-t.C:
	}
}

// badEvent returns the first bad input event's error, or nil.
func (in *input) badEvent() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.bad
}

// bodyEndWait bounds how long settle waits for the body's reader, and how long
// closeConn lets a client read the answer of a connection it closes.
const bodyEndWait = time.Second

// finish is called once the answer's last event is written: stdin still to come is
// dropped, and the answer ends when the request body has ended (at once for a
// client that sent its whole body first), within grace (the server's body timeout)
// or until stop (the server's shutdown starts: the answer is whole, and the
// connection's end need not wait). A client that reads while it writes ends its
// body when it reads the result; ending the answer first would make Go's HTTP/1
// transport hold the result's bytes for 50 ms (maxWriteWaitBeforeConnReuse, when
// the body is still being written at the answer's end). The grace is long on purpose: a client on a
// loaded machine may take seconds to send the body's end after the result (a
// 1-second grace cut kept-alive connections of the Python SDK under CI load, and
// when the cut met the body's end, every later call on the connection answered
// 499: see below).
//
// The handler must not return while the reader may still read the body: net/http
// then reads the body's end itself after it stopped watching the connection, and
// its next read panics ("invalid concurrent Body.Read call", golang.org/issue/68560)
// and drops the connection. So a body still open after grace is cut (a read
// deadline in the past stops the reader), and the connection is closed after the
// answer: what follows on it is not a request. It is closed too when the body ended
// cleanly just as it was cut: net/http watches the connection from the body's end
// on (its background read), which the past deadline fails, cancelling the
// connection's context, the parent of every later request's on it.
func (in *input) finish(w http.ResponseWriter, r *http.Request, grace time.Duration, stop <-chan struct{}) {
	in.sp.Close()
	rc := http.NewResponseController(w)
	rc.Flush()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-in.done:
	case <-t.C:
	case <-stop:
	}
	select {
	case <-in.done:
		if in.bodyErr != nil {
			closeConn(w, r)
		}
		return
	default:
	}
	if rc.SetReadDeadline(time.Unix(1, 0)) != nil {
		return // HTTP/2: the stream's body is the handler's own, no race
	}
	<-in.done
	closeConn(w, r)
}

// closeConn ends an HTTP/1 answer whose request body is cut and closes its
// connection. The answer's header is out, so "Connection: close" can no longer
// say so: the connection is taken over (Hijack), the chunked answer's last chunk
// written, and the connection half-closed, then closed once the client has had
// bodyEndWait to read the answer (as net/http's own closeWriteAndWait does, so that
// the close's reset does not destroy the answer in the client's buffers).
func closeConn(w http.ResponseWriter, r *http.Request) {
	chunked := r.ProtoAtLeast(1, 1) && w.Header().Get("Content-Length") == ""
	conn, bw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	if chunked {
		bw.WriteString("0\r\n\r\n")
	}
	if bw.Flush() != nil {
		return
	}
	if hc, ok := conn.(interface{ CloseWrite() error }); ok {
		hc.CloseWrite()
	}
	conn.SetReadDeadline(time.Now().Add(bodyEndWait))
	io.Copy(io.Discard, conn)
}
