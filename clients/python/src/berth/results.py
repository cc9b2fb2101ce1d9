"""The values the client returns: exec results, stream events, sessions, status,
drivers, jobs and job logs."""

import dataclasses
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional

__all__ = [
    "Output",
    "ExecResult",
    "Event",
    "SessionInfo",
    "Status",
    "DriverInfo",
    "Job",
    "JobLogs",
    "LogEvent",
    "WarmPool",
    "PoolMember",
]

class _Answer(Mapping):  # type: ignore[type-arg]
    """A typed view of one JSON object of the API that still reads as that object.

    Subclasses are dataclasses whose fields are the object's keys (attributes:
    ``info.state``); the object itself stays in ``raw`` and the value answers as the
    dict it was (``info["state"]``, ``info.get("error")``, ``dict(info)``), so code
    written against the SDK's dicts keeps working, keys a newer daemon adds
    included.
    """

    raw: Dict[str, Any]

    def __init__(self, raw: Optional[Dict[str, Any]] = None, **fields: Any) -> None:
        """From the API's object ``raw`` (``Cls(raw)``), or from keywords named as its
        fields (a keyword wins over ``raw``'s key); absent or null keys take the
        field's default."""
        src = dict(raw) if isinstance(raw, dict) else {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name == "raw":
                continue
            if f.name in fields:
                v = fields[f.name]
            elif src.get(f.name) is not None:
                v = src[f.name]
            elif f.default_factory is not dataclasses.MISSING:
                v = f.default_factory()
            else:
                v = f.default
            setattr(self, f.name, v)
        self.raw = src

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


@dataclasses.dataclass(init=False, eq=False)
class SessionInfo(_Answer):
    """One recorded session (``GET /v1/sessions``, ``berth sessions --json``).

    ``state`` is ``created``, ``running`` or ``stopped`` as the driver reports it,
    ``removed`` when retention removed the sandbox (``removed_reason`` says why),
    ``missing`` when the driver no longer has it, ``unknown`` when the driver could
    not be asked (``error``). ``created`` and ``last_used`` are RFC 3339 strings (UTC);
    ``drift`` says the sandbox no longer matches its rule (``drift_reason``);
    ``pooled`` that it was claimed from a warm pool.
    """

    raw: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    session: str = ""
    driver: str = ""
    sandbox: str = ""
    scope: str = ""
    state: str = ""
    created: str = ""
    last_used: str = ""
    drift: bool = False
    drift_reason: str = ""
    pooled: bool = False
    error: str = ""
    removed_reason: str = ""


@dataclasses.dataclass(init=False, eq=False)
class Status(_Answer):
    """The daemon's identity (``GET /v1/status``): ``api`` (``"v1"``), berth's
    ``version``, the daemon's ``pid``, its ``state_dir`` and ``config`` file (``""``
    for the built-in default), ``clock_offset_ms``, ``config_sha256`` and
    ``prune_interval_ms`` (0 when it does not prune)."""

    raw: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    api: str = ""
    version: str = ""
    pid: int = 0
    state_dir: str = ""
    config: str = ""
    clock_offset_ms: int = 0
    config_sha256: str = ""
    prune_interval_ms: int = 0


@dataclasses.dataclass(init=False, eq=False)
class DriverInfo(_Answer):
    """One driver the daemon knows (``GET /v1/drivers``, ``berth drivers --json``):
    ``name``, ``version``, ``protocol`` and ``protocol_versions`` (the driver
    protocol), ``served`` (``"plugin"`` or ``"in-process"``), ``health`` (``"ok"`` or
    why it could not be started or asked), ``capabilities`` (a dict, as
    docs/driver-authoring.md lists them) and ``path`` (its plugin executable)."""

    raw: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    name: str = ""
    version: str = ""
    protocol: int = 0
    protocol_versions: List[int] = dataclasses.field(default_factory=list)
    served: str = ""
    health: str = ""
    capabilities: Dict[str, Any] = dataclasses.field(default_factory=dict)
    path: str = ""


class Output(bytes):
    """A command's output: ``bytes`` exactly as the command wrote them.

    It is a ``bytes`` in every way (compare, slice, write it to a binary file);
    ``str()`` of it, and so ``print()``, gives the text (UTF-8, invalid bytes
    replaced) rather than ``b'...'``.
    """

    def __str__(self) -> str:
        return self.decode("utf-8", "replace")

    @property
    def text(self) -> str:
        """The output as text: UTF-8, invalid bytes replaced by U+FFFD."""
        return self.decode("utf-8", "replace")


_SPILL_KEYS = (
    "stdout_file",
    "stderr_file",
    "stdout_file_truncated_bytes",
    "stderr_file_truncated_bytes",
    "output_files_removed",
)


class ExecResult:
    """The result of one exec or shell-mode call.

    Attributes:
        exit_code: the command's exit code; 128+N when signal N killed it (a
            timeout or cancel kills with SIGTERM: 143, SIGKILL after the grace:
            137), 127 command not found, 126 not executable.
        stdout, stderr: the output (:class:`Output`, a ``bytes``). For ``exec`` the
            exact bytes, at most ``max_output`` per stream. For ``shell`` the exact
            bytes when the stream fits the session's cap (50 KiB unless the rule or
            ``max_output`` says otherwise), else berth's capped text (head, a marker
            line, tail) whose whole stream is in the spill file (:attr:`spill`).
        timed_out: the call's ``timeout`` passed and the tree was killed.
        canceled: the call was cancelled (interrupt, shutdown) and the tree killed.
        cwd: shell mode: the directory the session's next shell call starts in.
        truncated: output was left out (``stdout_truncated_bytes`` or
            ``stderr_truncated_bytes`` is not 0).
        spill: shell mode with a capped stream: the host files that hold the whole
            streams, as the API gives them (``stdout_file``, ``stderr_file``,
            ``*_file_truncated_bytes``, ``output_files_removed``); None otherwise.
        pooled: the session's sandbox is a warm pool member it claimed (on the
            session's first call: a claim of a ready sandbox instead of a create).
        signal, oom_killed, duration_ms, session, driver, sandbox, recreated,
        recreated_reason: as the API's ExecResult.
        raw: the result object as the daemon sent it.
    """

    def __init__(self, raw: Dict[str, Any], stdout: bytes = b"", stderr: bytes = b"") -> None:
        self.raw = raw
        self.exit_code: int = int(raw.get("exit_code", 0))
        self.signal: int = int(raw.get("signal", 0))
        self.timed_out: bool = bool(raw.get("timed_out", False))
        self.oom_killed: bool = bool(raw.get("oom_killed", False))
        self.canceled: bool = bool(raw.get("canceled", False))
        self.duration_ms: int = int(raw.get("duration_ms", 0))
        self.session: str = str(raw.get("session", ""))
        self.driver: str = str(raw.get("driver", ""))
        self.sandbox: str = str(raw.get("sandbox", ""))
        self.recreated: bool = bool(raw.get("recreated", False))
        self.recreated_reason: Optional[str] = raw.get("recreated_reason")
        self.pooled: bool = bool(raw.get("pooled", False))
        self.cwd: Optional[str] = raw.get("cwd") or None
        self.stdout_truncated_bytes: int = int(raw.get("stdout_truncated_bytes", 0))
        self.stderr_truncated_bytes: int = int(raw.get("stderr_truncated_bytes", 0))
        self.stdout = Output(stdout)
        self.stderr = Output(stderr)
        spill = {k: raw[k] for k in _SPILL_KEYS if raw.get(k)}
        self.spill: Optional[Dict[str, Any]] = spill if ("stdout_file" in spill or "stderr_file" in spill) else None

    @property
    def truncated(self) -> bool:
        """Whether any output was left out (see :attr:`spill` for where it is)."""
        return self.stdout_truncated_bytes > 0 or self.stderr_truncated_bytes > 0

    @property
    def ok(self) -> bool:
        """``exit_code == 0 and not timed_out``."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def stdout_text(self) -> str:
        """stdout as text (UTF-8, invalid bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        """stderr as text (UTF-8, invalid bytes replaced)."""
        return self.stderr.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return "ExecResult(exit_code=%d, timed_out=%r, stdout=%d bytes, stderr=%d bytes%s)" % (
            self.exit_code,
            self.timed_out,
            len(self.stdout),
            len(self.stderr),
            ", cwd=%r" % self.cwd if self.cwd else "",
        )


class Event:
    """One event of a streamed exec, in the order the daemon sent it.

    Attributes:
        kind: ``"started"``, ``"stdout"``, ``"stderr"``, ``"exit"`` (the last one),
            or any other event type the daemon sends (passed on, never dropped).
        data: an output event's bytes (``b""`` for others).
        result: the ``"exit"`` event's :class:`ExecResult` (its stdout and stderr
            empty: the output came as events); None for others.
        raw: the event object as the daemon sent it (``data`` still base64).
    """

    __slots__ = ("kind", "data", "result", "raw")

    def __init__(self, kind: str, data: bytes = b"", result: Optional[ExecResult] = None, raw: Optional[Dict[str, Any]] = None) -> None:
        self.kind = kind
        self.data = data
        self.result = result
        self.raw = raw or {}

    @property
    def started(self) -> Optional[Dict[str, Any]]:
        """The ``"started"`` event's placement (session, driver, sandbox, ...)."""
        return self.raw.get("started")

    def __repr__(self) -> str:
        if self.kind == "exit":
            return "Event('exit', %r)" % (self.result,)
        if self.data:
            return "Event(%r, %r)" % (self.kind, self.data[:60])
        return "Event(%r)" % self.kind


@dataclasses.dataclass(init=False, eq=False)
class Job(_Answer):
    """A background job (the API's Job object).

    Attributes: ``id``, ``session``, ``argv``, ``pid`` (in the sandbox), ``running``,
    ``exit_code`` and ``signal`` (once ended), ``started`` and ``ended`` (RFC 3339
    strings; ``ended`` None while it runs), ``log_bytes``, ``dropped_bytes``, ``raw``
    (and, as for every typed answer, ``job["key"]``).
    """

    raw: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    id: str = ""
    session: str = ""
    argv: List[str] = dataclasses.field(default_factory=list)
    pid: int = 0
    running: bool = False
    exit_code: int = 0
    signal: int = 0
    started: Optional[str] = None
    ended: Optional[str] = None
    log_bytes: int = 0
    dropped_bytes: int = 0


class LogEvent:
    """One event of a job's log: ``kind`` is ``"gap"`` (``dropped`` bytes before the
    kept log are gone), ``"output"`` (``data``), or the last, ``"end"`` (``ended``,
    ``exit_code``, ``signal``); ``offset`` as the API gives it (pass ``end``'s as the
    next call's offset to go on)."""

    __slots__ = ("kind", "offset", "data", "dropped", "ended", "exit_code", "signal", "raw")

    def __init__(self, raw: Dict[str, Any], data: bytes) -> None:
        self.raw = raw
        self.kind: str = str(raw.get("event", ""))
        self.offset: int = int(raw.get("offset", 0))
        self.data = data
        self.dropped: int = int(raw.get("dropped", 0))
        self.ended: bool = bool(raw.get("ended", False))
        self.exit_code: int = int(raw.get("exit_code", 0))
        self.signal: int = int(raw.get("signal", 0))

    def __repr__(self) -> str:
        return "LogEvent(%r, offset=%d, %d bytes)" % (self.kind, self.offset, len(self.data))


class JobLogs:
    """A job's output read with :meth:`berth.Jobs.logs`.

    Attributes: ``data`` (:class:`Output`), ``offset`` (after the last byte: the
    next call's ``offset``), ``dropped`` (bytes before the kept log that are gone),
    ``ended``, ``exit_code``, ``signal`` (once ``ended``).
    """

    def __init__(self, data: bytes, offset: int, dropped: int, ended: bool, exit_code: int, signal: int) -> None:
        self.data = Output(data)
        self.offset = offset
        self.dropped = dropped
        self.ended = ended
        self.exit_code = exit_code
        self.signal = signal

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return "JobLogs(%d bytes, offset=%d, ended=%r)" % (len(self.data), self.offset, self.ended)


class PoolMember:
    """One member of a :class:`WarmPool`.

    Attributes: ``sandbox`` (its sandbox name), ``state`` (``"ready"``,
    ``"creating"``, ``"claiming"`` or ``"draining"``), ``created`` (its
    reservation) and ``ready`` (when its agent first answered; None while it is
    made), RFC 3339 strings in UTC; ``session`` (the claiming session, state
    ``"claiming"``; None otherwise); ``raw``.
    """

    __slots__ = ("sandbox", "state", "created", "ready", "session", "raw")

    def __init__(self, raw: Dict[str, Any]) -> None:
        self.raw = raw
        self.sandbox: str = str(raw.get("sandbox", ""))
        self.state: str = str(raw.get("state", ""))
        self.created: Optional[str] = raw.get("created")
        self.ready: Optional[str] = raw.get("ready")
        self.session: Optional[str] = raw.get("session") or None

    def __repr__(self) -> str:
        return "PoolMember(%r, %r)" % (self.sandbox, self.state)


class WarmPool:
    """One rule's warm pool, as ``GET /v1/pools`` gives it (docs/pools.md).

    Attributes:
        scope, position, driver: the rule's glob, its ``FILE:LINE:COL`` and driver.
        size: the pool block's size (0 for members an earlier config left).
        max_idle_ms: the pool block's ``max_idle`` in milliseconds (0: never
            replaced for their age).
        ready, creating, claiming, draining: how many members are in each state.
        members: the :class:`PoolMember` list, oldest first.
        raw: the object as the daemon sent it.
    """

    def __init__(self, raw: Dict[str, Any]) -> None:
        self.raw = raw
        self.scope: str = str(raw.get("scope", ""))
        self.position: str = str(raw.get("position", ""))
        self.driver: str = str(raw.get("driver", ""))
        self.size: int = int(raw.get("size", 0))
        self.max_idle_ms: int = int(raw.get("max_idle_ms", 0))
        self.ready: int = int(raw.get("ready", 0))
        self.creating: int = int(raw.get("creating", 0))
        self.claiming: int = int(raw.get("claiming", 0))
        self.draining: int = int(raw.get("draining", 0))
        self.members: List[PoolMember] = [PoolMember(m) for m in raw.get("members") or []]

    @property
    def full(self) -> bool:
        """Whether ``size`` members are ready and nothing else is in the pool."""
        return self.ready == self.size and len(self.members) == self.size

    def __repr__(self) -> str:
        return "WarmPool(%r, driver=%r, size=%d, ready=%d, creating=%d)" % (self.scope, self.driver, self.size, self.ready, self.creating)
