"""The hermes environment object: hermes's ``BaseEnvironment`` contract
(tools/environments/base.py: ``execute()`` returning ``{"output", "returncode"}``,
``cleanup()``) over one berth session."""

import logging
import os
import shlex
import threading
from typing import Any, Dict, Iterable, Mapping, Optional

import berth

logger = logging.getLogger(__name__)

#: The default session name pattern: ``{task_id}`` is hermes's task id.
DEFAULT_SESSION_PATTERN = "hermes:{task_id}"

#: Characters of output kept for ``execute(..., bounded_capture=True)`` (the
#: foreground terminal tool) when hermes's own limit cannot be read: hermes's
#: default ``tool_output.max_bytes`` (tools/environments/base_output.py,
#: ``_new_output_collector``, hermes-agent 0294b43). hermes keeps full fidelity
#: otherwise, and so do we.
DEFAULT_BOUNDED_OUTPUT = 50_000


def bounded_output_limit() -> int:
    """hermes's window for a bounded capture: its ``tool_output.max_bytes``
    (``tools.tool_output_limits.get_max_bytes``, as hermes's own collector reads
    it), else :data:`DEFAULT_BOUNDED_OUTPUT`."""
    get = _hermes("tools.tool_output_limits", "get_max_bytes")
    try:
        n = int(get()) if get is not None else DEFAULT_BOUNDED_OUTPUT
    except Exception:
        n = DEFAULT_BOUNDED_OUTPUT
    return n if n > 0 else DEFAULT_BOUNDED_OUTPUT

# The cwds hermes gives a container backend by default, or after rewriting a host
# path (see _Environment's host_cwd).
_CONTAINER_DEFAULT_CWDS = ("", "/root", "~", "/workspace")

# How often the interrupt watcher looks at hermes's per-thread interrupt bit,
# in seconds (hermes's own poll backs off from 5 ms to 200 ms).
_INTERRUPT_POLL = 0.05

# Kinds of berth error that are the backend's failure, not the command's: hermes
# turns EnvironmentConnectionError into a "degraded" result and retries later.
_INFRA_ERRORS = (berth.Unavailable, berth.DriverCrashed, berth.ShuttingDown)


def _hermes(module: str, name: str) -> Any:
    """``module.name`` from hermes-agent when hermes is importable, else None."""
    try:
        mod = __import__(module, fromlist=[name])
        return getattr(mod, name)
    except Exception:  # hermes absent, or one of its imports missing here
        return None


_BaseEnvironment = _hermes("tools.environments.base", "BaseEnvironment")
_EnvironmentConnectionError = _hermes("tools.environments.base", "EnvironmentConnectionError")
_is_thread_interrupted = _hermes("tools.interrupt", "is_thread_interrupted")


def session_name(pattern: str, task_id: Optional[str], default_session: Optional[str] = None) -> str:
    """The berth session name for a hermes task id: ``pattern`` with
    ``{task_id}`` replaced. hermes's top-level agent uses the task id
    ``"default"`` (None means it too); ``default_session``, when given, names its
    session instead (e.g. ``"main"``, so the main chat runs where berth's rule for
    ``main`` says while subagents and gateway chats get their own sessions).
    Raises ValueError for a pattern without ``{task_id}`` or with other fields.
    berth checks the name itself on the first call (``berth.Invalid`` naming it)."""
    if default_session and (task_id or "default") == "default":
        return default_session
    if "{task_id}" not in pattern:
        raise ValueError("session pattern %r: it must contain {task_id}, e.g. %r" % (pattern, DEFAULT_SESSION_PATTERN))
    try:
        return pattern.format(task_id=task_id or "default")
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError("session pattern %r: only {task_id} may be used (%s)" % (pattern, e)) from None


def _quote_cwd(cwd: str) -> str:
    """Quote a ``cd`` target as hermes does (BaseEnvironment._quote_cwd_for_cd):
    ``~`` and ``~/...`` keep their expansion."""
    if cwd == "~":
        return cwd
    if cwd == "~/":
        return "$HOME"
    if cwd.startswith("~/"):
        return "$HOME/" + shlex.quote(cwd[2:])
    return shlex.quote(cwd)


class _Collector:
    """stdout and stderr merged in the order berth sent them (hermes runs bash with
    stderr=STDOUT), whole, or within ``limit`` characters as hermes renders a
    bounded capture (tools/environments/base_output.py, ``_BoundedOutputCollector``,
    hermes-agent 0294b43): 40% head, a notice, 60% tail, so that hermes has
    nothing left to cut; the whole stream is then in berth's spill file
    (``full_output_path``)."""

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        if self.limit is None or len(self.head) + len(data) <= self.limit:
            self.head += data
            return
        # Keep at most limit bytes of head and of tail: render cuts them to the
        # window once the notice's length is known.
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > self.limit:
            del self.tail[: len(self.tail) - self.limit]

    @property
    def truncated(self) -> bool:
        return self.limit is not None and self.total > self.limit

    def render(self, suffix: str = "") -> str:
        whole = (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        if not self.truncated:
            return whole + suffix
        assert self.limit is not None
        available = max(0, self.limit - len(suffix))
        notice = ""
        for _ in range(4):  # the notice's length depends on the count it states
            omitted = max(0, self.total - max(0, available - len(notice)))
            updated = "\n\n... [OUTPUT TRUNCATED - {:,} chars omitted out of {:,} total] ...\n\n".format(omitted, self.total)
            if updated == notice:
                break
            notice = updated
        budget = max(0, available - len(notice))
        head_n = int(budget * 0.4)
        tail_n = budget - head_n
        head = bytes(self.head[:head_n]).decode("utf-8", "replace")
        tail = bytes(self.tail[-tail_n:]).decode("utf-8", "replace") if tail_n else ""
        return head + notice[:available] + tail + suffix


class _Environment:
    """A hermes terminal environment over one berth session.

    hermes's contract (tools/environments/base.py, BaseEnvironment.execute):
    ``execute(command, cwd="", *, timeout=None, stdin_data=None, ...)`` returns
    ``{"output": str, "returncode": int}`` with stdout and stderr merged;
    ``returncode`` 124 with the partial output and ``[Command timed out after
    Ns]`` when the timeout passes, 130 with ``[Command interrupted]`` when hermes
    interrupts the calling thread (``tools.interrupt``), and ``"cwd"`` when the
    command's working directory is known. Here every command runs in berth's shell
    mode (``Session.shell`` semantics: ``cd`` and ``export`` carry over to the
    next command, in berth's session state, so two hermes processes see the same
    state), background children outlive the call, and timeout or interrupt kill
    the command's whole process tree. ``cleanup()`` closes the session: the berth
    rule's ``on_close`` decides whether its sandbox is kept, stopped or removed.

    Args:
        client: the berth client (thread-safe; shared by a provider's environments).
        session: the berth session name (see :func:`session_name`).
        cwd: where the first command starts (hermes's ``terminal.cwd``); "" for
            the sandbox's default (its rule's ``workdir``).
        timeout: default per-command timeout in seconds (hermes's
            ``terminal.timeout``); a call's own ``timeout`` wins.
        env: variables for every command, over the sandbox's environment.
        forward_env: host variables sent with every command when set here
            (hermes's ``docker_forward_env``: a docker sandbox's environment is
            the image's and the rule's, so berth passes them per call).
        host_cwd: where a session that berth's config puts on the host (driver
            ``local``) starts when hermes gave a container default (``/root``,
            ``~``, ``/workspace`` or nothing): hermes's ``terminal.cwd``, the user's
            project directory. hermes treats every plugin backend as a container
            and rewrites host paths to ``/root`` (tools/terminal_tool_config.py,
            ``_is_unusable_container_cwd``, hermes-agent 0a6ef40), which on the host
            is root's home, not the project. hermes's terminal tool also passes that
            default as a call's ``cwd`` whenever it has no usable record of the
            session's cwd (a host path such as /home/... it discards): on a host
            session the plugin then runs where the session is (berth's shell
            state). "" keeps hermes's cwd everywhere.
        bounded_output: characters kept for ``bounded_capture=True`` calls; None
            for hermes's ``tool_output.max_bytes`` (:func:`bounded_output_limit`).
    """

    _stdin_mode = "pipe"
    is_local = False
    #: A berth sandbox lives across hermes's turns. hermes tears a plugin's
    #: environment down at the end of every turn unless it reads as persistent
    #: (tools/terminal_tool_lifecycle.py, ``is_persistent_env``: ``_session_scoped``
    #: or ``_persistent``, hermes-agent 027fc66); without this a turn's end closed
    #: the session, so its rule's ``on_close = "stop"`` killed the background
    #: servers of every turn, and another hermes process's running command. When
    #: the task really ends (``AIAgent.close`` → ``cleanup_vm``, or hermes's idle
    #: reaper), hermes calls :meth:`cleanup`; berth's retention does the rest.
    _persistent = True

    def __init__(
        self,
        client: "berth.Client",
        session: str,
        *,
        cwd: str = "",
        timeout: int = 180,
        env: Optional[Mapping[str, str]] = None,
        forward_env: Iterable[str] = (),
        bounded_output: Optional[int] = None,
        host_cwd: str = "",
    ) -> None:
        if _BaseEnvironment is not None:
            # hermes's own fields (snapshot paths, session id); its execute() is
            # replaced below, its helpers (fetch_file, fetch_realpath) call ours.
            _BaseEnvironment.__init__(self, cwd, timeout, dict(env or {}))
        self.cwd = cwd
        self.timeout = timeout
        self.env = dict(env or {})
        self.client = client
        self.session = client.session(session)
        self.session_name = session
        self.forward_env = [n for n in forward_env if isinstance(n, str) and n]
        self.bounded_output = bounded_output
        self._need_cd = bool(cwd)
        self.host_cwd = host_cwd
        self._placed = not (host_cwd and cwd in _CONTAINER_DEFAULT_CWDS)
        # The container default hermes created us with, which its terminal tool
        # passes as a call's cwd whenever it has no usable record (see execute).
        self._hermes_cwd = cwd
        self._on_host = False
        self._closed = False

    def __repr__(self) -> str:
        return "BerthEnvironment(%r)" % self.session_name

    def get_temp_dir(self) -> str:
        return "/tmp"

    def _place(self) -> None:
        """Once, before the first command: a session that berth's config runs on
        the host starts in :attr:`host_cwd` instead of hermes's container
        default. Asked of the daemon (``config explain``); when it cannot say,
        hermes's cwd stays."""
        self._placed = True
        try:
            driver = self.client.explain(self.session_name).get("driver")
        except Exception as e:
            logger.debug("berth session %s: explain failed (%s); keeping cwd %r", self.session_name, e, self.cwd)
            return
        if driver == "local":
            self.cwd = self.host_cwd
            self._need_cd = True
            self._on_host = True

    def _call_env(self) -> Dict[str, str]:
        env = {"AI_AGENT": "hermes-agent", "HERMES_AGENT": "true"}
        for name in self.forward_env:
            if name in os.environ:
                env[name] = os.environ[name]
        env.update(self.env)
        return env

    def execute(
        self,
        command: str,
        cwd: str = "",
        *,
        timeout: Optional[int] = None,
        stdin_data: Optional[str] = None,
        bounded_capture: bool = False,
        **kwargs: Any,
    ) -> Dict[str, Any]:
        """Run ``command`` (a shell command line) in the session; see the class."""
        effective_timeout = timeout or self.timeout
        if not self._placed:
            self._place()
        if cwd and self._on_host and cwd == self._hermes_cwd:
            # hermes's terminal tool passes a cwd with every call: the session's
            # recorded cwd, else the cwd it created the environment with, a container
            # default (/root for a plugin backend). It has no usable record on the
            # first call, nor ever when the recorded cwd is a host-looking path
            # (/home/..., /Users/...), which it discards for a container backend
            # (tools/terminal_tool.py _resolve_command_cwd, hermes-agent 027fc66). On
            # a host session that default means "where the session is": hermes's
            # terminal.cwd for the first command, berth's shell state after it; never
            # root's home.
            cwd = ""
        target = cwd or (self.cwd if self._need_cd else "")
        script = command
        if target:
            # As hermes's wrapper (base_session_env._wrap_command_script): cd first,
            # 126 when the directory is not there.
            script = "cd -- %s || exit 126\n%s" % (_quote_cwd(target), command)
        # One stream, in the order written, as hermes's bash with stderr=STDOUT:
        # berth's stdout and stderr are two pipes, whose interleaving is lost.
        # eval (as hermes's wrapper does) runs in the session's shell, so cd and
        # export still carry over, and a syntax error lands in the output too.
        script = "eval %s 2>&1" % shlex.quote(script)
        limit = (self.bounded_output or bounded_output_limit()) if bounded_capture else None
        out = _Collector(limit)
        watcher = _InterruptWatcher(threading.current_thread().ident)
        self._closed = False
        try:
            # A bounded call caps berth's shell-mode text at the same window, so that
            # berth keeps the whole stream in its spill file past it.
            st = self.session.stream(shell=script, timeout=effective_timeout, env=self._call_env(), stdin=stdin_data,
                                     max_output=limit)
            try:
                with watcher.watching(st):
                    for ev in st:
                        if ev.kind in ("stdout", "stderr"):
                            out.add(ev.data)
            finally:
                st.close()
        except _INFRA_ERRORS as e:
            if _EnvironmentConnectionError is not None:
                raise _EnvironmentConnectionError(str(e)) from e
            raise
        res = st.result
        assert res is not None
        if target and not res.timed_out and not res.canceled:
            self._need_cd = False
        result: Dict[str, Any] = {}
        if res.timed_out:
            rendered = out.render("\n[Command timed out after %ss]" % effective_timeout)
            result = {"output": rendered.lstrip("\n") if out.total == 0 else rendered, "returncode": 124}
        elif res.canceled or watcher.fired:
            result = {"output": out.render("\n[Command interrupted]"), "returncode": 130}
        else:
            result = {"output": out.render(), "returncode": res.exit_code}
            if res.cwd:
                self.cwd = res.cwd
                result["cwd"] = res.cwd
                result["cwd_observed"] = True
        if out.truncated:
            # As hermes's own bounded capture (base_output._finalize_wait_result): the
            # whole stream's size, and the host file that holds it (berth's spill file
            # of the merged stream, in the daemon's state dir).
            result["output_total_chars"] = out.total
            spill = (res.spill or {}).get("stdout_file")
            if spill:
                result["full_output_path"] = spill
        if res.recreated:
            result["environment_recreated"] = True
        if res.oom_killed:
            result["oom_killed"] = True
        return result

    def cleanup(self, force_remove: bool = False) -> None:
        """hermes is done with the task: close the berth session, so that its rule's
        ``on_close`` applies (keep, stop or remove the sandbox). With
        ``force_remove=True`` (hermes passes it for a teardown its user asked for,
        and its prompt-time backend probe does: tools/terminal_tool_lifecycle.py
        ``_cleanup_env``, which forwards it only to a ``cleanup`` that takes it) the
        sandbox is removed whatever ``on_close`` says. Idempotent; never raises
        (hermes calls it from ``__del__`` and at exit too)."""
        if self._closed and not force_remove:
            return
        self._closed = True
        try:
            if force_remove:
                self.session.remove()
            else:
                self.session.close()
        except berth.NotFound:
            pass  # no sandbox yet: nothing to close
        except Exception as e:
            logger.warning("berth session %s: %s failed: %s", self.session_name,
                           "remove" if force_remove else "close", e)


class _InterruptWatcher:
    """Cancels a berth stream when hermes sets the interrupt bit of the thread
    that runs the command (``tools.interrupt.set_interrupt``): the exec's tree is
    killed and the stream ends with a ``canceled`` result. Without hermes, only a
    KeyboardInterrupt in that thread interrupts (the SDK cancels then)."""

    def __init__(self, tid: Optional[int]) -> None:
        self.tid = tid
        self.fired = False
        self._done = threading.Event()

    def watching(self, stream: "berth.Stream") -> "_InterruptWatcher":
        self._stream = stream
        return self

    def __enter__(self) -> "_InterruptWatcher":
        if _is_thread_interrupted is not None:
            self._thread = threading.Thread(target=self._run, name="berth-hermes-interrupt", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        t = getattr(self, "_thread", None)
        if t is not None:
            t.join()

    def _run(self) -> None:
        while not self._done.wait(_INTERRUPT_POLL):
            if _is_thread_interrupted(self.tid):
                self.fired = True
                _cancel(self._stream)
                return


def _cancel(stream: "berth.Stream") -> None:
    """Cancel a running stream from another thread (the interrupt watcher): the
    reading thread then gets the ``canceled`` result."""
    stream.cancel()


if _BaseEnvironment is not None:

    class BerthEnvironment(_Environment, _BaseEnvironment):  # type: ignore[misc, valid-type]
        __doc__ = _Environment.__doc__
        execute = _Environment.execute
        cleanup = _Environment.cleanup
        get_temp_dir = _Environment.get_temp_dir

else:

    class BerthEnvironment(_Environment):  # type: ignore[no-redef]
        __doc__ = _Environment.__doc__
