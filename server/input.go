package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
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

// input is the input side of a streamed exec request.
type input struct {
	br      *bufio.Reader
	limit   int64 // the longest event line
	sp      *spool
	signals chan int // signal events, for the command once it runs
	cancel  context.CancelFunc
	done    chan struct{} // closed when the reader has stopped
	mu      sync.Mutex
	bad     error // the first bad event: the call is cancelled and answers it
}

// isNDJSON reports whether r's body is declared as NDJSON.
func isNDJSON(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == NDJSON
}

// readFirstLine reads the first line of a streamed request body within the server's
// size (per line) and time limits, and enables full duplex: the answer may be
// written while the body is still read. It returns the line and the reader of the
// rest.
func (s *Server) readFirstLine(w http.ResponseWriter, r *http.Request) ([]byte, *bufio.Reader, error) {
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		return nil, nil, errorf(KindInternal, "a streamed request needs full duplex: %v", err)
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
		return nil, nil, errorf(KindTooLarge, "the request's first line is longer than the limit of %d bytes (berth serve --max-request-body); send large stdin as stdin events", s.maxBody)
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		w.Header().Set("Connection", "close")
		return nil, nil, errorf(KindRequestTimeout, "the request's first line did not arrive within %v", s.bodyTimeout)
	case errors.Is(err, io.EOF):
		return nil, nil, errorf("invalid", "request body: empty; send the exec request as the first line")
	}
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
	in := &input{br: br, limit: limit, sp: newSpool(stateDir, MaxStdinBuffered), signals: make(chan int, 16), cancel: cancel, done: make(chan struct{})}
	go in.read()
	return in
}

// read reads input events until the body ends or breaks; either ends the stdin.
func (in *input) read() {
	defer close(in.done)
	defer in.sp.CloseWrite()
	for n := 1; ; n++ {
		line, err := readLine(in.br, in.limit)
		if len(bytes.TrimSpace(line)) == 0 && err != nil {
			return // the end of the body (or the client went away: the call's context says so)
		}
		if errors.Is(err, errLineTooLong) {
			in.fail(fmt.Errorf("input event %d is longer than %d bytes; send stdin in smaller events", n, in.limit))
			return
		}
		var ev Event
		if derr := decodeStrict(line, &ev); derr != nil {
			in.fail(fmt.Errorf("input event %d: %v", n, derr))
			return
		}
		switch ev.Event {
		case InputStdin:
			if _, werr := in.sp.Write(ev.Data); werr != nil {
				in.fail(werr)
				return
			}
		case InputEOF:
			in.sp.CloseWrite()
		case InputSignal:
			if ev.Signal < 1 || ev.Signal > 64 {
				in.fail(fmt.Errorf("input event %d: signal %d: want a Linux signal number, 1 to 64", n, ev.Signal))
				return
			}
			select {
			case in.signals <- ev.Signal:
			default: // 16 signals the command has not been sent yet: drop this one
			}
		case InputCancel:
			in.cancel()
		default:
			in.fail(fmt.Errorf("input event %d: unknown event %q; want stdin, eof, signal or cancel", n, ev.Event))
			return
		}
		if err != nil {
			return
		}
	}
}

// fail records the first bad input event and cancels the call.
func (in *input) fail(err error) {
	in.mu.Lock()
	if in.bad == nil {
		in.bad = errorf("invalid", "%v", err)
	}
	in.mu.Unlock()
	in.cancel()
}

// badEvent returns the first bad input event's error, or nil.
func (in *input) badEvent() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.bad
}

// close ends the spool (a reader still waiting for the body stops when the handler
// returns and net/http closes it).
func (in *input) close() { in.sp.Close() }

// bodyEndWait bounds how long a streamed request's answer, once its last event is
// written, waits for the request body to end before it ends too.
const bodyEndWait = time.Second

// finish is called once the answer's last event is written: stdin still to come is
// dropped, and the answer ends when the request body has ended (at once for a
// client that sent its whole body first), within bodyEndWait. A client that reads
// while it writes ends its body when it reads the result; ending the answer first
// would make Go's HTTP/1 transport hold the result's bytes for 50 ms
// (maxWriteWaitBeforeConnReuse, when the body is still being written at the
// answer's end).
func (in *input) finish() {
	in.sp.Close()
	t := time.NewTimer(bodyEndWait)
	defer t.Stop()
	select {
	case <-in.done:
	case <-t.C:
	}
}
