"""berth: the Python client of ``berth serve`` (standard library only).

berth gives every terminal session its own place to run commands: the host, a
Docker or containerd container, or a third party's sandbox, chosen per session by
berth's config. This package talks to a running ``berth serve`` over its HTTP API
v1 (docs/api.md)::

    import berth
    s = berth.Client().session("chat:1")
    s.shell("cd /tmp")
    print(s.shell("pwd").stdout)      # /tmp

For asyncio code, :class:`AsyncClient` has the same calls as coroutines, each
call in flight on its own connection; cancelling a task cancels its remote
command::

    async with berth.AsyncClient() as c:
        s = c.session("chat:1")
        r = await s.exec(["make", "test"], timeout=300)
        async with s.stream(["sh", "-c", "echo a; echo b >&2"]) as st:
            async for ev in st:
                print(ev.kind, ev.data)

See docs/python.md for the guide.
"""

from .client import DEFAULT_MAX_OUTPUT, Client, Jobs, Session, Stream
from .aio import AsyncClient, AsyncSession, AsyncStream
from . import errors
from .errors import *  # noqa: F401,F403 — one class per error kind, and KINDS
from .results import DriverInfo, Event, ExecResult, Job, JobLogs, LogEvent, Output, PoolMember, SessionInfo, Status, WarmPool

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Session",
    "Jobs",
    "Stream",
    "AsyncClient",
    "AsyncSession",
    "AsyncStream",
    "DEFAULT_MAX_OUTPUT",
    "ExecResult",
    "Event",
    "SessionInfo",
    "Status",
    "DriverInfo",
    "Job",
    "JobLogs",
    "LogEvent",
    "Output",
    "WarmPool",
    "PoolMember",
] + errors.__all__
