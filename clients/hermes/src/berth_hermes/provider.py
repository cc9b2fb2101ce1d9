"""The hermes ``TerminalEnvironmentProvider`` named ``berth``
(agent/terminal_env_provider.py in hermes-agent)."""

import os
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

import berth

from .environment import DEFAULT_BOUNDED_OUTPUT, DEFAULT_SESSION_PATTERN, BerthEnvironment, _hermes, session_name

_ProviderBase = _hermes("agent.terminal_env_provider", "TerminalEnvironmentProvider") or object

#: Environment variables the plugin reads (each also a ``terminal.backends.berth``
#: key, which wins): the session pattern, and how to reach ``berth serve``.
ENV_SESSION_PATTERN = "BERTH_HERMES_SESSION"
ENV_DEFAULT_SESSION = "BERTH_HERMES_DEFAULT_SESSION"


class BerthTerminalProvider(_ProviderBase):  # type: ignore[misc, valid-type]
    """hermes's terminal backend ``berth``: ``create_environment`` gives each hermes
    task id a :class:`BerthEnvironment` on the berth session named by the pattern
    (``terminal.backends.berth.session_pattern``, else ``$BERTH_HERMES_SESSION``,
    else ``hermes:{task_id}``); hermes's top-level task ``default`` may get a
    session of its own (``default_session``, ``$BERTH_HERMES_DEFAULT_SESSION``,
    e.g. ``main``). The daemon is found as berth's CLI finds it
    (``BERTH_HOST``, ``BERTH_TOKEN_FILE``, else ``STATE/berth.sock``), or from
    ``terminal.backends.berth.host`` / ``token_file``.

    Classification (hermes's contract): berth's config decides per session whether
    commands run on the host or in a container, so the provider says
    ``is_remote`` and ``is_container`` (container path semantics, no host
    hints), but keeps hermes's dangerous-command approval on
    (``skip_container_guards`` False): a rule may put sessions on the host or
    mount host paths. Sandboxes are resumed by session name, so
    ``session_isolated_when_nonpersistent`` is True.
    """

    name = "berth"
    display_name = "berth"
    is_remote = True
    is_container = True
    session_isolated_when_nonpersistent = True

    def __init__(self) -> None:
        self._clients: Dict[Tuple[Optional[str], Optional[str]], berth.Client] = {}
        self._lock = threading.Lock()

    @property
    def description(self) -> str:
        return "Run commands in berth sessions: per-session sandboxes on the host, Docker or containerd, placed and retired by berth's config."

    @property
    def skip_container_guards(self) -> bool:
        return False

    @property
    def cache_path_base(self) -> Optional[str]:
        return None

    @property
    def strip_env_keys(self) -> frozenset:
        # A model-authored command on the host must not reach berth serve (every
        # session's sandbox) through these.
        return frozenset({"BERTH_HOST", "BERTH_TOKEN_FILE", "BERTH_TLS_CA"})

    @property
    def env_description(self) -> str:
        return "a berth session's sandbox (Linux; the host or a container, as berth's config places it)"

    def is_available(self) -> bool:
        """True when ``berth serve`` can be reached in principle: ``BERTH_HOST`` is
        set, or the default socket exists. No network call (hermes's rule)."""
        if os.environ.get("BERTH_HOST"):
            return True
        try:
            where = berth.Client().where
        except Exception:
            return False
        return where.startswith("unix://") and os.path.exists(where[len("unix://"):])

    def setup_instructions(self) -> List[str]:
        return [
            "Start berth serve (berth serve &) with a config that places hermes:* sessions (docs/hermes.md).",
            "Set terminal.backend: berth; optional terminal.backends.berth.session_pattern (default hermes:{task_id}).",
        ]

    def probe(self) -> Tuple[str, str]:
        if self.is_available():
            return ("ready", "")
        return ("needs_setup", "berth serve is not running (no BERTH_HOST, no socket at the default state dir); start it with `berth serve`")

    def get_config_schema(self) -> Dict[str, Dict[str, Any]]:
        return {
            "session_pattern": {"type": "string", "description": "berth session name for a hermes task; {task_id} is the task id (default hermes:{task_id})"},
            "default_session": {"type": "string", "description": "berth session of hermes's top-level agent (task id default), e.g. main; unset: the pattern applies"},
            "host": {"type": "string", "description": "berth serve's address: unix:///PATH or https://HOST:PORT (default: as the berth CLI finds it)"},
            "token_file": {"type": "string", "description": "file holding berth serve's bearer token (TCP only)"},
            "bounded_output": {"type": "number", "description": "bytes of output the foreground terminal tool keeps (head and tail)"},
        }

    def resolve_config(self, config: Mapping[str, Any]) -> Dict[str, Any]:
        c = dict(config or {})
        return {
            "session_pattern": c.get("session_pattern") or os.environ.get(ENV_SESSION_PATTERN) or DEFAULT_SESSION_PATTERN,
            "default_session": c.get("default_session") or os.environ.get(ENV_DEFAULT_SESSION) or None,
            "host": c.get("host") or None,
            "token_file": c.get("token_file") or None,
            "bounded_output": int(c.get("bounded_output") or DEFAULT_BOUNDED_OUTPUT),
        }

    def _client(self, host: Optional[str], token_file: Optional[str]) -> berth.Client:
        with self._lock:
            c = self._clients.get((host, token_file))
            if c is None:
                c = berth.Client(host, token_file)
                self._clients[(host, token_file)] = c
            return c

    def create_environment(
        self,
        *,
        cwd: str = "",
        timeout: int = 180,
        task_id: str = "default",
        image: Optional[str] = None,
        container_config: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> BerthEnvironment:
        """A :class:`BerthEnvironment` for hermes task ``task_id``. ``image`` and the
        resource keys of ``container_config`` are not used: berth's config (the
        session's scope rule) decides the sandbox; ``docker_forward_env`` and
        ``docker_env`` of ``container_config`` are sent with every command.
        Unknown keyword arguments are ignored (hermes's forward-compat rule);
        ``backend_config`` (hermes's ``terminal.backends.berth``) is read."""
        bc = kwargs.get("backend_config")
        conf = self.resolve_config(bc if isinstance(bc, Mapping) else {})
        cc = container_config or {}
        forward = cc.get("docker_forward_env") or []
        env = cc.get("docker_env") or {}
        if not isinstance(env, Mapping):
            env = {}
        return BerthEnvironment(
            self._client(conf["host"], conf["token_file"]),
            session_name(conf["session_pattern"], task_id, conf["default_session"]),
            cwd=cwd or "",
            timeout=timeout,
            env={str(k): str(v) for k, v in env.items()},
            forward_env=[str(n) for n in forward] if isinstance(forward, (list, tuple)) else [],
            bounded_output=conf["bounded_output"],
        )
