"""The hermes ``TerminalEnvironmentProvider`` named ``berth``
(agent/terminal_env_provider.py in hermes-agent)."""

import logging
import os
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

import berth

from .environment import DEFAULT_SESSION_PATTERN, BerthEnvironment, _hermes, session_name

_ProviderBase = _hermes("agent.terminal_env_provider", "TerminalEnvironmentProvider") or object
_get_hermes_home = _hermes("hermes_constants", "get_hermes_home")

logger = logging.getLogger(__name__)


def hermes_home() -> str:
    """hermes's home directory, as hermes resolves it (``hermes_constants.get_hermes_home``
    when hermes is loaded), else ``$HERMES_HOME``, else ``~/.hermes``."""
    if _get_hermes_home is not None:
        try:
            return str(_get_hermes_home())
        except Exception:
            pass
    return os.environ.get("HERMES_HOME") or os.path.join(os.path.expanduser("~"), ".hermes")


def hermes_terminal_config(home: Optional[str] = None) -> Dict[str, Any]:
    """The ``terminal`` section of hermes's ``config.yaml`` (under :func:`hermes_home`),
    read as hermes reads it (YAML; hermes ships PyYAML); {} when there is no file.
    hermes does not hand a plugin its ``terminal.backends.berth`` block nor, for a
    backend other than docker, ``docker_forward_env`` and ``docker_env``
    (tools/terminal_tool_backends.py ``_build_plugin_env`` passes cwd, timeout,
    task_id, image and container_config only, hermes-agent 027fc66), so the
    provider reads them here. A file that cannot be read or parsed is logged and
    taken as empty: the backend then runs on its defaults, never on half a config."""
    path = os.path.join(home or hermes_home(), "config.yaml")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        logger.warning("berth backend: cannot read hermes's config %s: %s; using defaults", path, e)
        return {}
    try:
        import yaml  # hermes's own dependency (PyYAML)
    except ImportError:
        logger.warning("berth backend: PyYAML is not installed, so hermes's config %s is not read; using defaults", path)
        return {}
    try:
        doc = yaml.safe_load(text) or {}
    except Exception as e:
        logger.warning("berth backend: hermes's config %s does not parse (%s); using defaults", path, e)
        return {}
    term = doc.get("terminal") if isinstance(doc, Mapping) else None
    return dict(term) if isinstance(term, Mapping) else {}

#: Environment variables the plugin reads (each also a ``terminal.backends.berth``
#: key, which wins): the session pattern, and how to reach ``berth serve``.
ENV_SESSION_PATTERN = "BERTH_HERMES_SESSION"
ENV_DEFAULT_SESSION = "BERTH_HERMES_DEFAULT_SESSION"


def host_cwd(term: Mapping[str, Any]) -> str:
    """The user's project directory for sessions on the host: hermes's
    ``terminal.cwd`` (from ``config.yaml``, else ``$TERMINAL_CWD``, which hermes
    exports from it), ``~`` expanded and relative paths taken from this process's
    directory; this process's directory when neither is set or it is ``.``."""
    cwd = term.get("cwd") if isinstance(term.get("cwd"), str) else ""
    cwd = cwd or os.environ.get("TERMINAL_CWD", "")
    try:
        here = os.getcwd()
    except OSError:
        here = os.path.expanduser("~")
    if not cwd or cwd == ".":
        return here
    return os.path.normpath(os.path.join(here, os.path.expanduser(cwd)))


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
            "bounded_output": {"type": "number", "description": "characters of output the foreground terminal tool keeps (head and tail; default: hermes's tool_output.max_bytes)"},
            "forward_env": {"type": "list", "description": "host variables sent with every command (default: terminal.docker_forward_env)"},
        }

    def resolve_config(self, config: Mapping[str, Any]) -> Dict[str, Any]:
        c = dict(config or {})
        return {
            "session_pattern": c.get("session_pattern") or os.environ.get(ENV_SESSION_PATTERN) or DEFAULT_SESSION_PATTERN,
            "default_session": c.get("default_session") or os.environ.get(ENV_DEFAULT_SESSION) or None,
            "host": c.get("host") or None,
            "token_file": c.get("token_file") or None,
            "bounded_output": int(c.get("bounded_output") or 0) or None,
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
        Unknown keyword arguments are ignored (hermes's forward-compat rule).

        Settings: ``backend_config`` when hermes passes one, else
        ``terminal.backends.berth`` of hermes's ``config.yaml``
        (:func:`hermes_terminal_config`); variables to forward and to set: the
        block's ``forward_env`` and ``env``, else ``container_config``'s
        ``docker_forward_env`` and ``docker_env``, else the ``terminal`` section's
        own (which hermes gives only to its docker backend)."""
        term = hermes_terminal_config()
        bc = kwargs.get("backend_config")
        if not isinstance(bc, Mapping):
            backends = term.get("backends")
            bc = backends.get("berth") if isinstance(backends, Mapping) else None
        bc = bc if isinstance(bc, Mapping) else {}
        conf = self.resolve_config(bc)
        cc = container_config or {}
        forward = bc.get("forward_env") or cc.get("docker_forward_env") or term.get("docker_forward_env") or []
        env = bc.get("env") or cc.get("docker_env") or term.get("docker_env") or {}
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
            host_cwd=host_cwd(term),
        )
