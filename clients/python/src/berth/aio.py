"""The asyncio client of ``berth serve``: :class:`AsyncClient`, :class:`AsyncSession`
and :class:`AsyncStream`, the calls of :class:`berth.Client` as coroutines
(docs/python.md, "Async").

Why a hand-written HTTP/1.1 client: this package uses the standard library only,
and the standard library has no asyncio HTTP client (``http.client`` and ``urllib``
block a thread: run in threads, they would hold a thread per call in flight, and a
cancelled task could not stop its call). berth's API needs little of HTTP/1.1: a
request line and headers; a body with a Content-Length, or a chunked one that stays
open while the command runs (a streamed exec's input events, docs/api.md "Stdin of
any size"); answers framed by Content-Length, by chunks, or by the connection's end.
That is all this module speaks, over ``asyncio`` streams (a unix socket, TCP, TLS).

What it shares with the sync client: the endpoint (``_transport.Endpoint``: address,
token, TLS, the errors that name them), the wire's constants and encoders
(``_exec``), the checks and building of a request, the events and the gathering of
output (``client``), the errors (``errors.from_answer``, ``from_info``) and the
result types (``results``).
"""

import asyncio
import json
import os
import ssl
import urllib.parse
from typing import IO, Any, AsyncIterable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from . import errors
from ._exec import CANCEL_WAIT, CHUNK_TARGET, MAX_LINE, NDJSON, STDIN_PIECE, _chunk, _event_line, _stdin_events
from ._transport import MAX_IDLE, MAX_IDLE_SECONDS, MAX_SOCKET_PATH, PENDING_END_WAIT, Endpoint
from .client import DEFAULT_MAX_OUTPUT, _check_owner, _Collector, _event, _exec_request, _json_answer, _quote, _seconds
from .results import DriverInfo, Event, ExecResult, SessionInfo, Status, WarmPool

__all__ = ["AsyncClient", "AsyncSession", "AsyncStream", "AsyncStdin"]

#: What an async call's ``stdin`` may be: bytes, a str (sent as UTF-8), a binary
#: file object (read in the loop's default executor), or an async iterable of
#: bytes or str (e.g. an async generator), each of any size; None: EOF at once.
AsyncStdin = Union[None, bytes, bytearray, memoryview, str, IO[bytes], AsyncIterable[Union[bytes, str]]]

# The stream buffer of a connection: the longest head line of an answer, and about
# half of what is read ahead of the caller (asyncio pauses the socket at twice it).
_STREAM_LIMIT = 64 << 10

# Bytes of an answer's body read at a time.
_PIECE = 64 << 10

_EOF_EVENT = b'{"event":"eof"}\n'
_CANCEL_CHUNK = _chunk(_event_line({"event": "cancel"}))
_LAST_CHUNK = b"0\r\n\r\n"


class _BadAnswer(Exception):
    """An answer that is not the HTTP/1.1 berth serve sends."""


# Errors that mean a connection broke: the daemon closed or reset it (OSError, TLS
# errors included), an answer ended early (IncompleteReadError is an EOFError) or is
# not HTTP. berth's own errors are OSErrors too (Unavailable, Timeout): every
# ``except _BROKEN`` below lets an errors.Error through first, or cannot meet one.
_BROKEN = (OSError, EOFError, asyncio.LimitOverrunError, _BadAnswer)


class _SourceError(Exception):
    """Reading the caller's stdin failed; the cause is the caller's error."""


def _head(method: str, path: str, headers: Mapping[str, str]) -> bytes:
    """A request's line and headers."""
    if not path.isascii() or not path.isprintable() or " " in path:
        raise errors.Invalid("request path %r: not a percent-encoded path (a bug in this client)" % (path,))
    lines = ["%s %s HTTP/1.1" % (method, path)]
    for k, v in headers.items():
        if "\r" in v or "\n" in v:
            raise errors.Invalid("header %s: the value holds a line break" % k)
        lines.append("%s: %s" % (k, v))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Conn:
    """One connection to the daemon: its asyncio streams, the answer whose end is
    still to come (``pending``, read before the connection is used again), and a
    watchdog that drops the connection once ``watch``'s seconds pass with nothing
    read or written (``timed_out`` then says why it broke)."""

    def __init__(self, pool: "_Pool", reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.reused = False
        self.pending: Optional[_Response] = None
        self.timed_out = False
        self._limit: Optional[float] = None
        self._last = 0.0
        self._timer: Optional[asyncio.TimerHandle] = None
        pool.live.add(self)

    # ---- the watchdog ----

    def watch(self, seconds: Optional[float]) -> None:
        """Drop the connection after seconds without progress; None: never."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._limit = seconds
        self._last = self.loop.time()
        if seconds is not None:
            self._timer = self.loop.call_later(seconds, self._check)

    def progress(self) -> None:
        self._last = self.loop.time()

    def _check(self) -> None:
        self._timer = None
        if self._limit is None:
            return
        left = self._last + self._limit - self.loop.time()
        if left > 0:
            self._timer = self.loop.call_later(left, self._check)
            return
        self.timed_out = True
        self.writer.transport.abort()

    # ---- I/O ----

    def send(self, data: bytes) -> None:
        """Queue bytes to send (asyncio sends them as the socket takes them)."""
        self.writer.write(data)

    async def drain(self) -> None:
        """Wait until the queued bytes are below asyncio's high-water mark."""
        await self.writer.drain()
        self.progress()

    @property
    def closing(self) -> bool:
        return self.writer.transport.is_closing()

    def alive(self) -> bool:
        """Whether an idle connection is still open: a daemon that closed it (it
        stopped, restarted, or dropped it as idle) has made its reader see EOF."""
        return not self.closing and not self.reader.at_eof() and self.reader.exception() is None

    async def finish_pending(self) -> bool:
        """Read the pending answer to its end (within PENDING_END_WAIT); False when
        the connection cannot be used again (more than the end came, it broke, or
        the daemon closes it)."""
        resp, self.pending = self.pending, None
        if resp is None:
            return True
        self.watch(PENDING_END_WAIT)
        try:
            rest = await resp.read_all(1 << 16)
        except _BROKEN:
            return False
        return not rest and not resp.will_close

    def close(self) -> None:
        """Drop the connection now (idempotent); the socket is closed by the loop's
        next turn."""
        self.watch(None)
        self.pool.live.discard(self)
        try:
            self.writer.transport.abort()
        except RuntimeError:  # its event loop is closed: the socket goes with the transport
            pass

    async def wait_closed(self) -> None:
        try:
            await self.writer.wait_closed()
        except Exception:  # the error that closed it: nothing to do
            pass


class _Response:
    """One answer: ``status``, ``headers`` (lower-case names) and its body, read as
    needed by ``readline`` and ``read_all``."""

    def __init__(self, conn: _Conn, status: int, headers: Dict[str, str], method: str, version: str) -> None:
        self.conn = conn
        self.status = status
        self.headers = headers
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self.will_close = "close" in tokens or (version == "HTTP/1.0" and "keep-alive" not in tokens)
        self._chunked = False
        self._crlf = False  # a chunk's CRLF is still to be read
        self._left: Optional[int] = None  # bytes left of the chunk, or of a Content-Length body
        self._done = False
        self._buf = bytearray()
        self._scan = 0  # _buf[:_scan] holds no newline
        if method == "HEAD" or status in (204, 304):
            self._done = True
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
            self._left = 0
        elif "content-length" in headers:
            try:
                n = int(headers["content-length"])
            except ValueError:
                n = -1
            if n < 0:
                raise _BadAnswer("Content-Length %r" % headers["content-length"])
            self._left = n
            self._done = n == 0
        else:  # the body ends with the connection
            self.will_close = True

    async def _piece(self) -> bytes:
        """The body's next bytes; b"" at its end."""
        if self._done:
            return b""
        r = self.conn.reader
        if self._chunked:
            if self._crlf:
                if await r.readexactly(2) != b"\r\n":
                    raise _BadAnswer("a chunk not followed by CRLF")
                self._crlf = False
            if self._left == 0:
                line = await r.readuntil(b"\r\n")
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    size = -1
                if size < 0:
                    raise _BadAnswer("chunk size line %r" % line[:40])
                if size == 0:
                    while await r.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    self._done = True
                    self.conn.progress()
                    return b""
                self._left = size
        if self._left is None:
            data = await r.read(_PIECE)
            if not data:
                self._done = True
                return b""
        else:
            data = await r.read(min(self._left, _PIECE))
            if not data:
                raise asyncio.IncompleteReadError(b"", self._left)
            self._left -= len(data)
            if self._left == 0:
                if self._chunked:
                    self._crlf = True
                else:
                    self._done = True
        self.conn.progress()
        return data

    async def readline(self, limit: int) -> bytes:
        """The body's next line, its newline included; what is left without one at
        the body's end; b"" after it. A line longer than limit is _BadAnswer."""
        while True:
            i = self._buf.find(b"\n", self._scan)
            if i >= 0:
                line = bytes(self._buf[: i + 1])
                del self._buf[: i + 1]
                self._scan = 0
                return line
            self._scan = len(self._buf)
            if self._scan > limit:
                raise _BadAnswer("an answer line longer than %d bytes" % limit)
            data = await self._piece()
            if not data:
                line = bytes(self._buf)
                self._buf.clear()
                self._scan = 0
                return line
            self._buf += data

    async def read_all(self, limit: int) -> bytes:
        """The rest of the body (at most limit bytes: more is _BadAnswer)."""
        data = bytearray(self._buf)
        self._buf.clear()
        self._scan = 0
        while True:
            if len(data) > limit:
                raise _BadAnswer("an answer longer than %d bytes" % limit)
            piece = await self._piece()
            if not piece:
                return bytes(data)
            data += piece


async def _read_head(c: _Conn, method: str) -> _Response:
    """Read an answer's status line and headers (informational 1xx answers skipped)."""
    while True:
        try:
            raw = await c.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise _BadAnswer("an answer's head longer than %d bytes" % _STREAM_LIMIT) from None
        c.progress()
        lines = raw[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
            raise _BadAnswer("not an HTTP/1.1 answer: %r" % lines[0][:100])
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(":")
            if not sep:
                raise _BadAnswer("a header line without a colon: %r" % line[:100])
            k, v = k.strip().lower(), v.strip()
            headers[k] = headers[k] + ", " + v if k in headers else v
        status = int(parts[1])
        if 100 <= status < 200:
            continue
        return _Response(c, status, headers, method, parts[0])


class _Pool:
    """The connections of one AsyncClient: those in flight (``live``) and up to
    MAX_IDLE kept alive for the next call (``idle``). A connection serves one call at
    a time; a kept one is checked (its pending end read, the daemon not gone) before
    it serves another, and one idle for MAX_IDLE_SECONDS is dropped."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.idle: List[_Conn] = []
        self.live: Set[_Conn] = set()

    async def get(self, timeout: Optional[float]) -> _Conn:
        """A connection for one call, watched with timeout (None: unwatched).

        Raises :class:`berth.Unavailable` when no daemon answers (naming the socket
        or address and how to start it, or the TLS failure), :class:`berth.Timeout`
        when the connect takes longer than timeout (or the client's)."""
        loop = asyncio.get_running_loop()
        while self.idle:
            c = self.idle.pop()
            try:
                ok = c.loop is loop and loop.time() - c.idle_since <= MAX_IDLE_SECONDS and await c.finish_pending() and c.alive()
            except BaseException:  # cancelled while reading the pending end
                c.close()
                raise
            if not ok:
                c.close()
                continue
            c.reused = True
            c.watch(timeout)
            return c
        return await self._connect(timeout)

    async def _connect(self, timeout: Optional[float]) -> _Conn:
        ep = self.ep
        t = timeout if timeout is not None else ep.timeout
        dirfd = -1
        try:
            if ep.unix_path is not None:
                path = ep.unix_path
                if len(path.encode()) > MAX_SOCKET_PATH:
                    # as berth serve binds it (docs/api.md, "The socket")
                    dirfd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                    path = "/proc/self/fd/%d/%s" % (dirfd, os.path.basename(path))
                opening = asyncio.open_unix_connection(path, limit=_STREAM_LIMIT)
            else:
                assert ep.tcp is not None
                host, port = ep.tcp
                opening = asyncio.open_connection(host, port, limit=_STREAM_LIMIT, ssl=ep.tls, server_hostname=host if ep.tls else None)
            reader, writer = await (asyncio.wait_for(opening, t) if t is not None else opening)
        except ssl.SSLError as e:
            raise errors.Unavailable(
                "TLS with berth serve at %s failed: %s (set BERTH_TLS_CA to the PEM file of its CA)" % (ep.where, e)
            ) from None
        except asyncio.TimeoutError as e:  # TimeoutError, an OSError, from 3.11
            raise errors.Timeout("connecting to berth serve at %s: no answer within %ss" % (ep.where, t)) from e
        except OSError as e:
            raise ep.not_running(e) from None
        finally:
            if dirfd >= 0:
                os.close(dirfd)
        c = _Conn(self, reader, writer)
        c.watch(timeout)
        return c

    def put(self, c: _Conn) -> None:
        """Keep a connection whose answer was read to its end, or whose end is left
        pending (``c.pending``)."""
        c.watch(None)
        c.idle_since = c.loop.time()
        if len(self.idle) < MAX_IDLE:
            self.idle.append(c)
        else:
            c.close()

    async def close(self) -> None:
        idle, self.idle = self.idle, []
        loop = asyncio.get_running_loop()
        for c in idle:
            c.close()
        await asyncio.gather(*(c.wait_closed() for c in idle if c.loop is loop))


async def _request(
    pool: _Pool,
    method: str,
    path: str,
    body: Optional[bytes],
    headers: Mapping[str, str],
    timeout: Optional[float],
) -> Tuple[int, Dict[str, str], bytes]:
    """Make a request with a bytes body or none and read the whole answer: (status,
    headers, body). A kept connection that turns out broken is replaced once for
    methods that are safe to repeat (GET, PUT, DELETE); other breaks are
    :class:`berth.Unavailable`, no answer within timeout :class:`berth.Timeout`."""
    idempotent = method in ("GET", "HEAD", "PUT", "DELETE")
    for attempt in (0, 1):
        c = await pool.get(timeout)
        keep = False
        try:
            h = pool.ep.headers()
            h.update(headers)
            if body is not None or method in ("POST", "PUT", "PATCH"):
                h["Content-Length"] = str(len(body or b""))
            c.send(_head(method, path, h) + (body or b""))
            await c.drain()
            resp = await _read_head(c, method)
            data = await resp.read_all(1 << 30)
            keep = not resp.will_close
        except errors.Error:
            raise
        except _BROKEN as e:
            if c.timed_out:
                raise errors.Timeout("berth serve at %s did not answer %s %s within %ss" % (pool.ep.where, method, path, timeout)) from None
            if attempt == 0 and c.reused and idempotent:
                continue
            raise pool.ep.gone(e) from None
        finally:
            if keep:
                pool.put(c)
            else:
                c.close()
        return resp.status, resp.headers, data
    raise AssertionError("unreachable")


class _ExecCall:
    """One streamed exec (docs/api.md, "Stdin of any size") on its own connection.

    The head, the body's first line (the ExecRequest) and a stdin that is small and
    at hand go in one write; other stdin is sent by a task (the feeder) while the
    answer is read. At the result (or an error event) the body is ended and the
    connection goes back to the pool with the answer's end pending (the daemon sends
    it once it has read the body's end). Given up before that (:meth:`abort`), the
    call sends a cancel event and waits, within CANCEL_WAIT, for the result, which
    comes once the command's tree is gone; else it drops the connection, and the
    daemon kills the tree of a client that went away.
    """

    def __init__(self, pool: _Pool, path: str, request: Dict[str, Any], stdin: AsyncStdin, read_timeout: Optional[float]) -> None:
        self.pool = pool
        self.path = path
        self.request = request
        self.stdin = stdin
        self.read_timeout = read_timeout
        self.conn: Optional[_Conn] = None
        self.resp: Optional[_Response] = None
        self.started = False
        self.body_open = False  # the body's last chunk is not yet sent
        self.ended = False  # the result or an error event came
        self.feeder: Optional["asyncio.Task[None]"] = None
        self.feed_error: Optional[BaseException] = None

    # ---- the request ----

    async def _start(self) -> None:
        self.started = True
        self.conn = c = await self.pool.get(self.read_timeout)
        h = self.pool.ep.headers()
        h.update({"Content-Type": NDJSON, "Accept": NDJSON, "Transfer-Encoding": "chunked"})
        stdin = self.stdin
        first = _event_line(self.request)
        parts = [_head("POST", self.path, h)]
        if stdin is None:
            parts.append(_chunk(first + _EOF_EVENT))
        else:
            parts.append(_chunk(first))
            if isinstance(stdin, (bytes, bytearray, memoryview, str)):
                data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
                if len(data) <= CHUNK_TARGET:
                    parts.extend(_stdin_events(data))
                    parts.append(_chunk(_EOF_EVENT))
                    stdin = None
                else:
                    stdin = data
        try:
            c.send(b"".join(parts))
            self.body_open = True
            await c.drain()
        except _BROKEN as e:
            raise self._broken(e) from None
        if stdin is not None:
            # Only now: one task at a time waits in drain (Python 3.9 allows no more).
            self.feeder = asyncio.get_running_loop().create_task(self._feed(stdin))

    async def _feed(self, stdin: AsyncStdin) -> None:
        """The feeder task: stdin events, then eof. A failure to read the caller's
        stdin drops the connection (the daemon kills the command) and is raised by
        the reader; a broken connection is the reader's to report."""
        c = self.conn
        assert c is not None
        src = _StdinReader(stdin)
        try:
            while True:
                data = await src.read()
                if not data:
                    break
                for ch in _stdin_events(data):
                    c.send(ch)
                    await c.drain()
            c.send(_chunk(_EOF_EVENT))
            await c.drain()
        except _SourceError as e:
            self.feed_error = e.__cause__
            c.close()
        except _BROKEN:
            pass

    async def _stop_feeder(self) -> None:
        t = self.feeder
        if t is None:
            return
        if not t.done():
            t.cancel()
            await asyncio.wait({t})
        self.feeder = None
        if not t.cancelled():
            t.exception()  # retrieved: it is the reader's to report

    async def send_cancel(self) -> bool:
        """Send a cancel input event; False when the body is no longer open."""
        if self.conn is None or not self.body_open or self.ended:
            return False
        await self._stop_feeder()
        c = self.conn
        if c is None or not self.body_open or self.ended or c.closing:
            return False
        c.send(_CANCEL_CHUNK)
        return True

    # ---- the answer ----

    def _broken(self, e: BaseException) -> BaseException:
        """The error of a connection that broke during the call."""
        if self.feed_error is not None:
            return self.feed_error
        if self.conn is not None and self.conn.timed_out:
            return errors.Timeout("berth serve at %s sent nothing for %ss" % (self.pool.ep.where, self.read_timeout))
        return self.pool.ep.gone(e)

    async def _readline(self) -> bytes:
        assert self.resp is not None
        try:
            line = await self.resp.readline(MAX_LINE)
        except _BROKEN as e:
            raise self._broken(e) from None
        if not line:
            raise self._broken(ConnectionError("the answer ended before the result"))
        if self.feed_error is not None:  # the command never got its whole stdin
            raise self.feed_error
        return line

    async def next_event(self) -> Dict[str, Any]:
        """The answer's next event as parsed JSON, the result last (after which the
        call is done: do not call again). Raises the berth error of an error answer
        or event, Timeout, Unavailable; the caller must :meth:`abort` on any
        exception."""
        if not self.started:
            await self._start()
            c = self.conn
            assert c is not None
            try:
                self.resp = resp = await _read_head(c, "POST")
            except _BROKEN as e:
                raise self._broken(e) from None
            if resp.status != 200:
                # One JSON line; the answer ends only once the body has, so read
                # the line, not to the end (the connection is dropped: abort).
                try:
                    body = await resp.readline(1 << 20)
                except _BROKEN:
                    body = b""
                raise errors.from_answer(resp.status, body)
        while True:
            line = await self._readline()
            if not line.strip():
                continue
            ev = json.loads(line)
            kind = ev.get("event")
            if kind in ("result", "error"):
                await self._end()
                if kind == "error":
                    raise errors.from_info(ev.get("error") or {}, 200)
            return ev

    async def _end(self) -> None:
        """End the body at the result, and keep the connection with the answer's
        end pending."""
        self.ended = True
        await self._stop_feeder()
        c, resp = self.conn, self.resp
        assert c is not None and resp is not None
        self.conn = None
        if self.body_open and not c.closing and self.feed_error is None and not resp.will_close:
            self.body_open = False
            c.send(_LAST_CHUNK)
            c.pending = resp
            self.pool.put(c)
        else:
            self.body_open = False
            c.close()

    async def abort(self) -> None:
        """Give the call up (an exception, a cancelled task, the stream closed): a
        command still running is cancelled (a cancel event, then up to CANCEL_WAIT
        for its result, which comes once its tree is gone) and the connection is
        dropped, which cancels it too. Idempotent; leaves no task or connection. A
        cancellation of the caller during the wait stops it and propagates."""
        c = self.conn
        if c is None:
            return
        try:
            if self.resp is not None and self.resp.status == 200 and not self.ended and await self.send_cancel():
                try:
                    await asyncio.wait_for(self._until_result(), CANCEL_WAIT)
                except (asyncio.TimeoutError, ValueError, *_BROKEN):
                    pass
        finally:
            self.conn = None
            self.body_open = False
            c.close()
            await self._stop_feeder()
            await c.wait_closed()

    async def _until_result(self) -> None:
        assert self.resp is not None
        while True:
            line = await self.resp.readline(MAX_LINE)
            if not line:
                return
            if b'"event":"result"' in line or b'"event":"error"' in line:
                if json.loads(line).get("event") in ("result", "error"):
                    return


class _StdinReader:
    """The caller's stdin as pieces of bytes, read as the feeder sends them. A file
    object is read in the loop's default executor; errors of the source are
    _SourceError (their cause the caller's error)."""

    def __init__(self, src: AsyncStdin) -> None:
        self.src = src
        self.it: Any = None
        self.done = False

    async def read(self) -> bytes:
        if self.done:
            return b""
        src = self.src
        if isinstance(src, (bytes, bytearray, memoryview, str)):
            self.done = True
            return src.encode() if isinstance(src, str) else bytes(src)
        try:
            if hasattr(src, "__aiter__"):
                if self.it is None:
                    self.it = src.__aiter__()  # type: ignore[union-attr]
                try:
                    data = await self.it.__anext__()
                except StopAsyncIteration:
                    data = b""
                if not isinstance(data, (bytes, bytearray, memoryview, str)):
                    raise errors.Invalid("stdin: the async iterable gave a %s; want bytes or str" % type(data).__name__)
            else:
                data = await asyncio.get_running_loop().run_in_executor(None, src.read, STDIN_PIECE)  # type: ignore[union-attr]
        except Exception as e:
            raise _SourceError() from e
        if not data:
            self.done = True
            return b""
        return data.encode() if isinstance(data, str) else bytes(data)


def _check_stdin(stdin: AsyncStdin, session: str) -> None:
    if stdin is None or isinstance(stdin, (bytes, bytearray, memoryview, str)) or hasattr(stdin, "read") or hasattr(stdin, "__aiter__"):
        return
    raise errors.Invalid(
        "stdin %r: want bytes, str, a binary file object or an async iterable of bytes" % (type(stdin).__name__,), session=session
    )


class AsyncClient:
    """An asyncio client of a running ``berth serve``: the calls of
    :class:`berth.Client` as coroutines.

    Args: as :class:`berth.Client`: ``host`` (``unix:///PATH``,
    ``https://HOST:PORT`` or ``http://127.0.0.1:PORT``; default ``$BERTH_HOST``, else
    the socket of the state dir), ``token_file`` (a TCP daemon's bearer token file;
    default ``$BERTH_TOKEN_FILE``; ``$BERTH_TLS_CA`` names an https daemon's CA),
    ``state_dir``, and ``timeout`` (seconds for the connect and the calls that are not
    a command; None: no bound).

    Raises :class:`berth.Invalid` for a bad host, token file or ``timeout``. Nothing
    is connected until the first call; a daemon that does not answer then is
    :class:`berth.Unavailable`, naming the socket or address and how to start it.

    Any number of tasks of one event loop may share it, each call in flight on a
    connection of its own; up to 16 idle connections are kept for later calls (one
    kept from another event loop, e.g. an earlier ``asyncio.run``, is dropped). It
    is not thread-safe. ``async with AsyncClient() as c:`` closes the kept
    connections at the end, as :meth:`close` does.
    """

    def __init__(
        self,
        host: Optional[str] = None,
        token_file: Optional[str] = None,
        *,
        state_dir: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        timeout = _seconds(timeout)
        self._ep = Endpoint(host, token_file, state_dir, timeout)
        self._pool = _Pool(self._ep)
        self.timeout = timeout

    @property
    def where(self) -> str:
        """The daemon's address: ``unix:///PATH`` or ``http(s)://HOST:PORT``."""
        return self._ep.where

    async def close(self) -> None:
        """Close the kept idle connections (calls after this open new ones; calls in
        flight keep theirs, closed or kept as they end)."""
        await self._pool.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return "berth.AsyncClient(%r)" % self._ep.where

    # ---- plumbing ----

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: Optional[bytes] = None,
        expect: Sequence[int] = (200,),
    ) -> Any:
        """Make a call; returns the decoded JSON answer (None for an empty one)."""
        h: Dict[str, str] = {}
        data = raw
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            h["Content-Type"] = "application/json"
        status, _, answer = await _request(self._pool, method, path, data, h, self.timeout)
        return _json_answer(self.where, method, path, status, answer, expect)

    async def _get_bytes(self, path: str) -> bytes:
        status, _, answer = await _request(self._pool, "GET", path, None, {}, self.timeout)
        if status != 200:
            raise errors.from_answer(status, answer)
        return answer

    # ---- the API ----

    def session(self, name: str, *, owner: Optional[str] = None) -> "AsyncSession":
        """The session ``name`` (e.g. ``"chat:1"``) as an :class:`AsyncSession`; nothing
        is created until a call. An empty or non-str name is :class:`berth.Invalid`
        at once, one that breaks berth's rules at the first call; ``owner`` is
        reserved (any value but None is :class:`berth.Unsupported`), as for
        :meth:`berth.Client.session`."""
        _check_owner(name, owner)
        return AsyncSession(self, name)

    async def sessions(self) -> List[SessionInfo]:
        """Every recorded session (``GET /v1/sessions``), sorted by name: a
        :class:`berth.SessionInfo` each (also readable as the API's dict)."""
        return [SessionInfo(r) for r in await self._call("GET", "/v1/sessions") or []]

    async def pools(self) -> List[WarmPool]:
        """Every rule's warm pool (``GET /v1/pools``), in rule order: a
        :class:`berth.WarmPool` each; ``[]`` when no rule has a pool."""
        return [WarmPool(p) for p in await self._call("GET", "/v1/pools") or []]

    async def status(self) -> Status:
        """The daemon's identity (``GET /v1/status``), asking no driver: a
        :class:`berth.Status` (``.api``, ``.version``, ``.pid``, ``.state_dir``, ...)."""
        return Status(await self._call("GET", "/v1/status") or {})

    async def health(self) -> Dict[str, Any]:
        """``GET /v1/health``: ``status`` (``ok``, ``degraded``), the store, and each
        driver the config's rules name with its health. A daemon whose store cannot
        be used answers 503 (:class:`berth.Unavailable`)."""
        return dict(await self._call("GET", "/v1/health") or {})

    async def drivers(self) -> List[DriverInfo]:
        """``GET /v1/drivers``: every driver the daemon knows, a
        :class:`berth.DriverInfo` each (``.name``, ``.health``, ``.capabilities``, ...)."""
        return [DriverInfo(d) for d in await self._call("GET", "/v1/drivers") or []]

    async def explain(self, name: str) -> Dict[str, Any]:
        """``GET /v1/config/explain``: how the config places session ``name`` (a dict,
        as ``berth config explain --json``); :class:`berth.Invalid` for a name that no
        rule matches or that breaks the rules."""
        return dict(await self._call("GET", "/v1/config/explain?session=" + urllib.parse.quote(name, safe="")) or {})

    async def prune(self, *, dry_run: bool = False) -> Dict[str, Any]:
        """``POST /v1/prune``: one retention round now; the report of ``berth prune --json``."""
        return dict(await self._call("POST", "/v1/prune", {"dry_run": True} if dry_run else {}) or {})


class AsyncStream:
    """The events of a streamed exec (:meth:`AsyncSession.stream`), in the daemon's
    order: ``async for ev in stream`` gives :class:`berth.Event` objects, the last
    ``"exit"`` with the :class:`berth.ExecResult` (also kept in :attr:`result`).

    The call starts at the first ``__anext__``, which raises the errors that stop it
    before the command runs (no daemon, a bad session name, ...). Given up before
    ``"exit"`` (:meth:`aclose`, leaving ``async with``, an exception in the loop
    inside ``async with``, or the task cancelled while it waits for an event), the
    command is cancelled: its process tree is killed and the stream waits (at most
    15 s) for the daemon to say it is gone. A stream dropped unclosed before its end
    drops its connection, which makes the daemon kill the tree too.
    """

    def __init__(self, call: _ExecCall) -> None:
        self._call = call
        self._done = False
        self.result: Optional[ExecResult] = None

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> Event:
        if self._done:
            raise StopAsyncIteration
        try:
            raw = await self._call.next_event()
        except BaseException:
            self._done = True
            await self._call.abort()
            raise
        ev = _event(raw)
        if ev.kind == "exit":
            self.result = ev.result
            self._done = True
        return ev

    async def aclose(self) -> None:
        """Stop reading; a command still running is cancelled (its tree killed),
        and this returns once the daemon says it is gone (bounded: 15 s)."""
        self._done = True
        await self._call.abort()

    async def cancel(self) -> bool:
        """Ask the daemon to cancel the command without stopping the iteration (from
        another task): the tree is killed and the reader then gets the ``"exit"``
        event with ``result.canceled`` set. Returns False when the request body is
        already closed (the command has ended, or its result arrived) or the call
        has not started, and nothing was sent."""
        return await self._call.send_cancel()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __del__(self) -> None:
        c = self._call.conn
        if c is not None:
            c.close()


class AsyncSession:
    """One berth session of an :class:`AsyncClient`: the calls of
    :class:`berth.Session` as coroutines (commands, lifecycle, one file's bytes; not
    jobs, upload or download: use a :class:`berth.Client` in a thread for those). Get
    one with :meth:`AsyncClient.session`."""

    def __init__(self, client: AsyncClient, name: str) -> None:
        self.client = client
        self.name = name
        self._path = "/v1/sessions/" + _quote(name)

    def __repr__(self) -> str:
        return "berth.AsyncSession(%r)" % self.name

    # ---- commands ----

    def _stream(self, argv: Optional[Sequence[str]], shell: Optional[str], timeout: Optional[float], env: Optional[Mapping[str, Any]],
                cwd: Optional[str], stdin: AsyncStdin, max_output: Optional[int], user: Optional[str], recreate: bool) -> AsyncStream:
        req, read_timeout = _exec_request(self.name, argv, shell, timeout, env, cwd, max_output, user, recreate)
        _check_stdin(stdin, self.name)
        return AsyncStream(_ExecCall(self.client._pool, self._path + "/exec", req, stdin, read_timeout))

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, Any]] = None,
        cwd: Optional[str] = None,
        stdin: AsyncStdin = None,
        max_output: Optional[int] = DEFAULT_MAX_OUTPUT,
        user: Optional[str] = None,
        recreate: bool = False,
        check: bool = False,
    ) -> ExecResult:
        """Run ``argv`` (no implicit shell) in the session's sandbox, creating it when
        needed, and return its :class:`berth.ExecResult` once it has ended.

        Args:
            argv: the program and its arguments, e.g. ``["make", "test"]``.
            timeout: seconds after which its whole process tree is killed; the
                result then says ``timed_out`` (exit code 143). None: no limit.
            env: variables for this exec only, over the sandbox's environment.
            cwd: working directory (a missing one is :class:`berth.Invalid`).
            stdin: bytes, str (UTF-8), a binary file object or an async iterable of
                bytes or str, of any size (:data:`AsyncStdin`); None: EOF at once.
            max_output: bytes kept per stream (the rest dropped and counted:
                ``truncated``); default 16 MiB; None for no cap.
            user: run as this user where the driver can.
            recreate: remove the session's sandbox first (a fresh one).
            check: raise :class:`berth.CommandFailed` when the command exits
                non-zero or times out, as ``subprocess.run(check=True)`` does.

        The output keeps its bytes exactly. Raises :class:`berth.Error` subclasses
        for what stops the call (:class:`berth.Unavailable`: no daemon;
        :class:`berth.Invalid`: a bad name or argument; ...). Cancelling the task
        (``asyncio.CancelledError``, e.g. from ``asyncio.wait_for``) cancels the
        command, waits (at most 15 s) until its process tree is gone, and then
        propagates.
        """
        out = _Collector(shell=False)
        async with self._stream(argv, None, timeout, env, cwd, stdin, max_output, user, recreate) as st:
            async for ev in st:
                out.add(ev)
        res = out.result(st.result)
        if check and not res.ok:
            raise errors.CommandFailed(res, list(argv), self.name)
        return res

    async def shell(
        self,
        command: str,
        *,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, Any]] = None,
        stdin: AsyncStdin = None,
        cwd: Optional[str] = None,
        max_output: Optional[int] = None,
        check: bool = False,
    ) -> ExecResult:
        """Run ``command`` in berth's shell mode: ``cd`` and ``export`` carry over to the
        session's next shell call (with bash, functions and aliases too); calls of one
        session run side by side, each from the state last recorded, the last to end
        recording the next call's (docs/agents.md).

        Output is bounded as :meth:`berth.Session.shell`'s: each stream is capped at
        the session's ``max_output`` (50 KiB unless the rule or ``max_output`` says
        otherwise); a stream that fits comes back exactly, a longer one as head,
        marker line and tail, the whole stream in the host file ``result.spill``
        names. ``result.cwd`` is where the next call starts. Timeout (seconds), env,
        stdin, ``check``, errors and cancellation as for :meth:`exec`; a timed-out
        or cancelled call records no state.
        """
        out = _Collector(shell=True)
        async with self._stream(None, command, timeout, env, cwd, stdin, max_output, None, False) as st:
            async for ev in st:
                out.add(ev)
        res = out.result(st.result)
        if check and not res.ok:
            raise errors.CommandFailed(res, command, self.name)
        return res

    def stream(
        self,
        argv: Optional[Sequence[str]] = None,
        *,
        shell: Optional[str] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, Any]] = None,
        cwd: Optional[str] = None,
        stdin: AsyncStdin = None,
        max_output: Optional[int] = None,
        user: Optional[str] = None,
    ) -> AsyncStream:
        """Run ``argv`` (or a shell-mode ``shell`` command) and give its output as it
        comes: an :class:`AsyncStream` of :class:`berth.Event` (``"started"``,
        ``"stdout"`` and ``"stderr"`` with ``data`` bytes, in the order the command
        wrote them, then ``"exit"`` with ``result``)::

            async with s.stream(["make"]) as st:
                async for ev in st:
                    ...

        Not a coroutine: the call starts at the first event. Nothing is capped unless
        ``max_output`` says so. Bad arguments are :class:`berth.Invalid` here; other
        errors come from the iteration. Leaving the stream early cancels the command.
        """
        return self._stream(argv, shell, timeout, env, cwd, stdin, max_output, user, False)

    # ---- lifecycle ----

    async def info(self) -> Dict[str, Any]:
        """``GET /v1/sessions/{name}``: the session's record (driver, sandbox, state,
        last use, drift) as a dict; :class:`berth.NotFound` when it has no sandbox."""
        return dict(await self.client._call("GET", self._path) or {})

    async def close(self) -> None:
        """Apply the rule's ``on_close`` (keep, stop or remove), as ``berth close``."""
        await self.client._call("POST", self._path + "/close", expect=(204,))

    async def stop(self) -> None:
        """Stop the session's sandbox, keeping its files (``berth stop``)."""
        await self.client._call("POST", self._path + "/stop", expect=(204,))

    async def remove(self) -> None:
        """Remove the sandbox and its files and forget the session (``berth rm``); idempotent."""
        await self.client._call("DELETE", self._path, expect=(204,))

    async def recreate(self) -> bool:
        """Remove the sandbox so that the next exec starts from the rule's current
        config; returns whether there was one to remove."""
        return bool((await self.client._call("POST", self._path + "/recreate") or {}).get("removed"))

    # ---- files ----

    async def write_file(self, path: str, data: Union[bytes, str], *, mode: int = 0o644) -> None:
        """Write ``data`` (at most 16 MiB; str as UTF-8) as the regular file ``path`` in
        the sandbox with ``mode``; its directory must exist (:class:`berth.NotFound`);
        more than 16 MiB is :class:`berth.TooLarge`."""
        if isinstance(data, str):
            data = data.encode()
        q = urllib.parse.urlencode({"path": path, "mode": "%04o" % mode})
        await self.client._call("PUT", self._path + "/files?" + q, raw=bytes(data), expect=(204,))

    async def read_file(self, path: str) -> bytes:
        """The regular file ``path``'s bytes (at most 16 MiB: larger is
        :class:`berth.TooLarge`); :class:`berth.NotFound` when it is missing. A
        symlink is not followed."""
        return await self.client._get_bytes(self._path + "/files?" + urllib.parse.urlencode({"path": path}))
