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

#: Bytes of output kept for ``execute(..., bounded_capture=True)`` (the foreground
#: terminal tool): its head and tail, the middle replaced by a marker line that
#: names berth's spill files. hermes keeps full fidelity otherwise, and so do we.
DEFAULT_BOUNDED_OUTPUT = 1 << 20

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
    stderr=STDOUT), whole, or as a head and tail window of ``limit`` bytes."""

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        if self.limit is None or len(self.head) + len(data) <= self.limit // 2:
            self.head += data
            return
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        keep = self.limit - self.limit // 2
        if len(self.tail) > keep:
            del self.tail[: len(self.tail) - keep]

    def render(self, spill: Optional[Dict[str, Any]]) -> str:
        left = self.total - len(self.head) - len(self.tail)
        if left <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        where = ""
        if spill:
            files = [spill[k] for k in ("stdout_file", "stderr_file") if spill.get(k)]
            if files:
                where = "; the whole output is in " + " and ".join(files)
        mark = "\n[... %d bytes of output left out%s ...]\n" % (left, where)
        return bytes(self.head).decode("utf-8", "replace") + mark + bytes(self.tail).decode("utf-8", "replace")


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
        bounded_output: bytes kept for ``bounded_capture=True`` calls.
    """

    _stdin_mode = "pipe"
    is_local = False

    def __init__(
        self,
        client: "berth.Client",
        session: str,
        *,
        cwd: str = "",
        timeout: int = 180,
        env: Optional[Mapping[str, str]] = None,
        forward_env: Iterable[str] = (),
        bounded_output: int = DEFAULT_BOUNDED_OUTPUT,
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
        self._closed = False

    def __repr__(self) -> str:
        return "BerthEnvironment(%r)" % self.session_name

    def get_temp_dir(self) -> str:
        return "/tmp"

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
        out = _Collector(self.bounded_output if bounded_capture else None)
        watcher = _InterruptWatcher(threading.current_thread().ident)
        self._closed = False
        try:
            st = self.session.stream(shell=script, timeout=effective_timeout, env=self._call_env(), stdin=stdin_data)
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
            rendered = out.render(res.spill) + "\n[Command timed out after %ss]" % effective_timeout
            result = {"output": rendered.lstrip("\n") if out.total == 0 else rendered, "returncode": 124}
        elif res.canceled or watcher.fired:
            result = {"output": out.render(res.spill) + "\n[Command interrupted]", "returncode": 130}
        else:
            result = {"output": out.render(res.spill), "returncode": res.exit_code}
            if res.cwd:
                self.cwd = res.cwd
                result["cwd"] = res.cwd
                result["cwd_observed"] = True
        if res.recreated:
            result["environment_recreated"] = True
        if res.oom_killed:
            result["oom_killed"] = True
        return result

    def cleanup(self) -> None:
        """Close the berth session (its rule's ``on_close``); idempotent, never raises."""
        if self._closed:
            return
        self._closed = True
        try:
            self.session.close()
        except berth.NotFound:
            pass  # no sandbox yet: nothing to close
        except Exception as e:  # hermes calls cleanup from __del__ and atexit too
            logger.warning("berth session %s: close failed: %s", self.session_name, e)


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
