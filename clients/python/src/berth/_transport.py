"""How the client reaches ``berth serve``: the endpoint (unix socket, or TCP with a
bearer token and optionally TLS, found as berth's CLI finds it) and a thread-safe
pool of kept-alive HTTP/1.1 connections (``http.client``).
"""

import http.client
import os
import select
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import errors

# The longest path a unix socket address holds (sun_path less its NUL), as berth
# serve's maxSocketPath: a longer one is dialled through its directory's descriptor.
MAX_SOCKET_PATH = 107

# The smallest token berth serve accepts (its minTokenBytes).
MIN_TOKEN_BYTES = 16

# Kept connections idle longer than this are closed rather than reused: berth
# serve closes idle keep-alive connections after 2 minutes, and a connection the
# server is closing just then could take a request that it never reads.
MAX_IDLE_SECONDS = 60.0

# How many idle connections the pool keeps.
MAX_IDLE = 16

START_HINT = "start it with `berth serve` (or `systemctl --user start berth`)"


def default_state_dir() -> str:
    """berth's default state dir, as its CLI resolves it without flags or config.

    ``$BERTH_STATE_DIR`` (with ``~/`` expanded), else ``$XDG_STATE_HOME/berth`` when
    that is absolute, else ``~/.local/state/berth`` (config.DefaultStateDir).
    A config file's ``state_dir`` is not read (this package parses no HCL): set
    ``BERTH_STATE_DIR`` or pass ``state_dir`` when your config moves it.
    """
    d = os.environ.get("BERTH_STATE_DIR", "")
    if d:
        return os.path.abspath(_expand_home(d))
    x = os.environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(x):
        return os.path.join(x, "berth")
    return os.path.join(os.path.expanduser("~"), ".local", "state", "berth")


def _expand_home(p: str) -> str:
    if p == "~" or p.startswith("~/"):
        return os.path.expanduser(p)
    return p


def read_token(path: str, what: str) -> str:
    """Read a bearer token file as berth does: owner-only, one line, >= 16 bytes.

    Raises :class:`berth.Invalid` naming ``what`` (the variable or argument the
    path came from) and the fix.
    """
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            raw = f.read(64 << 10)
    except OSError as e:
        raise errors.Invalid("%s %s: %s" % (what, path, e.strerror or e)) from None
    if st.st_mode & 0o077:
        raise errors.Invalid(
            "%s %s: mode %04o lets others read the token; chmod 600 %s" % (what, path, st.st_mode & 0o777, path)
        )
    tok = raw.decode("utf-8", "replace").strip()
    if len(tok) < MIN_TOKEN_BYTES:
        raise errors.Invalid("%s %s: the token is %d bytes; use at least %d" % (what, path, len(tok), MIN_TOKEN_BYTES))
    if any(c in tok for c in " \t\r\n"):
        raise errors.Invalid("%s %s: the token holds white space; put one token on one line" % (what, path))
    return tok


class _Corked:
    """A connection whose sends can be held and joined (``cork`` set to a list):
    a streamed exec sends its head and first body chunk as one write."""

    cork: Optional[List[bytes]] = None

    def send(self, data) -> None:  # type: ignore[no-untyped-def]
        if self.cork is not None and isinstance(data, (bytes, bytearray)):
            self.cork.append(bytes(data))
            return
        super().send(data)  # type: ignore[misc]


class _HTTPConnection(_Corked, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Corked, http.client.HTTPSConnection):
    pass


class _UnixConnection(_Corked, http.client.HTTPConnection):
    """An HTTP connection over a unix socket; a path too long for a socket address is
    connected through ``/proc/self/fd/N/NAME`` of its directory opened ``O_PATH``, as
    berth serve binds it (docs/api.md, "The socket")."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("berth", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            if len(self.unix_path.encode()) <= MAX_SOCKET_PATH:
                s.connect(self.unix_path)
            else:
                d = os.open(os.path.dirname(self.unix_path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    s.connect("/proc/self/fd/%d/%s" % (d, os.path.basename(self.unix_path)))
                finally:
                    os.close(d)
        except BaseException:
            s.close()
            raise
        self.sock = s


class Endpoint:
    """Where the daemon is and how to talk to it.

    ``where`` is what errors name: ``unix:///PATH`` or ``http(s)://HOST:PORT``.
    """

    def __init__(
        self,
        host: Optional[str],
        token_file: Optional[str],
        state_dir: Optional[str],
        timeout: Optional[float],
    ) -> None:
        self.timeout = timeout
        self.token: Optional[str] = None
        self.tls: Optional[ssl.SSLContext] = None
        self.unix_path: Optional[str] = None
        self.tcp: Optional[Tuple[str, int]] = None
        from_env = host is None
        if host is None:
            host = os.environ.get("BERTH_HOST") or None
        if host is None:
            sd = os.path.abspath(_expand_home(state_dir)) if state_dir else default_state_dir()
            self.unix_path = os.path.join(sd, "berth.sock")
            self.where = "unix://" + self.unix_path
            self.origin = "state dir %s" % sd
            return
        what = "BERTH_HOST" if from_env else "host"
        u = urllib.parse.urlsplit(host)
        fix = "use unix:///PATH, https://HOST:PORT or http://127.0.0.1:PORT"
        if u.scheme == "unix":
            if u.netloc or not os.path.isabs(u.path):
                raise errors.Invalid("%s=%r: a unix socket needs an absolute path: unix:///PATH" % (what, host))
            self.unix_path = os.path.normpath(u.path)
            self.where = "unix://" + self.unix_path
            self.origin = what
            return
        if u.scheme not in ("http", "https"):
            raise errors.Invalid("%s=%r: unknown scheme; %s" % (what, host, fix))
        if not u.netloc or u.path not in ("", "/") or u.query or u.fragment:
            raise errors.Invalid("%s=%r: want %s://HOST:PORT, nothing after the port" % (what, host, u.scheme))
        try:
            port = u.port
        except ValueError:
            port = None
        if port is None or u.hostname is None:
            raise errors.Invalid("%s=%r: want %s://HOST:PORT with a port number" % (what, host, u.scheme))
        if u.scheme == "http" and not _loopback(u.hostname):
            raise errors.Invalid(
                "%s=%r: plain http only to a loopback IP (127.0.0.1, ::1): the token would cross the network in clear; use https://"
                % (what, host)
            )
        self.tcp = (u.hostname, port)
        self.where = "%s://%s" % (u.scheme, u.netloc)
        self.origin = what
        tf = token_file if token_file is not None else os.environ.get("BERTH_TOKEN_FILE", "")
        if not tf:
            raise errors.Invalid(
                "%s=%r: a TCP daemon needs its bearer token: pass token_file or set BERTH_TOKEN_FILE to the file that berth serve's --token-file reads"
                % (what, host)
            )
        self.token = read_token(tf, "token_file" if token_file is not None else "BERTH_TOKEN_FILE")
        if u.scheme == "https":
            ctx = ssl.create_default_context()
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ca = os.environ.get("BERTH_TLS_CA", "")
            if ca:
                try:
                    ctx.load_verify_locations(cafile=ca)
                except (OSError, ssl.SSLError) as e:
                    raise errors.Invalid("BERTH_TLS_CA %s: %s" % (ca, e)) from None
            self.tls = ctx

    def connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        """A new, unconnected connection."""
        if self.unix_path is not None:
            return _UnixConnection(self.unix_path, timeout)
        assert self.tcp is not None
        if self.tls is not None:
            return _HTTPSConnection(self.tcp[0], self.tcp[1], timeout=timeout, context=self.tls)
        return _HTTPConnection(self.tcp[0], self.tcp[1], timeout=timeout)

    def not_running(self, err: BaseException) -> errors.Unavailable:
        """The error for a daemon that cannot be reached (``err``: the connect's)."""
        why = getattr(err, "strerror", None) or str(err) or type(err).__name__
        if self.unix_path is not None:
            msg = "no berth serve answers on %s (%s; from %s): %s, or point BERTH_HOST at a running one" % (
                self.where,
                why,
                self.origin,
                START_HINT,
            )
        else:
            msg = "no berth serve answers at %s (%s; from %s): %s with --listen tcp://%s:%d --token-file FILE" % (
                self.where,
                why,
                self.origin,
                START_HINT,
                self.tcp[0] if self.tcp else "HOST",
                self.tcp[1] if self.tcp else 0,
            )
        return errors.Unavailable(msg)

    def gone(self, err: BaseException) -> errors.Unavailable:
        """The error for a daemon that went away during a call."""
        why = str(err) or type(err).__name__
        return errors.Unavailable(
            "berth serve at %s went away during the call (%s: %s); it may have stopped or restarted: make the call again"
            % (self.where, type(err).__name__, why)
        )

    def headers(self) -> Dict[str, str]:
        h = {"Host": "berth" if self.unix_path is not None else self.where.split("://", 1)[1]}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        return h


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Errors that mean the connection broke (the daemon stopped, restarted, or closed it).
CONNECTION_ERRORS = (
    http.client.RemoteDisconnected,
    http.client.IncompleteRead,
    http.client.BadStatusLine,
    ConnectionError,
    BrokenPipeError,
    ssl.SSLEOFError,
)


# How long the pool waits for the rest of an answer whose end a call left to it.
PENDING_END_WAIT = 5.0


class Conn:
    """One connection of the pool, with when it was last returned.

    ``pending`` is an answer whose result the call has read but whose end (the last
    chunk, which a streamed exec's daemon sends once the request body has ended)
    is still to come: the pool reads it before it hands the connection out again,
    so the call that made it returns one round trip sooner.
    """

    __slots__ = ("http", "idle_since", "reused", "pending")

    def __init__(self, http_conn: http.client.HTTPConnection) -> None:
        self.http = http_conn
        self.idle_since = 0.0
        self.reused = False
        self.pending: Optional[http.client.HTTPResponse] = None

    def finish_pending(self) -> bool:
        """Read the pending answer to its end; False when the connection cannot be
        used again (more than the end came, it broke, or the daemon closes it)."""
        resp, self.pending = self.pending, None
        if resp is None:
            return True
        try:
            if self.sock is not None:
                self.sock.settimeout(PENDING_END_WAIT)
            if resp.read(1 << 16):
                return False
        except (OSError, http.client.HTTPException):
            return False
        return not resp.will_close

    @property
    def sock(self) -> Optional[socket.socket]:
        return self.http.sock

    def close(self) -> None:
        s = self.http.sock
        if s is not None:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.http.close()


class Pool:
    """A thread-safe pool of kept-alive connections to one endpoint."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self._idle: List[Conn] = []
        self._lock = threading.Lock()

    def get(self, timeout: Optional[float]) -> Conn:
        """A connected connection: a kept one that is still good, or a new one.

        Raises :class:`berth.Unavailable` when no daemon answers, with the socket or
        address and how to start it.
        """
        now = time.monotonic()
        while True:
            with self._lock:
                c = self._idle.pop() if self._idle else None
            if c is None:
                break
            if now - c.idle_since > MAX_IDLE_SECONDS or not c.finish_pending() or not _alive(c):
                c.close()
                continue
            c.reused = True
            c.http.timeout = timeout
            if c.sock is not None:
                c.sock.settimeout(timeout)
            return c
        hc = self.ep.connection(timeout if timeout is not None else self.ep.timeout)
        try:
            hc.connect()
        except ssl.SSLError as e:
            hc.close()
            raise errors.Unavailable(
                "TLS with berth serve at %s failed: %s (set BERTH_TLS_CA to the PEM file of its CA)" % (self.ep.where, e)
            ) from None
        except socket.timeout as e:
            hc.close()
            raise errors.Timeout("connecting to berth serve at %s: no answer within %ss" % (self.ep.where, timeout)) from e
        except OSError as e:
            hc.close()
            raise self.ep.not_running(e) from None
        hc.timeout = timeout
        if hc.sock is not None:
            hc.sock.settimeout(timeout)
            if hc.sock.family in (socket.AF_INET, socket.AF_INET6):
                hc.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return Conn(hc)

    def put(self, c: Conn) -> None:
        """Return a connection whose last answer was read to its end, or whose end
        is left to the pool (``c.pending``)."""
        c.idle_since = time.monotonic()
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(c)
                return
        c.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()


def _alive(c: Conn) -> bool:
    """Whether an idle kept connection is still open: a peer that closed it (a
    daemon that stopped, restarted, or dropped it as idle) makes it readable."""
    s = c.sock
    if s is None:
        return False
    try:
        r, _, _ = select.select([s], [], [], 0)
    except (OSError, ValueError):
        return False
    return not r


Body = Union[None, bytes, Iterable[bytes]]


def simple_request(
    pool: Pool,
    method: str,
    path: str,
    body: Body = None,
    headers: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
) -> Tuple[int, http.client.HTTPMessage, bytes]:
    """Make a request with a bytes body, an iterable of bytes (sent chunked), or
    none, and read the whole answer.

    A kept connection that turns out broken before any answer is replaced once
    for methods that are safe to repeat (GET, PUT, DELETE) with a body that can be
    sent again (bytes); other errors of the connection are
    :class:`berth.Unavailable`. An exception from the iterable propagates (the
    connection is dropped, so the daemon never sees the body end).
    """
    idempotent = method in ("GET", "HEAD", "PUT", "DELETE") and (body is None or isinstance(body, bytes))
    for attempt in (0, 1):
        c = pool.get(timeout)
        try:
            h = pool.ep.headers()
            if headers:
                h.update(headers)
            chunked = body is not None and not isinstance(body, bytes)
            if isinstance(body, bytes):
                h.setdefault("Content-Length", str(len(body)))
            c.http.request(method, path, body=body, headers=h, encode_chunked=chunked)
            resp = c.http.getresponse()
            data = resp.read()
        except errors.Error:
            # From the body's iterable: berth's errors subclass TimeoutError and
            # ConnectionError, which the clauses below would take for the socket's.
            c.close()
            raise
        except socket.timeout as e:
            c.close()
            raise errors.Timeout("berth serve at %s did not answer %s %s within %ss" % (pool.ep.where, method, path, timeout)) from e
        except CONNECTION_ERRORS as e:
            c.close()
            if attempt == 0 and c.reused and idempotent:
                continue
            raise pool.ep.gone(e) from None
        except BaseException:
            c.close()
            raise
        if resp.will_close:
            c.close()
        else:
            pool.put(c)
        return resp.status, resp.headers, data
    raise AssertionError("unreachable")
