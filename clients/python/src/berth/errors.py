"""berth's error kinds as Python exceptions.

Every error answer of ``berth serve`` is ``{"error": {"kind": ..., "message": ...,
"session": ...}}`` (docs/api.md, "Errors"); :func:`from_answer` turns it into the
exception class of its ``kind``, in this one table (:data:`KINDS`). Errors of the
connection itself (no daemon, the daemon went away) are :class:`Unavailable`.

Each class also subclasses the builtin exception a Python caller would catch for
it, so code that knows nothing of berth still handles berth's errors:
:class:`Timeout` and :class:`RequestTimeout` are ``TimeoutError``,
:class:`Invalid`, :class:`TooLarge` and :class:`UnsupportedMediaType` are
``ValueError``, :class:`NotFound` is ``LookupError``, :class:`Unavailable` (and so
:class:`ShuttingDown` and :class:`DriverCrashed`) is ``ConnectionError``,
:class:`Unauthorized` is ``PermissionError`` and :class:`Unsupported` is
``NotImplementedError``. :class:`CommandFailed`, raised by ``check=True``, is a
``subprocess.CalledProcessError``. Catch :class:`Error` for every berth error.
"""

import subprocess

from typing import Any, Dict, Optional, Type

__all__ = [
    "Error",
    "NotFound",
    "Conflict",
    "Unavailable",
    "Unsupported",
    "Invalid",
    "Timeout",
    "Unauthorized",
    "TooLarge",
    "RequestTimeout",
    "UnsupportedMediaType",
    "MethodNotAllowed",
    "Busy",
    "ShuttingDown",
    "Canceled",
    "Internal",
    "DriverCrashed",
    "CommandFailed",
    "KINDS",
]


class Error(Exception):
    """A berth error.

    Attributes:
        kind: the API's error kind (``"not_found"``, ``"invalid"``, ...; see
            docs/api.md), or ``"unavailable"`` when the daemon cannot be reached.
        message: what went wrong and, where berth knows it, what to do.
        status: the HTTP status of the answer; 0 when there was no answer.
        session: the session the error concerns, or None.
        body: the error object as the daemon sent it (empty without an answer).
    """

    kind = "error"

    def __init__(
        self,
        message: str,
        *,
        kind: Optional[str] = None,
        status: int = 0,
        session: Optional[str] = None,
        body: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.message = message
        self.status = status
        self.session = session
        self.body: Dict[str, Any] = dict(body or {})

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return "%s(kind=%r, status=%r, message=%r)" % (type(self).__name__, self.kind, self.status, self.message)


class NotFound(Error, LookupError):
    """404 ``not_found``: no such session, sandbox, job or path."""

    kind = "not_found"


class Conflict(Error):
    """409 ``conflict``: the name is held by something not berth's, or the state does not allow the call."""

    kind = "conflict"


class Unavailable(Error, ConnectionError):
    """503 ``unavailable``: the runtime or driver is down, or the daemon cannot be reached.

    A client-side Unavailable (``status`` 0) names the socket or address it tried and
    says how to start ``berth serve``.
    """

    kind = "unavailable"


class Unsupported(Error, NotImplementedError):
    """501 ``unsupported``: the session's driver cannot do this."""

    kind = "unsupported"


class Invalid(Error, ValueError):
    """400 ``invalid``: a bad request (a session name that breaks the rules, a missing cwd, ...)."""

    kind = "invalid"


class Timeout(Error, TimeoutError):
    """504 ``timeout``: a call (not the command: see ``ExecResult.timed_out``) did not finish in time."""

    kind = "timeout"


class Unauthorized(Error, PermissionError):
    """401 ``unauthorized``: a TCP daemon's bearer token is missing or wrong."""

    kind = "unauthorized"


class TooLarge(Error, ValueError):
    """413 ``too_large``: a request body or file over the daemon's limit."""

    kind = "too_large"


class RequestTimeout(Error, TimeoutError):
    """408 ``request_timeout``: the request body arrived too slowly."""

    kind = "request_timeout"


class UnsupportedMediaType(Error, ValueError):
    """415 ``unsupported_media_type``: a body not sent as JSON (a bug in this client)."""

    kind = "unsupported_media_type"


class MethodNotAllowed(Error):
    """405 ``method_not_allowed``: the path does not take the method (a bug in this client)."""

    kind = "method_not_allowed"


class Busy(Error):
    """The daemon cannot take the call now; it may later (429, or ``shutting_down``)."""

    kind = "busy"


class ShuttingDown(Busy, Unavailable):
    """503 ``shutting_down``: the daemon is shutting down; try again when it is back."""

    kind = "shutting_down"


class Canceled(Error):
    """499 ``canceled``: the call was cancelled."""

    kind = "canceled"


class Internal(Error):
    """500 ``internal``: a bug in berth; please report it."""

    kind = "internal"


class DriverCrashed(Unavailable):
    """503 ``driver_crashed``: the driver's plugin crashed during the call; berth restarts it.

    ``retried`` says whether berth made the call once more on the restarted plugin
    (idempotent calls) and it failed again; an exec is never repeated.
    """

    kind = "driver_crashed"

    @property
    def retried(self) -> bool:
        return bool(self.body.get("retried"))


class CommandFailed(Error, subprocess.CalledProcessError):
    """A command that exited non-zero (or was killed, or timed out) under ``check=True``,
    as ``subprocess.run(check=True)`` raises ``CalledProcessError``: ``returncode``
    (the exit code: 124 for a timeout, 128+N for signal N), ``cmd`` (the argv, or the
    shell command), ``output``/``stdout`` and ``stderr`` (bytes) and ``result`` (the
    :class:`berth.ExecResult`). Not an answer of the daemon: the call succeeded, the
    command failed."""

    kind = "command_failed"

    def __init__(self, result: Any, cmd: Any, session: Optional[str] = None) -> None:
        code = result.exit_code
        why = "exited with %d" % code
        if getattr(result, "timed_out", False):
            why = "timed out (exit %d)" % code
        elif getattr(result, "signal", 0):
            why = "was killed by signal %d (exit %d)" % (result.signal, code)
        where = " in session %r" % session if session else ""
        # Not Error.__init__: its super() is CalledProcessError's, which takes
        # (returncode, cmd); the attributes of both are set here.
        message = "command %r%s %s" % (cmd, where, why)
        Exception.__init__(self, message)
        self.message = message
        self.status = 0
        self.session = session
        self.body: Dict[str, Any] = {}
        self.returncode = code
        self.cmd = cmd
        self.output = bytes(result.stdout)
        self.stderr = bytes(result.stderr)
        self.result = result

    def __str__(self) -> str:
        return self.message


#: The exception class of each error kind of the API (docs/api.md, "Errors").
KINDS: Dict[str, Type[Error]] = {
    c.kind: c
    for c in (
        NotFound,
        Conflict,
        Unavailable,
        Unsupported,
        Invalid,
        Timeout,
        Unauthorized,
        TooLarge,
        RequestTimeout,
        UnsupportedMediaType,
        MethodNotAllowed,
        ShuttingDown,
        Canceled,
        Internal,
        DriverCrashed,
    )
}

_BY_STATUS: Dict[int, Type[Error]] = {
    400: Invalid,
    401: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: Conflict,
    413: TooLarge,
    415: UnsupportedMediaType,
    429: Busy,
    499: Canceled,
    500: Internal,
    501: Unsupported,
    503: Unavailable,
    504: Timeout,
}


def from_info(info: Dict[str, Any], status: int) -> Error:
    """The exception of one ErrorInfo object (``{"kind", "message", "session"}``)."""
    kind = str(info.get("kind") or "")
    cls = KINDS.get(kind) or _BY_STATUS.get(status) or Error
    message = str(info.get("message") or "berth serve answered %d without a message" % status)
    return cls(message, kind=kind or None, status=status, session=info.get("session"), body=info)


def from_answer(status: int, body: bytes) -> Error:
    """The exception of an error answer: its status and body (an ErrorBody, or anything else)."""
    import json

    try:
        doc = json.loads(body.decode("utf-8", "replace"))
        info = doc["error"]
        if not isinstance(info, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        text = body[:500].decode("utf-8", "replace").strip()
        cls = _BY_STATUS.get(status, Error)
        return cls("berth serve answered %d: %s" % (status, text or "(no body)"), status=status)
    return from_info(info, status)
