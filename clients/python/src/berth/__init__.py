"""berth: the Python client of ``berth serve`` (standard library only).

berth gives every terminal session its own place to run commands: the host, a
Docker or containerd container, or a third party's sandbox, chosen per session by
berth's config. This package talks to a running ``berth serve`` over its HTTP API
v1 (docs/api.md)::

    import berth
    s = berth.Client().session("chat:1")
    s.shell("cd /tmp")
    print(s.shell("pwd").stdout)      # /tmp

See docs/python.md for the guide.
"""

from .client import DEFAULT_MAX_OUTPUT, Client, Jobs, Session, Stream
from . import errors
from .errors import *  # noqa: F401,F403 — one class per error kind, and KINDS
from .results import DriverInfo, Event, ExecResult, Job, JobLogs, LogEvent, Output, PoolMember, SessionInfo, Status, WarmPool

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Session",
    "Jobs",
    "Stream",
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
