"""The client of ``berth serve``: :class:`Client`, :class:`Session`, :class:`Jobs`
and :class:`Stream` (docs/api.md is the API they speak; docs/python.md the guide)."""

import base64
import json
import math
import os
import urllib.parse
from typing import IO, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _tar, errors
from ._exec import ExecCall, Stdin
from ._transport import Endpoint, Pool, simple_request
from .results import DriverInfo, Event, ExecResult, Job, JobLogs, LogEvent, SessionInfo, Status, WarmPool

__all__ = ["Client", "Session", "Jobs", "Stream", "DEFAULT_MAX_OUTPUT"]

#: The default cap, in bytes per stream, of :meth:`Session.exec`'s output: what
#: passes it is dropped and counted (``ExecResult.truncated``). ``max_output=None``
#: lifts it; :meth:`Session.stream` has none.
DEFAULT_MAX_OUTPUT = 16 << 20

# Exact bytes of a shell-mode stream kept while it runs; a stream that fits the
# session's cap (and this) comes back exactly, a longer one as berth's capped text.
_SHELL_EXACT = 4 << 20

# Extra seconds a call with a timeout waits for its answer beyond the timeout (the
# tree's kill grace, a shell call's turn, a loaded machine).
_ANSWER_SLACK = 120.0


# The longest timeout taken, in seconds (about 31 years): a socket's timeout and a
# Go duration both end near 9.2e9 s, and a call waits _ANSWER_SLACK beyond a command's.
_MAX_TIMEOUT = 1e9


def _seconds(value: Any, what: str = "timeout", session: Optional[str] = None) -> Optional[float]:
    """value checked as a timeout in seconds: None (no bound), or an int or float
    (not a bool) that is finite, above 0 and at most _MAX_TIMEOUT; else Invalid,
    naming what, the value and the fix."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise errors.Invalid(
            "%s=%r (%s): want a number of seconds above 0 (an int or float, e.g. 30 or 1.5), or None for no bound"
            % (what, value, type(value).__name__),
            session=session,
        )
    if (isinstance(value, float) and not math.isfinite(value)) or not 0 < value <= _MAX_TIMEOUT:
        raise errors.Invalid(
            "%s=%r: want a number of seconds above 0 (e.g. 30 or 1.5, at most %g), or None for no bound" % (what, value, _MAX_TIMEOUT),
            session=session,
        )
    return value


def _duration(seconds: Optional[float], what: str = "timeout", session: Optional[str] = None) -> Optional[str]:
    """seconds (checked by _seconds) as a berth duration ("1500ms"); None for none."""
    seconds = _seconds(seconds, what, session)
    if seconds is None:
        return None
    return "%dms" % max(1, round(seconds * 1000))


def _env(env: Optional[Mapping[str, Any]]) -> Optional[Dict[str, str]]:
    if env is None:
        return None
    out = {}
    for k, v in env.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise errors.Invalid("env %r: a name must be a non-empty str without '=' or NUL" % (k,))
        v = str(v)
        if "\0" in v:
            raise errors.Invalid("env %r: the value holds a NUL character" % (k,))
        out[k] = v
    return out


# The rule of session names, as the daemon states it (config/names.go).
_SESSION_RULE = (
    'a session name is 1 to 128 characters: A-Z a-z 0-9 . _ - : @ / and printable non-ASCII characters '
    '(no spaces, control or format characters), with no empty, "." or ".." path component and no leading "/", '
    'e.g. "chat:1"'
)


def _quote(name: str) -> str:
    """A session name as one percent-encoded path segment (docs/api.md)."""
    if not isinstance(name, str) or name == "":
        why = "is empty" if name == "" else "is of type %s, not str" % type(name).__name__
        raise errors.Invalid("session name %r: %s; %s" % (name, why, _SESSION_RULE), session=str(name))
    q = urllib.parse.quote(name, safe=":@")
    # "." and ".." stay one segment (a path would be cleaned otherwise); the daemon
    # refuses them, naming them.
    return q.replace(".", "%2E") if q in (".", "..") else q


def _check_owner(name: str, owner: Optional[str]) -> None:
    """A session name checked as :meth:`Client.session` does; ``owner`` must be None."""
    _quote(name)
    if owner is not None:
        raise errors.Unsupported(
            "session %r: owner=%r: berth serve's API v1 has no per-session owner (the owner is the daemon's installation id); leave owner unset"
            % (name, owner),
            session=name,
        )


def _exec_request(
    session: str,
    argv: Optional[Sequence[str]],
    shell: Optional[str],
    timeout: Optional[float],
    env: Optional[Mapping[str, Any]],
    cwd: Optional[str],
    max_output: Optional[int],
    user: Optional[str],
    recreate: bool,
) -> Tuple[Dict[str, Any], Optional[float]]:
    """The ExecRequest (the streamed body's first line) of a plain exec (argv) or a
    shell-mode call (shell), checked; and how long to wait for its answer (None: no
    bound). Raises :class:`berth.Invalid` naming the bad argument."""
    req: Dict[str, Any] = {}
    if (argv is None) == (shell is None):
        raise errors.Invalid("give either argv (a plain exec, e.g. [\"make\", \"test\"]) or shell (a shell-mode command string), not both or neither", session=session)
    if argv is not None:
        if isinstance(argv, (str, bytes)) or not all(isinstance(a, str) for a in argv):
            raise errors.Invalid("argv %r: want a list of str, e.g. [\"sh\", \"-c\", \"echo hi\"] (or shell=\"...\")" % (argv,), session=session)
        if not argv:
            raise errors.Invalid("argv: empty; give the program and its arguments", session=session)
        req["argv"] = list(argv)
    else:
        if not isinstance(shell, str):
            raise errors.Invalid("shell command %r: want a str" % (shell,), session=session)
        req["command"] = shell
    t = _duration(timeout, session=session)
    if t:
        req["timeout"] = t
    e = _env(env)
    if e:
        req["env"] = e
    if cwd:
        req["cwd"] = str(cwd)
    if user:
        req["user"] = user
    if max_output is not None:
        if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 0:
            raise errors.Invalid("max_output %r: want a number of bytes, 0 or more, or None" % (max_output,), session=session)
        req["max_output"] = max_output
    if recreate:
        req["recreate"] = True
    read_timeout = None if timeout is None else timeout + _ANSWER_SLACK
    return req, read_timeout


def _event(raw: Dict[str, Any]) -> Event:
    """The :class:`berth.Event` of one event of a streamed exec's answer (``result``
    is the ``"exit"`` event)."""
    kind = raw.get("event", "")
    if kind in ("stdout", "stderr"):
        return Event(kind, base64.b64decode(raw.get("data") or ""), raw=raw)
    if kind == "result":
        return Event("exit", result=ExecResult(raw.get("result") or {}), raw=raw)
    return Event(kind, raw=raw)


class _Collector:
    """The output of an exec (every byte, the daemon capping at max_output) or of a
    shell-mode call (exact while a stream stays within _SHELL_EXACT; the result's
    capped text otherwise), gathered from a stream's events."""

    def __init__(self, shell: bool) -> None:
        self.shell = shell
        self.keep = {"stdout": bytearray(), "stderr": bytearray()}
        self.over = {"stdout": False, "stderr": False}

    def add(self, ev: Event) -> None:
        b = self.keep.get(ev.kind)
        if b is None:
            return
        if not self.shell:
            b += ev.data
        elif len(b) + len(ev.data) > _SHELL_EXACT:
            self.over[ev.kind] = True
        elif not self.over[ev.kind]:
            b += ev.data

    def result(self, final: Optional[ExecResult]) -> ExecResult:
        """The call's result: the exit event's, with the output."""
        assert final is not None
        raw = final.raw
        out, err = bytes(self.keep["stdout"]), bytes(self.keep["stderr"])
        if self.shell:
            if self.over["stdout"] or raw.get("stdout_truncated_bytes"):
                out = raw.get("stdout", "").encode()
            if self.over["stderr"] or raw.get("stderr_truncated_bytes"):
                err = raw.get("stderr", "").encode()
        return ExecResult(raw, out, err)


def _json_answer(where: str, method: str, path: str, status: int, answer: bytes, expect: Sequence[int]) -> Any:
    """A call's decoded JSON answer (None for an empty one); the berth error of an
    answer whose status is not in expect."""
    if status not in expect:
        raise errors.from_answer(status, answer)
    if not answer.strip():
        return None
    try:
        return json.loads(answer)
    except ValueError:
        raise errors.Internal("berth serve at %s answered %s %s with no JSON: %r" % (where, method, path, answer[:200])) from None


class Client:
    """A client of a running ``berth serve``; thread-safe (share one among threads).

    Args:
        host: ``unix:///PATH``, ``https://HOST:PORT`` or ``http://127.0.0.1:PORT``.
            Default: ``$BERTH_HOST``, else the socket ``STATE/berth.sock`` of the
            state dir (``state_dir``, else ``$BERTH_STATE_DIR``, else
            ``$XDG_STATE_HOME/berth``, else ``~/.local/state/berth``), as berth's
            CLI finds its daemon.
        token_file: a TCP daemon's bearer token file (``--token-file`` of berth
            serve; owner-only); default ``$BERTH_TOKEN_FILE``. ``$BERTH_TLS_CA``
            names the CA of an https daemon (default: the system's roots).
        state_dir: the state dir whose socket to use when no host is given.
        timeout: seconds to wait for the daemon to connect and answer the calls
            that are not a command (status, sessions, files, jobs...); None: no
            bound. Commands are bound by their own ``timeout``.

    Raises :class:`berth.Invalid` for a bad host, token file or ``timeout`` (a
    ``timeout`` is None or an int or float of seconds above 0). Nothing is
    connected until the first call; a daemon that does not answer then is
    :class:`berth.Unavailable`, naming the socket or address and how to start it.
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
        self._pool = Pool(self._ep)
        self.timeout = timeout

    @property
    def where(self) -> str:
        """The daemon's address: ``unix:///PATH`` or ``http(s)://HOST:PORT``."""
        return self._ep.where

    def close(self) -> None:
        """Close the kept connections (calls after this open new ones)."""
        self._pool.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "berth.Client(%r)" % self._ep.where

    # ---- plumbing ----

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
        expect: Sequence[int] = (200,),
        timeout: Optional[float] = -1.0,
    ) -> Any:
        """Make a call; returns the decoded JSON answer (None for an empty one)."""
        h = dict(headers or {})
        data = raw
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            h["Content-Type"] = "application/json"
        t = self.timeout if timeout == -1.0 else timeout
        status, _, answer = simple_request(self._pool, method, path, data, h, t)
        return _json_answer(self.where, method, path, status, answer, expect)

    def _get_bytes(self, path: str) -> bytes:
        status, _, answer = simple_request(self._pool, "GET", path, None, None, self.timeout)
        if status != 200:
            raise errors.from_answer(status, answer)
        return answer

    # ---- the API ----

    def session(self, name: str, *, owner: Optional[str] = None) -> "Session":
        """The session ``name`` (e.g. ``"chat:1"``); nothing is created until a call.

        The name is checked by the daemon at the first call (a name that breaks
        berth's rules is :class:`berth.Invalid`, naming it); an empty one at once.

        ``owner`` is reserved: berth's API v1 has no per-session owner (berth's
        owner is the installation's id, the daemon's own), so any value but None
        is :class:`berth.Unsupported`.
        """
        _check_owner(name, owner)
        return Session(self, name)

    def sessions(self) -> List[SessionInfo]:
        """Every recorded session (``GET /v1/sessions``), sorted by name: a
        :class:`berth.SessionInfo` each (``.session``, ``.driver``, ``.sandbox``,
        ``.scope``, ``.state``, ``.created``, ``.last_used``, ``.drift``, ...; it also
        reads as the dict ``berth sessions --json`` prints: ``info["state"]``)."""
        return [SessionInfo(r) for r in self._call("GET", "/v1/sessions") or []]

    def pools(self) -> List[WarmPool]:
        """Every rule's warm pool (``GET /v1/pools``), in rule order: a
        :class:`berth.WarmPool` each, as ``berth sessions --pool --json`` prints
        them; ``[]`` when no rule has a pool. The daemon reads them from its store
        without asking a driver, so polling it (e.g. until ``pool.full``) is cheap."""
        return [WarmPool(p) for p in self._call("GET", "/v1/pools") or []]

    def status(self) -> Status:
        """The daemon's identity (``GET /v1/status``), asking no driver: a
        :class:`berth.Status` (``.api``, ``.version``, ``.pid``, ``.state_dir``,
        ``.config``, ``.clock_offset_ms``, ...; also ``status["pid"]``)."""
        return Status(self._call("GET", "/v1/status") or {})

    def health(self) -> Dict[str, Any]:
        """``GET /v1/health``: ``status`` (``ok``, ``degraded``), the store, and each
        driver the config's rules name with its health. A daemon whose store cannot
        be used answers 503 (:class:`berth.Unavailable`)."""
        return dict(self._call("GET", "/v1/health") or {})

    def drivers(self) -> List[DriverInfo]:
        """``GET /v1/drivers``: every driver the daemon knows, a
        :class:`berth.DriverInfo` each (``.name``, ``.health``, ``.capabilities``, ...;
        also ``driver["name"]``)."""
        return [DriverInfo(d) for d in self._call("GET", "/v1/drivers") or []]

    def explain(self, name: str) -> Dict[str, Any]:
        """``GET /v1/config/explain``: how the config places session ``name``."""
        return dict(self._call("GET", "/v1/config/explain?session=" + urllib.parse.quote(name, safe="")) or {})

    def prune(self, *, dry_run: bool = False) -> Dict[str, Any]:
        """``POST /v1/prune``: one retention round now; the report of ``berth prune --json``."""
        return dict(self._call("POST", "/v1/prune", {"dry_run": True} if dry_run else {}) or {})


class Stream:
    """The events of a streamed exec (:meth:`Session.stream`), in the daemon's order.

    Iterate it for :class:`berth.Event` objects; the last is ``"exit"`` with the
    :class:`berth.ExecResult`, also kept in :attr:`result`. Closing it before that
    (``close()``, leaving a ``with`` block, breaking out of the loop, or an
    exception such as KeyboardInterrupt in the loop) cancels the command: its
    process tree is killed, and close returns once the daemon says it is gone
    (bounded: the connection is dropped after 15 s, which kills it too).
    """

    def __init__(self, call: ExecCall, shell: bool) -> None:
        self._call = call
        self._it = call.events()
        self._shell = shell
        self.result: Optional[ExecResult] = None

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> Event:
        ev = _event(next(self._it))
        if ev.kind == "exit":
            self.result = ev.result
        return ev

    def close(self) -> None:
        """Stop reading; a command still running is cancelled (its tree killed)."""
        self._it.close()

    def cancel(self) -> bool:
        """Ask the daemon to cancel the command, from any thread, without stopping
        the iteration: the command's process tree is killed and the thread reading
        the stream then gets the ``"exit"`` event with ``result.canceled`` set (and
        the output written before). Returns False when the request body is already
        closed (the command has ended, or its result arrived) and nothing was sent.
        """
        return self._call._send_cancel()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._it.close()
        except Exception:
            pass


class Session:
    """One berth session: its commands, jobs and files. Get one with
    :meth:`Client.session`; it is as thread-safe as its client."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name
        self._path = "/v1/sessions/" + _quote(name)
        self.jobs = Jobs(self)

    def __repr__(self) -> str:
        return "berth.Session(%r)" % self.name

    # ---- commands ----

    def _call(self, argv: Optional[Sequence[str]], shell: Optional[str], timeout: Optional[float], env: Optional[Mapping[str, Any]],
              cwd: Optional[str], stdin: Stdin, max_output: Optional[int], user: Optional[str], recreate: bool) -> Stream:
        req, read_timeout = _exec_request(self.name, argv, shell, timeout, env, cwd, max_output, user, recreate)
        if stdin is not None and not isinstance(stdin, (bytes, bytearray, memoryview, str)) and not hasattr(stdin, "read"):
            raise errors.Invalid("stdin %r: want bytes, str or a binary file object" % (type(stdin).__name__,), session=self.name)
        return Stream(ExecCall(self.client._pool, self._path + "/exec", req, stdin, read_timeout), shell is not None)

    def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, Any]] = None,
        cwd: Optional[str] = None,
        stdin: Stdin = None,
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
            stdin: bytes, str (sent as UTF-8) or a binary file object, of any
                size; None: stdin is at EOF at once.
            max_output: bytes kept per stream (the rest dropped and counted:
                ``truncated``); default 16 MiB; None for no cap.
            user: run as this user where the driver can.
            recreate: remove the session's sandbox first (a fresh one).
            check: raise :class:`berth.CommandFailed` (a
                ``subprocess.CalledProcessError``) when the command exits non-zero
                or times out, as ``subprocess.run(check=True)`` does.

        The output keeps its bytes exactly. A command that fails is not an error
        (see ``exit_code``) unless ``check`` is set. Raises :class:`berth.Error` subclasses for what stops
        the call (no daemon, a bad name or argument, a driver that is down). A
        KeyboardInterrupt (or any exception) in the calling thread cancels the
        command, waits until its process tree is gone, and propagates.
        """
        out = _Collector(shell=False)
        st = self._call(argv, None, timeout, env, cwd, stdin, max_output, user, recreate)
        try:
            for ev in st:
                out.add(ev)
        finally:
            st.close()
        res = out.result(st.result)
        if check and not res.ok:
            raise errors.CommandFailed(res, list(argv), self.name)
        return res

    def shell(
        self,
        command: str,
        *,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, Any]] = None,
        stdin: Stdin = None,
        cwd: Optional[str] = None,
        max_output: Optional[int] = None,
        check: bool = False,
    ) -> ExecResult:
        """Run ``command`` in berth's shell mode: ``cd`` and ``export`` carry over to the
        session's next shell call (with bash, functions and aliases too;
        docs/agents.md). Calls of one session run side by side, each from the state
        last recorded; the one that ends last records the next call's.

        Output is bounded: each stream is capped at the session's ``max_output``
        (50 KiB unless the rule or ``max_output`` says otherwise); a stream that fits
        comes back exactly, a longer one as head, marker line and tail, and the
        whole stream is in a host file named by ``result.spill``. ``result.cwd`` is
        where the next call starts. Timeout, env, stdin, ``check`` and interrupts
        as for :meth:`exec`; a timed-out or cancelled call records no state.
        """
        out = _Collector(shell=True)
        st = self._call(None, command, timeout, env, cwd, stdin, max_output, None, False)
        try:
            for ev in st:
                out.add(ev)
        finally:
            st.close()
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
        stdin: Stdin = None,
        max_output: Optional[int] = None,
        user: Optional[str] = None,
    ) -> Stream:
        """Run ``argv`` (or a shell-mode ``shell`` command) and yield its output as it
        comes: a :class:`Stream` of :class:`berth.Event` (``"started"``, ``"stdout"``
        and ``"stderr"`` with ``data`` bytes, in the order the command wrote them,
        then ``"exit"`` with ``result``). Nothing is capped unless ``max_output``
        says so (shell mode: the events carry the whole output, the result the
        capped text). Closing the stream early cancels the command.

        Errors before the command runs (no daemon, a bad name) are raised by the
        first ``next()``.
        """
        return self._call(argv, shell, timeout, env, cwd, stdin, max_output, user, False)

    # ---- lifecycle ----

    def info(self) -> Dict[str, Any]:
        """``GET /v1/sessions/{name}``: the session's record (driver, sandbox, state,
        last use, drift); :class:`berth.NotFound` when it has no sandbox."""
        return dict(self.client._call("GET", self._path) or {})

    def close(self) -> None:
        """Apply the rule's ``on_close`` (keep, stop or remove), as ``berth close``."""
        self.client._call("POST", self._path + "/close", expect=(204,))

    def stop(self) -> None:
        """Stop the session's sandbox, keeping its files (``berth stop``)."""
        self.client._call("POST", self._path + "/stop", expect=(204,))

    def remove(self) -> None:
        """Remove the sandbox and its files and forget the session (``berth rm``); idempotent."""
        self.client._call("DELETE", self._path, expect=(204,))

    def recreate(self) -> bool:
        """Remove the sandbox so that the next exec starts from the rule's current
        config; returns whether there was one to remove."""
        return bool((self.client._call("POST", self._path + "/recreate") or {}).get("removed"))

    # ---- files ----

    def write_file(self, path: str, data: Union[bytes, str], *, mode: int = 0o644) -> None:
        """Write ``data`` (at most 16 MiB; str as UTF-8) as the regular file ``path`` in
        the sandbox with ``mode``; its directory must exist (:class:`berth.NotFound`)."""
        if isinstance(data, str):
            data = data.encode()
        q = urllib.parse.urlencode({"path": path, "mode": "%04o" % mode})
        self.client._call("PUT", self._path + "/files?" + q, raw=bytes(data), expect=(204,))

    def read_file(self, path: str) -> bytes:
        """The regular file ``path``'s bytes (at most 16 MiB: larger is
        :class:`berth.TooLarge`; use :meth:`download`). A symlink is not followed."""
        return self.client._get_bytes(self._path + "/files?" + urllib.parse.urlencode({"path": path}))

    def upload(self, local_path: Union[str, "os.PathLike[str]"], remote_path: str) -> Dict[str, int]:
        """Copy the local file or directory ``local_path`` to ``remote_path`` in the
        sandbox (the path the copy gets, like ``cp -r SRC DEST`` with a new DEST:
        its directory must exist). Symlinks are copied as symlinks, modes and
        mtimes kept; devices, FIFOs and sockets are refused (:class:`berth.Invalid`),
        nothing is written then. Streams as a tar; returns ``{"entries", "bytes"}``."""
        return _tar.upload(self, os.fspath(local_path), remote_path)

    def download(self, remote_path: str, local_path: Union[str, "os.PathLike[str]"], *, max_size: Optional[int] = 1 << 30) -> None:
        """Copy the sandbox's file or directory ``remote_path`` to ``local_path`` (the
        path the copy gets; its directory must exist). The tar stream comes from the
        sandbox and is hostile input: only regular files, directories and symlinks
        that stay inside the copy are written, with the caller's owner and no
        setuid/setgid; it is staged beside ``local_path`` and put in place only
        when whole, so nothing is written on error. ``max_size`` bounds the bytes
        of files (None: no bound)."""
        _tar.download(self, remote_path, os.fspath(local_path), max_size)


class Jobs:
    """A session's background jobs (``session.jobs``): processes berth's agent keeps
    running beyond the call, with their output (the newest 1 MiB)."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def start(
        self,
        argv: Optional[Sequence[str]] = None,
        *,
        shell: Optional[str] = None,
        env: Optional[Mapping[str, Any]] = None,
        cwd: Optional[str] = None,
    ) -> Job:
        """Start a job: ``argv``, or ``shell`` run as ``/bin/sh -c COMMAND`` (not shell
        mode: no session state is read or kept). Creates the sandbox when needed."""
        if (argv is None) == (shell is None):
            raise errors.Invalid("give either argv or shell, not both or neither", session=self._s.name)
        body: Dict[str, Any] = {"argv": list(argv)} if argv is not None else {"command": shell}
        e = _env(env)
        if e:
            body["env"] = e
        if cwd:
            body["cwd"] = cwd
        return Job(self._s.client._call("POST", self._s._path + "/jobs", body, expect=(201,)))

    def list(self) -> List[Job]:
        """The session's jobs, oldest first (:class:`berth.NotFound` without a running sandbox)."""
        return [Job(j) for j in self._s.client._call("GET", self._s._path + "/jobs") or []]

    def _id(self, job: Union[str, Job]) -> str:
        jid = job.id if isinstance(job, Job) else job
        if not isinstance(jid, str) or not jid:
            raise errors.Invalid("job id %r: want the id of a Job" % (jid,), session=self._s.name)
        return urllib.parse.quote(jid, safe="")

    def kill(self, job: Union[str, Job]) -> None:
        """End the job's process tree (TERM, then KILL); returns once it is gone."""
        self._s.client._call("POST", "%s/jobs/%s/kill" % (self._s._path, self._id(job)), expect=(204,))

    def stream_logs(self, job: Union[str, Job], offset: int = 0, follow: bool = False) -> Iterator[LogEvent]:
        """The job's log from byte ``offset`` as :class:`berth.LogEvent` objects, each
        as it comes; with ``follow`` until the job has ended and its output is
        drained. The last event is ``"end"``."""
        q = urllib.parse.urlencode({"offset": str(int(offset)), "follow": "true" if follow else "false"})
        path = "%s/jobs/%s/logs?%s" % (self._s._path, self._id(job), q)
        pool = self._s.client._pool
        c = pool.get(None if follow else self._s.client.timeout)
        ok = False
        try:
            h = pool.ep.headers()
            c.http.request("GET", path, headers=h)
            resp = c.http.getresponse()
            if resp.status != 200:
                raise errors.from_answer(resp.status, resp.read(1 << 20))
            while True:
                line = resp.readline(64 << 20)
                if not line:
                    raise pool.ep.gone(ConnectionError("the log ended without its end event"))
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev.get("event") == "error":
                    raise errors.from_info(ev.get("error") or {}, 200)
                yield LogEvent(ev, base64.b64decode(ev.get("data") or ""))
                if ev.get("event") == "end":
                    ok = not resp.read() and not resp.will_close
                    return
        except (ConnectionError, OSError) as e:
            if isinstance(e, errors.Error):
                raise
            raise pool.ep.gone(e) from None
        finally:
            if ok:
                pool.put(c)
            else:
                c.close()

    def logs(self, job: Union[str, Job], offset: int = 0, follow: bool = False) -> JobLogs:
        """The job's output from byte ``offset`` (default 0: the oldest kept byte) as
        one :class:`berth.JobLogs`; with ``follow``, once the job has ended. Pass
        its ``offset`` as the next call's to read on."""
        data = bytearray()
        dropped = 0
        end: Optional[LogEvent] = None
        for ev in self.stream_logs(job, offset, follow):
            if ev.kind == "output":
                data += ev.data
            elif ev.kind == "gap":
                dropped += ev.dropped
            elif ev.kind == "end":
                end = ev
        assert end is not None
        return JobLogs(bytes(data), end.offset, dropped, end.ended, end.exit_code, end.signal)
