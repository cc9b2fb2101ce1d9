"""One streamed exec call: ``POST /v1/sessions/{name}/exec`` with a streamed request
(``Content-Type: application/x-ndjson``: the ExecRequest on the first line, then
stdin, eof and cancel input events) and a streamed answer (``Accept:
application/x-ndjson``: started, stdout/stderr, result events), docs/api.md "Stdin
of any size".

Why this shape: stdin of any size goes as stdin events (the daemon spools them, so a
client that writes its whole body before it reads cannot deadlock); the body stays
open while the command runs so that an interrupt can send ``{"event":"cancel"}``,
after which the daemon kills the command's tree and answers the result with
``canceled`` (the tree is gone when that result comes); the body is ended once the
result is read, as the API asks. A connection that breaks cancels the exec too (the
daemon kills the tree of a client that disconnects), which is the fallback.
"""

import base64
import io
import json
import os
import socket
import ssl
import threading
import time
from typing import IO, Any, Dict, Iterator, Optional, Union

from . import errors
from ._transport import CONNECTION_ERRORS, Conn, Pool

NDJSON = "application/x-ndjson"

# Bytes of stdin per stdin event (the API suggests 32 KiB).
STDIN_PIECE = 32 << 10

# Stdin events written in one HTTP chunk.
CHUNK_TARGET = 256 << 10

# How long an interrupted call waits for the daemon's result (which comes once the
# tree is gone: SIGTERM, SIGKILL after at most 1 s) before it drops the connection.
CANCEL_WAIT = 15.0

# The longest answer line read (a shell-mode result holds the capped output).
MAX_LINE = 64 << 20

Stdin = Union[None, bytes, bytearray, memoryview, str, IO[bytes]]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event_line(ev: Dict[str, Any]) -> bytes:
    return json.dumps(ev, separators=(",", ":")).encode() + b"\n"


def _stdin_events(data: bytes) -> Iterator[bytes]:
    """HTTP chunks of stdin events for data."""
    buf = []
    size = 0
    for i in range(0, len(data), STDIN_PIECE):
        line = b'{"event":"stdin","data":"' + base64.b64encode(data[i : i + STDIN_PIECE]) + b'"}\n'
        buf.append(line)
        size += len(line)
        if size >= CHUNK_TARGET:
            yield _chunk(b"".join(buf))
            buf, size = [], 0
    if buf:
        yield _chunk(b"".join(buf))


class ExecCall:
    """One streamed exec on one connection; iterate :meth:`events` once."""

    def __init__(self, pool: Pool, path: str, request: Dict[str, Any], stdin: Stdin, read_timeout: Optional[float]) -> None:
        self.pool = pool
        self.path = path
        self.request = request
        self.read_timeout = read_timeout
        self.stdin = stdin
        self.conn: Optional[Conn] = None
        self.lock = threading.Lock()  # one writer of the body at a time
        self.body_open = False  # the body's last chunk is not yet sent
        self.broken = False  # the connection cannot be reused
        self.stop_writer = threading.Event()
        self.writer: Optional[threading.Thread] = None
        self.writer_error: Optional[BaseException] = None
        self.finished = False
        self.pending: Optional[Any] = None  # the answer whose end the pool reads

    # ---- the request body ----

    def _send(self, data: bytes) -> None:
        """Send bytes of the body (callers hold self.lock)."""
        sock = self.conn.sock if self.conn is not None else None
        if sock is None:  # http.client closed it: the answer said Connection: close
            raise BrokenPipeError("the connection is closed")
        sock.sendall(data)

    def _end_body(self, wait: float = 5.0) -> None:
        """Send the body's last chunk, once; a writer that does not give the lock back
        within wait (the daemon stopped reading) makes the connection unusable."""
        self.stop_writer.set()
        if not self.lock.acquire(timeout=wait):
            self.broken = True
            return
        try:
            if self.body_open:
                self.body_open = False
                try:
                    self._send(b"0\r\n\r\n")
                except OSError:
                    self.broken = True
        finally:
            self.lock.release()
        if self.writer is not None:
            self.writer.join(wait)
            if self.writer.is_alive():
                self.broken = True

    def _send_cancel(self) -> bool:
        """Send a cancel input event; False when the body is no longer open."""
        self.stop_writer.set()
        if not self.lock.acquire(timeout=2.0):
            return False
        try:
            if not self.body_open:
                return False
            try:
                self._send(_chunk(_event_line({"event": "cancel"})))
            except OSError:
                self.broken = True
                return False
            return True
        finally:
            self.lock.release()

    def _write_file(self, f: IO[bytes]) -> None:
        """The writer thread: stdin events from the file f, then eof."""
        try:
            while not self.stop_writer.is_set():
                data = f.read(STDIN_PIECE)
                if not data:
                    break
                if isinstance(data, str):
                    data = data.encode()
                with self.lock:
                    if not self.body_open or self.stop_writer.is_set():
                        return
                    self._send(_chunk(b'{"event":"stdin","data":"' + base64.b64encode(data) + b'"}\n'))
            with self.lock:
                if self.body_open and not self.stop_writer.is_set():
                    self._send(_chunk(b'{"event":"eof"}\n'))
        except BaseException as e:  # reading the caller's file, or the socket
            self.writer_error = e
            self.broken = True

    def _start(self) -> None:
        """Connect, send the head and the body's first line and the stdin that is at hand."""
        self.conn = c = self.pool.get(self.read_timeout)
        h = c.http
        try:
            h.putrequest("POST", self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.pool.ep.headers().items():
                h.putheader(k, v)
            h.putheader("Content-Type", NDJSON)
            h.putheader("Accept", NDJSON)
            h.putheader("Transfer-Encoding", "chunked")
            stdin = self.stdin
            first = _event_line(self.request)
            if stdin is None:
                first += b'{"event":"eof"}\n'
            # The head and the first chunk in one write (fewer wake-ups of the
            # daemon; no Nagle delay on TCP).
            h.cork = []  # type: ignore[attr-defined]
            try:
                h.endheaders(message_body=_chunk(first))
                held = b"".join(h.cork)  # type: ignore[attr-defined]
            finally:
                h.cork = None  # type: ignore[attr-defined]
            self.body_open = True
            self._send(held)
            if stdin is None:
                pass
            elif isinstance(stdin, (bytes, bytearray, memoryview, str)):
                data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
                for ch in _stdin_events(data):
                    self._send(ch)
                self._send(_chunk(b'{"event":"eof"}\n'))
            elif isinstance(c.sock, ssl.SSLSocket):
                # One TLS connection is not read and written from two threads at
                # once (OpenSSL forbids it): the stdin goes first; the daemon
                # spools it (up to 1 GiB ahead of the command), so this cannot
                # deadlock, but the output comes only once it is sent.
                while True:
                    data = stdin.read(STDIN_PIECE)
                    if not data:
                        break
                    for ch in _stdin_events(data.encode() if isinstance(data, str) else data):
                        self._send(ch)
                self._send(_chunk(b'{"event":"eof"}\n'))
            else:
                self.writer = threading.Thread(target=self._write_file, args=(stdin,), name="berth-stdin", daemon=True)
                self.writer.start()
        except CONNECTION_ERRORS as e:
            c.close()
            self.broken = True
            raise self.pool.ep.gone(e) from None
        except BaseException:
            c.close()
            self.broken = True
            raise

    # ---- the answer ----

    def events(self) -> Iterator[Dict[str, Any]]:
        """The answer's events as parsed JSON objects, the result last.

        Closing the iterator (or an exception in the caller, KeyboardInterrupt
        included) before the result cancels the command and waits, within
        CANCEL_WAIT, for the daemon to say its tree is gone.
        """
        self._start()
        assert self.conn is not None
        c = self.conn
        got_result = False
        try:
            try:
                resp = c.http.getresponse()
            except socket.timeout as e:
                raise errors.Timeout("berth serve at %s sent no answer within %ss" % (self.pool.ep.where, self.read_timeout)) from e
            except CONNECTION_ERRORS as e:
                raise self.pool.ep.gone(e) from None
            self.resp = resp
            if resp.status != 200:
                # One JSON line; the answer ends only when the body has (or a
                # second later), so read the line, not to the end.
                body = resp.readline(1 << 20)
                self.broken = True
                self._end_body(wait=1.0)
                raise errors.from_answer(resp.status, body)
            while True:
                line = self._readline(resp)
                if not line:
                    raise self.pool.ep.gone(ConnectionError("the answer ended before the result"))
                if not line.strip():
                    continue
                ev = json.loads(line)
                kind = ev.get("event")
                if kind == "result":
                    got_result = True
                    self._end_body()
                    # The answer ends once the daemon has seen the body end: a
                    # round trip that the pool waits for when it next hands the
                    # connection out, not this call.
                    self.pending = resp
                    self.finished = True
                    yield ev
                    return
                if kind == "error":
                    self._end_body()
                    self._drain(resp)
                    raise errors.from_info(ev.get("error") or {}, 200)
                yield ev
        except GeneratorExit:
            if not got_result:
                self._cancel()
            raise
        except BaseException:
            if not got_result:
                self._cancel()
            raise
        finally:
            self._release()

    def _readline(self, resp: Any) -> bytes:
        try:
            line = resp.readline(MAX_LINE)
        except socket.timeout as e:
            raise errors.Timeout("berth serve at %s sent nothing for %ss" % (self.pool.ep.where, self.read_timeout)) from e
        except CONNECTION_ERRORS as e:
            self.broken = True
            raise self.pool.ep.gone(e) from None
        if self.writer_error is not None and not isinstance(self.writer_error, OSError):
            raise self.writer_error
        return line

    def _drain(self, resp: Any) -> None:
        """Read the answer to its end so that the connection can be kept."""
        try:
            if resp.read(1 << 16):
                self.broken = True
        except (OSError, *CONNECTION_ERRORS):
            self.broken = True
        if resp.will_close:
            self.broken = True
        self.finished = True

    def _cancel(self) -> None:
        """Cancel the command: a cancel event, then wait for the result (the tree is
        gone when it comes); without it, drop the connection (the daemon then kills
        the tree of a client that went away)."""
        self.broken = True
        resp = getattr(self, "resp", None)
        if resp is None or resp.status != 200 or not self._send_cancel():
            self._end_body(wait=1.0)
            return
        c = self.conn
        assert c is not None
        deadline = time.monotonic() + CANCEL_WAIT
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if c.sock is not None:
                    c.sock.settimeout(left)
                line = resp.readline(MAX_LINE)
                if not line:
                    break
                if b'"event":"result"' in line or b'"event":"error"' in line:
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") in ("result", "error"):
                        break
        except BaseException:  # a second interrupt, a timeout: drop the connection
            pass
        self._end_body(wait=1.0)

    def _release(self) -> None:
        c = self.conn
        if c is None:
            return
        self.conn = None
        if self.finished and not self.broken and (self.writer is None or not self.writer.is_alive()):
            c.pending = self.pending
            self.pool.put(c)
        else:
            self.stop_writer.set()
            c.close()
