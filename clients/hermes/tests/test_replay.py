"""Replays of hermes-agent's real call sequences on a terminal backend plugin.

hermes-agent (NousResearch/hermes-agent) cannot be installed here and its code stays
outside berth. So these tests make, against a real ``berth serve`` (conftest.py: local
sessions on the host, the others each in a docker sandbox), the calls hermes makes on a
plugin's provider and environment objects: in hermes's order, with hermes's arguments,
on the threads hermes uses. :class:`Hermes` below is our own code standing in for the
parts of one hermes process that call the plugin (its terminal tool's environment cache,
its file tools, its turn loop and lifecycle); each of its methods, and each test's
docstring, cites the hermes file and line it follows, at the commit read
(clients/hermes/README.md lists them). Where berth cannot do what hermes expects, the
test asserts what berth does and says so.
"""

import base64
import inspect
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import types
import uuid

import pytest

import berth
import berth_hermes
from berth_hermes import environment as bh_env
from conftest import wait_until

#: hermes-agent commits read, per file (the tests cite ``path:line@commit``).
AT = {
    "agent/terminal_env_provider.py": "3af739a",
    "agent/prompt_builder.py": "0006718",
    "agent/tool_dispatch_helpers.py": "0302e76",
    "tools/terminal_tool.py": "027fc66",
    "tools/terminal_tool_backends.py": "027fc66",
    "tools/terminal_tool_lifecycle.py": "027fc66",
    "tools/terminal_tool_result.py": "0006718",
    "tools/environments/base.py": "0006718",
    "tools/interrupt.py": "09ffeae",
    "tools/terminal_tool_config.py": "0a6ef40",
    "tools/file_operations.py": "000429a",
    "tools/delegate_tool_child_run.py": "961e8b6",
}


def _cleanup_env(env, *, force_remove=None):
    """hermes's one teardown path for an environment (tools/terminal_tool_lifecycle.py:84-96@027fc66):
    ``cleanup(force_remove=...)`` only when given and ``cleanup``'s signature takes it,
    else ``cleanup()``; used by cleanup_vm, the idle reaper and the prompt-time probe."""
    if force_remove is not None and "force_remove" in inspect.signature(env.cleanup).parameters:
        env.cleanup(force_remove=force_remove)
    else:
        env.cleanup()


class Hermes:
    """One hermes process as a terminal backend plugin sees it (our code, not hermes's).

    ``persistent`` is hermes's ``terminal.container_persistent`` (default true). With
    it, a CLI process (no gateway session key) keys every task's environment to
    ``"default"``; with it false, a backend declaring
    ``session_isolated_when_nonpersistent`` (berth does) gets one per task id, and a
    sub-agent follows its alias to the parent's (tools/terminal_tool.py:459-506@027fc66).
    ``cwd`` is ``terminal.cwd`` as hermes resolves it for a container backend: a host
    path is replaced by the plugin default ``/root`` (tools/terminal_tool.py:638-639@027fc66,
    tools/terminal_tool.py:642-671@027fc66); ``timeout`` is ``terminal.timeout``, default 180
    (tools/terminal_tool.py:715@027fc66); ``persistent`` defaults to true
    (tools/terminal_tool.py:732@027fc66).
    """

    def __init__(self, provider, *, persistent=True, cwd="/root", timeout=180):
        self.provider = provider
        self.persistent = persistent
        self.config_cwd = cwd
        self.config_timeout = timeout
        self.envs = {}  # _active_environments
        self.aliases = {}  # _container_aliases
        self.session_cwd = {}  # _session_cwd
        self.created = []  # the kwargs of every create_environment call, in order
        self._lock = threading.Lock()
        self._creation = threading.Lock()

    def container_config(self):
        """``container_config`` as hermes builds it for a container backend that is
        not docker: its container keys with the config's values, the docker_* payloads
        emptied (tools/terminal_tool.py:699@027fc66, tools/terminal_tool_backends.py:85@027fc66)."""
        return {
            "container_cpu": 1.0, "container_memory": 5120, "container_disk": 51200,
            "container_persistent": self.persistent, "modal_mode": "auto", "vercel_runtime": "",
            "docker_volumes": [], "docker_mount_cwd_to_workspace": False, "docker_forward_env": [],
            "docker_env": {}, "docker_run_as_host_user": False, "docker_extra_args": [],
            "docker_shm_size": "1g", "docker_network": True, "docker_persist_across_processes": True,
            "docker_shared_container_key": "", "docker_orphan_reaper": True, "docker_snap_compat": False,
        }

    # ---- tools/terminal_tool.py ----

    def register_container_alias(self, child_task_id, parent_task_id):
        """tools/terminal_tool.py:344-350@027fc66: a missing parent aliases to ``"default"``."""
        self.aliases[child_task_id] = str(parent_task_id or "default")

    def resolve(self, task_id):
        """The environment key for a tool call's task id (tools/terminal_tool.py:459-506@027fc66):
        no per-task overrides, no gateway session key (a CLI process)."""
        if task_id and not self.persistent:
            key, seen = task_id, set()
            while key in self.aliases and key not in seen:
                seen.add(key)
                key = self.aliases[key]
            return key
        return "default"

    def create(self, *, task_id, timeout, cwd=None):
        """The factory's plugin branch (tools/terminal_tool_backends.py:251-272@027fc66 →
        tools/terminal_tool_backends.py:223-231@027fc66):
        exactly these five keyword arguments, then the backend-name stamp and
        ``env_type`` set on the object."""
        kwargs = dict(cwd=self.config_cwd if cwd is None else cwd, timeout=timeout, task_id=task_id, image="",
                      container_config=self.container_config())
        env = self.provider.create_environment(**kwargs)
        env._hermes_backend_name = self.provider.name.strip().lower()
        env.env_type = self.provider.name
        self.created.append(kwargs)
        return env

    def acquire(self, task_id, timeout):
        """tools/terminal_tool.py:1093-1137@027fc66: the cached environment of the resolved key (or of the raw
        task id), else one created under the per-task creation lock with the first
        call's effective timeout and the session's cwd (tools/terminal_tool.py:1014-1015@027fc66)."""
        eff = self.resolve(task_id)
        with self._lock:
            env = self.envs.get(eff) or self.envs.get(task_id)
        if env is not None:
            return env, eff
        with self._creation:
            with self._lock:
                env = self.envs.get(eff) or self.envs.get(task_id)
            if env is None:
                env = self.create(task_id=eff, timeout=timeout, cwd=self.command_cwd(task_id))
                with self._lock:
                    self.envs[eff] = env
        return env, eff

    def record_session_cwd(self, key, cwd):
        """tools/terminal_tool.py:253@027fc66."""
        if isinstance(cwd, str) and cwd.strip():
            self.session_cwd[str(key or "default")] = cwd

    def command_cwd(self, session_key):
        """tools/terminal_tool.py:834-862@027fc66: the session's recorded cwd, unless it is a
        host-looking path (``/home/``, ``/Users/``, a drive letter, relative), which a
        container backend cannot use (tools/terminal_tool_config.py:226-240@0a6ef40,
        tools/terminal_tool_config.py:86@0a6ef40): then the plan's default, the config cwd."""
        recorded = self.session_cwd.get(str(session_key or "default"))
        if recorded and (recorded.startswith(("/Users/", "/home/")) or re.match(r"^[A-Za-z]:[\\/]", recorded)
                         or not os.path.isabs(recorded)):
            return self.config_cwd
        return recorded or self.config_cwd

    def terminal(self, command, *, task_id=None, timeout=None):
        """A foreground ``terminal`` tool call: plan, acquire the environment, run it
        with ``execute(command, timeout=..., cwd=<session cwd>, bounded_capture=True)``
        (tools/terminal_tool.py:1175-1179@027fc66; the cwd is the session's record, else the
        plan's: tools/terminal_tool.py:834-862@027fc66), then record the cwd the result reports
        when it says it observed one (tools/terminal_tool_result.py:220@0006718). hermes's result JSON
        is built from the dict returned here."""
        effective_timeout = timeout or self.config_timeout
        env, _ = self.acquire(task_id, effective_timeout)
        session_key = task_id or ""  # no gateway session key: the raw task id (tools/terminal_tool.py:1318@027fc66)
        command_cwd = self.command_cwd(session_key)
        result = env.execute(command, timeout=effective_timeout, cwd=command_cwd, bounded_capture=True)
        if result.get("cwd_observed"):
            self.record_session_cwd(session_key, result.get("cwd") or getattr(env, "cwd", None))
        return result

    def background(self, command, *, task_id=None, log="/tmp/bh-bg.log"):
        """A ``terminal(background=true)`` call (tools/terminal_tool.py:1361@027fc66): on a
        backend that is not local, hermes's process registry starts the command through
        ``execute()`` in a detached wrapper that reports its pid. The wrapper here is
        ours, of that shape."""
        env, _ = self.acquire(task_id, self.config_timeout)
        cwd = self.command_cwd(task_id or "")
        wrapper = "sh -c %s > %s 2>&1 < /dev/null & echo $!" % (shlex.quote(command), shlex.quote(log))
        return env.execute(wrapper, cwd=cwd, timeout=10, rewrite_compound_background=False)

    # ---- tools/file_operations.py (ShellFileOperations) ----

    def file_exec(self, env, command, *, stdin_data=None):
        """``ShellFileOperations._exec`` (tools/file_operations.py:197-213@000429a): ``execute(command, cwd=<live
        env.cwd>, [stdin_data=...])``; the result's ``output`` is the file tools' stdout."""
        kwargs = {}
        if stdin_data is not None:
            kwargs["stdin_data"] = stdin_data
        return env.execute(command, cwd=getattr(env, "cwd", None) or "/", **kwargs)

    # ---- tools/terminal_tool_lifecycle.py ----

    def is_persistent_env(self, task_id):
        """tools/terminal_tool_lifecycle.py:251-263@027fc66: ``_session_scoped`` or
        ``_persistent`` of the active env."""
        with self._lock:
            env = self.envs.get(self.resolve(task_id)) or self.envs.get(task_id)
        if env is None:
            return False
        return bool(getattr(env, "_session_scoped", False) or getattr(env, "_persistent", False))

    def turn_end(self, task_id):
        """The agent loop's per-turn teardown: skip a persistent environment, else
        ``cleanup_vm`` (tools/terminal_tool_lifecycle.py:254@027fc66). Returns what it did."""
        if self.is_persistent_env(task_id):
            return "kept"
        self.cleanup_vm(task_id)
        return "cleaned up"

    def cleanup_vm(self, task_id, *, force_remove=False):
        """tools/terminal_tool_lifecycle.py:291-308@027fc66: unregister the task's environment, then tear it down with
        ``force_remove`` forwarded (False: the session-lifecycle default)."""
        with self._lock:
            env = self.envs.pop(task_id, None)
        if env is not None:
            _cleanup_env(env, force_remove=force_remove)

    # ---- agent/prompt_builder.py ----

    PROBE_CMD = "printf 'os=%s\\ncwd=%s\\n' \"$(uname -s 2>/dev/null || echo unknown)\" \"$(pwd)\""

    def backend_probe(self):
        """The prompt-time backend probe (agent/prompt_builder.py:878-907@0006718): a fresh environment
        for task ``prompt-backend-probe`` with the config's cwd and timeout, one
        ``execute(<probe>, timeout=4)``, then ``_cleanup_env(env, force_remove=True)`` in
        a ``finally``. The probe command here is ours, of the same kind (uname, pwd)."""
        env = self.create(task_id="prompt-backend-probe", timeout=self.config_timeout)
        try:
            return env, env.execute(self.PROBE_CMD, timeout=4)
        finally:
            _cleanup_env(env, force_remove=True)


@pytest.fixture
def run_id():
    return uuid.uuid4().hex[:8]


@pytest.fixture
def hermes(backend, run_id, monkeypatch, daemon):
    """A factory of :class:`Hermes` processes whose sessions are named
    ``local:<run>-{task_id}`` (host) or ``hermes:<run>-{task_id}`` (docker), each with a
    provider of its own; every session of the run is removed afterwards. hermes exports
    ``terminal.cwd`` as ``TERMINAL_CWD``: here a user's project directory on the host,
    under /home as most are."""
    prefix = ("local:" if backend == "local" else "hermes:") + run_id + "-"
    monkeypatch.setenv("BERTH_HERMES_SESSION", prefix + "{task_id}")
    os.makedirs("/home", exist_ok=True)
    project = tempfile.mkdtemp(prefix="bh-project-", dir="/home")
    monkeypatch.setenv("TERMINAL_CWD", project)
    made = []

    def make(**kw):
        h = Hermes(berth_hermes.BerthTerminalProvider(), **kw)
        h.project = str(project)
        h.prefix = prefix
        made.append(h)
        return h

    yield make
    shutil.rmtree(project, ignore_errors=True)
    client = berth.Client()
    for s in client.sessions():
        if s["session"].startswith(prefix):
            try:
                client.session(s["session"]).remove()
            except Exception:
                pass


def _session(prefix, task_id):
    return berth.Client().session(prefix + task_id)


def test_turn(hermes, backend):
    """A turn of hermes's CLI agent with the berth backend.

    1. The first terminal call creates the environment (tools/terminal_tool.py:1093-1137@027fc66,
       tools/terminal_tool.py:1122-1124@027fc66) through the factory's plugin branch
       (tools/terminal_tool_backends.py:265@027fc66, tools/terminal_tool_backends.py:226-227@027fc66):
       ``create_environment(cwd="/root", timeout=180, task_id="default", image="",
       container_config={...})`` — the plugin default cwd (tools/terminal_tool.py:638-639@027fc66),
       ``terminal.timeout``, and ``"default"``, which every task of a CLI process
       resolves to while ``container_persistent`` is true (tools/terminal_tool.py:500@027fc66).
       hermes then stamps ``_hermes_backend_name`` (tools/terminal_tool_backends.py:231@027fc66).
       The keyword-only signature is the provider contract
       (agent/terminal_env_provider.py:193-199@3af739a).
    2. Each command: ``execute(cmd, timeout=180, cwd=<session cwd>, bounded_capture=True)``
       (tools/terminal_tool.py:1175-1179@027fc66). The cwd is the session's record, written from
       a result that says ``cwd_observed`` (tools/terminal_tool_result.py:220@0006718), else "/root";
       a recorded host-looking path (/home/...) is discarded for a container backend
       (tools/terminal_tool.py:834-862@027fc66, tools/terminal_tool.py:855@027fc66). So on a host
       session in a project under /home hermes passes "/root" with every command:
       berth takes hermes's container default as "where the session is" there —
       ``terminal.cwd`` for the first command, its shell state after — never root's
       home. A container session gets hermes's record (/root, then /root/sub).
    3. Turn end: the per-turn teardown skips environments that read as persistent
       (tools/terminal_tool_lifecycle.py:251-263@027fc66); berth's does (``_persistent``), so the session and its
       sandbox stay and the next turn reuses the same object, with no new
       ``create_environment``.
    """
    h = hermes()
    r = h.terminal("pwd")
    want = dict(cwd="/root", timeout=180, task_id="default", image="", container_config=h.container_config())
    assert h.created == [want]
    env = h.envs["default"]
    assert env.session_name == h.prefix + "default" and env._hermes_backend_name == "berth"
    start = h.project if backend == "local" else "/root"
    assert r["returncode"] == 0 and r["output"] == start + "\n", r
    assert r["cwd"] == start and r["cwd_observed"] is True
    assert h.session_cwd["default"] == start  # recorded...
    assert h.command_cwd("") == ("/root" if backend == "local" else start)  # ...but a /home path is not passed

    r = h.terminal("mkdir -p sub && cd sub && export BH_TURN=1")
    assert r["returncode"] == 0 and r["cwd"] == start + "/sub", r
    r = h.terminal("pwd; echo $BH_TURN; echo err >&2; exit 3")
    assert (r["returncode"], r["output"]) == (3, start + "/sub\n1\nerr\n"), r

    assert h.turn_end("default") == "kept"
    assert _session(h.prefix, "default").info()["state"] == "running"
    r = h.terminal("pwd")
    assert r["output"] == start + "/sub\n" and len(h.created) == 1


def test_two_turns(hermes, backend):
    """Two turns, then the task's end, with ``container_persistent: false`` (so the
    plugin gets the task's own id: tools/terminal_tool.py:483@027fc66).

    Turn 1: ``cd`` and ``export`` in one command; a background server started with
    ``terminal(background=true)`` (tools/terminal_tool.py:1361@027fc66: through
    ``execute()``, a detached wrapper). Turn end: kept (tools/terminal_tool_lifecycle.py:251-263@027fc66).
    Turn 2: the cwd hermes passes (its record), the variable (berth's shell state, not
    the Python object) and the server are all still there. Task end: ``cleanup_vm``
    (tools/terminal_tool_lifecycle.py:291-308@027fc66) calls ``cleanup(force_remove=False)``
    (tools/terminal_tool_lifecycle.py:84-96@027fc66): the
    berth session is closed and its rule's ``on_close`` applies — ``stop`` for the
    docker rule here (the server is gone, the files kept), ``keep`` (the default) for
    the host rule (the server still runs; berth leaves it to the rule).
    """
    h = hermes(persistent=False)
    task = "task-" + uuid.uuid4().hex[:6]
    d = "/tmp/bh-two-%s" % uuid.uuid4().hex[:8]
    tag = str(610000 + uuid.uuid4().int % 99999)
    r = h.terminal("mkdir -p %s && cd %s && export BH_TWO=kept && echo hi > file" % (d, d), task_id=task)
    assert r["returncode"] == 0 and r["cwd"] == d, r
    assert [c["task_id"] for c in h.created] == [task]
    r = h.background("exec sleep %s" % tag, task_id=task, log=d + "/bg.log")
    pid = r["output"].strip()
    assert r["returncode"] == 0 and pid.isdigit(), r
    assert h.turn_end(task) == "kept"

    r = h.terminal("pwd; echo $BH_TWO; cat file; kill -0 %s && echo alive" % pid, task_id=task)
    assert r["returncode"] == 0 and r["output"] == "%s\nkept\nhi\nalive\n" % d, r
    assert len(h.created) == 1

    h.cleanup_vm(task)
    assert task not in h.envs
    s = _session(h.prefix, task)
    assert s.info()["state"] == ("stopped" if backend == "docker" else "running")
    # A later task with the same id reaches the same session: the files are kept.
    h2 = hermes(persistent=False)
    r = h2.terminal("cat %s/file; kill -0 %s 2>/dev/null && echo alive || echo gone" % (d, pid), task_id=task)
    assert r["output"] == "hi\n" + ("gone\n" if backend == "docker" else "alive\n"), r
    h2.terminal("kill %s 2>/dev/null; rm -rf %s" % (pid, d), task_id=task)


def test_subagent(hermes, backend):
    """A sub-agent (``delegate_task``) of a parent task, ``container_persistent: false``.

    At spawn hermes seeds the child's cwd record from the parent's and aliases the
    child's task id to the parent's (tools/delegate_tool_child_run.py:624-636@961e8b6,
    tools/delegate_tool_child_run.py:636@961e8b6,
    tools/terminal_tool.py:344-350@027fc66); the child's conversation runs on a worker thread
    with its own task id (tools/delegate_tool_child_run.py:693-694@961e8b6). Its terminal calls resolve that id
    through the alias to the parent's (tools/terminal_tool.py:483@027fc66) and
    find the parent's cached environment (tools/terminal_tool.py:1093-1137@027fc66): hermes never hands the
    plugin the child's task id — ``create_environment`` ran once, with the parent's —
    and the child's commands run in the parent's berth session, starting in the
    parent's cwd. Two children of one batch run side by side on the same object. (With
    ``container_persistent: true`` every id, parent's and child's, resolves to
    ``"default"``: tools/terminal_tool.py:500@027fc66; the same holds.)
    """
    h = hermes(persistent=False)
    parent = "parent-" + uuid.uuid4().hex[:6]
    d = "/tmp/bh-sub-%s" % uuid.uuid4().hex[:8]
    r = h.terminal("mkdir -p %s && cd %s && echo from-parent > note" % (d, d), task_id=parent)
    assert r["returncode"] == 0, r

    children = ["subagent-%d-%s" % (i, uuid.uuid4().hex[:8]) for i in range(2)]
    for child in children:  # the spawn site, per child
        h.record_session_cwd(child, h.session_cwd.get(parent))
        h.register_container_alias(child, parent)
    gate = d + "/both-started"
    out = {}

    def run_child(i, child):
        # The first child waits until the second has run: one call at a time, it could not end.
        cmd = "touch %s.%d; while [ ! -e %s.1 ]; do sleep 0.02; done; pwd; cat note" % (gate, i, gate)
        out[child] = h.terminal(cmd, task_id=child)

    threads = [threading.Thread(target=run_child, args=(i, c)) for i, c in enumerate(children)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for child in children:
        assert out[child]["returncode"] == 0 and out[child]["output"] == "%s\nfrom-parent\n" % d, out[child]
    assert [c["task_id"] for c in h.created] == [parent]
    assert list(h.envs) == [parent]
    for child in children:
        with pytest.raises(berth.NotFound):
            _session(h.prefix, child).info()
    h.terminal("rm -rf %s" % d, task_id=parent)


def test_parallel_file_reads(hermes, backend):
    """hermes runs a batch of read-only tool calls in parallel (``read_file`` is
    parallel-safe: agent/tool_dispatch_helpers.py:34-48@0302e76,
    agent/tool_dispatch_helpers.py:40@0302e76); each reads through
    ``ShellFileOperations._exec`` → ``execute(cmd, cwd=env.cwd)`` (tools/file_operations.py:197-213@000429a), a
    whole file with ``cat <path> 2>/dev/null`` (tools/file_operations.py:225-227@000429a), binary detection with
    ``head -c N <path> | base64`` (tools/file_operations.py:240-250@000429a); writes send the content as
    ``stdin_data`` (tools/file_operations.py:205@000429a). Several at once on one environment: every one
    comes back byte for byte (these files are UTF-8; a binary file's bytes through the
    base64 sample).
    """
    h = hermes()
    h.terminal("true")
    env = h.envs["default"]
    d = "/tmp/bh-read-%s" % uuid.uuid4().hex[:8]
    files = {
        d + "/plain.txt": "line one\nline two\n",
        d + "/no-newline.txt": "no trailing newline",
        d + "/utf8 name.md": "héllo wörld — ✓ 日本語\r\nCRLF line\r\n",
        d + "/big.txt": "".join("%06d the quick brown fox\n" % i for i in range(12000)),
        d + "/empty.txt": "",
    }
    binary = bytes(range(256)) * 4  # made by the test, not by a hermes tool (they write text)
    r = h.file_exec(env, "mkdir -p %s" % d)
    assert r["returncode"] == 0, r
    assert env.session.exec(["sh", "-c", "cat > %s/bin.dat" % d], stdin=binary).exit_code == 0
    for path, content in files.items():  # the write tool: content on stdin
        r = h.file_exec(env, "cat > %s" % shlex.quote(path), stdin_data=content)
        assert r["returncode"] == 0, r

    barrier = threading.Barrier(len(files) + 1)
    got = {}

    def read(path):
        barrier.wait()
        got[path] = h.file_exec(env, "cat %s 2>/dev/null" % shlex.quote(path))

    def sample():
        barrier.wait()
        got["sample"] = h.file_exec(env, "head -c 1000 %s 2>/dev/null | base64" % shlex.quote(d + "/bin.dat"))

    threads = [threading.Thread(target=read, args=(p,)) for p in files] + [threading.Thread(target=sample)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for path, content in files.items():
        assert got[path]["returncode"] == 0 and got[path]["output"] == content, path

    assert base64.b64decode("".join(got["sample"]["output"].split())) == binary[:1000]
    h.terminal("rm -rf %s" % d)


def test_interrupt(hermes, backend, monkeypatch):
    """An interrupt during a long command (``/stop``, a new message): hermes sets the
    interrupt bit of the tool thread running it (tools/interrupt.py:28@09ffeae), and the wait
    loop kills the command when ``is_thread_interrupted(tid)`` of that thread is set,
    returning the output so far plus ``\\n[Command interrupted]`` with 130
    (tools/environments/base.py:397-400@0006718; the tid watched is the thread that called
    ``execute``: tools/environments/base.py:546@0006718, :562; hermes reads 130 as an
    interrupt only with that marker: tools/terminal_tool_result.py:248-251@0006718).

    hermes's tools/interrupt.py cannot be imported here: a stand-in module with its two
    functions (a set of thread idents under a lock; our code) is registered as
    ``tools.interrupt``, and the plugin's own lookup (``_hermes``) resolves it as it
    would hermes's. berth cancels the exec: its whole process tree is gone before
    ``execute`` returns.
    """
    interrupted, lock = set(), threading.Lock()

    def set_interrupt(active, thread_id=None):
        tid = thread_id if thread_id is not None else threading.get_ident()
        with lock:
            (interrupted.add if active else interrupted.discard)(tid)

    def is_thread_interrupted(thread_id):
        with lock:
            return thread_id is not None and thread_id in interrupted

    stand_in = types.ModuleType("tools.interrupt")
    stand_in.set_interrupt, stand_in.is_thread_interrupted = set_interrupt, is_thread_interrupted
    tools_pkg = types.ModuleType("tools")
    tools_pkg.interrupt = stand_in
    monkeypatch.setitem(sys.modules, "tools", tools_pkg)
    monkeypatch.setitem(sys.modules, "tools.interrupt", stand_in)
    monkeypatch.setattr(bh_env, "_is_thread_interrupted", bh_env._hermes("tools.interrupt", "is_thread_interrupted"))
    assert bh_env._is_thread_interrupted is is_thread_interrupted

    h = hermes()
    h.terminal("true")
    tag = str(700000 + uuid.uuid4().int % 99999)
    marker = "/tmp/bh-started-%s" % tag
    out = {}
    cmd = "echo before; touch %s; sleep %s" % (marker, tag)
    tool = threading.Thread(target=lambda: out.setdefault("r", h.terminal(cmd, timeout=600)))
    tool.start()
    peek = _session(h.prefix, "default")
    wait_until("the command to start", lambda: peek.exec(["test", "-e", marker]).exit_code == 0)
    set_interrupt(True, tool.ident)
    try:
        tool.join()
    finally:
        set_interrupt(False, tool.ident)
    r = out["r"]
    assert r["returncode"] == 130 and r["output"] == "before\n\n[Command interrupted]", r
    assert "cwd_observed" not in r  # hermes records no cwd for it
    left = peek.exec(["sh", "-c", "ps -o args | grep '[s]leep %s' || true" % tag])
    assert left.stdout_text == "", "the interrupted command's tree is still there: %r" % left.stdout_text
    peek.exec(["rm", "-f", marker])


def test_backend_probe(hermes, backend):
    """The prompt-time backend probe (agent/prompt_builder.py:878-907@0006718): hermes builds an
    environment for task ``prompt-backend-probe`` with its config's cwd and timeout
    (agent/prompt_builder.py:886-897@0006718, agent/prompt_builder.py:892@0006718), runs one
    probe with ``timeout=4`` (agent/prompt_builder.py:899@0006718) and
    tears it down with ``_cleanup_env(env, force_remove=True)`` (agent/prompt_builder.py:904@0006718,
    tools/terminal_tool_lifecycle.py:84-96@027fc66): berth removes the session and its sandbox, whatever
    ``on_close`` says (``stop`` for the docker rule here), so nothing is left behind.
    A probe that takes more than 4 s (a sandbox started on a busy machine) comes back
    124 and hermes falls back to the provider's ``env_description``; the teardown is
    the same.
    """
    h = hermes()
    env, r = h.backend_probe()
    assert h.created[0]["task_id"] == "prompt-backend-probe" and h.created[0]["cwd"] == "/root"
    assert r["returncode"] in (0, 124), r
    if r["returncode"] == 0:
        assert r["output"].startswith("os=Linux\ncwd="), r
    with pytest.raises(berth.NotFound):
        env.client.session(env.session_name).info()
    assert env.session_name not in [s["session"] for s in env.client.sessions()]
    env.cleanup()  # hermes's BaseEnvironment.__del__ calls cleanup() again: harmless
    with pytest.raises(berth.NotFound):
        env.client.session(env.session_name).info()


def test_turn_end_while_another_process_runs(hermes, backend):
    """Two hermes processes on one task (two gateway workers, or a CLI and a cron run
    with the same task id): each has its own provider and environment object for the
    one berth session. Process B runs a command; meanwhile process A's turn ends. A's
    per-turn teardown finds its environment persistent (tools/terminal_tool_lifecycle.py:251-263@027fc66) and
    leaves it alone, so nothing closes or stops the shared sandbox: B's command is not
    killed and ends normally, released by A's next turn. (Had A's environment not read
    as persistent, A would have called ``cleanup_vm`` → ``cleanup()``
    (tools/terminal_tool_lifecycle.py:291-308@027fc66), closing the session: with ``on_close = "stop"`` that stops the
    sandbox under B.)
    """
    task = "shared-" + uuid.uuid4().hex[:6]
    a, b = hermes(persistent=False), hermes(persistent=False)
    d = "/tmp/bh-two-proc-%s" % uuid.uuid4().hex[:8]
    assert a.terminal("mkdir -p %s" % d, task_id=task)["returncode"] == 0
    out = {}
    runner = threading.Thread(target=lambda: out.setdefault("r", b.terminal(
        "touch %s/started; while [ ! -e %s/go ]; do sleep 0.05; done; echo survived" % (d, d), task_id=task)))
    runner.start()
    peek = _session(a.prefix, task)
    wait_until("B's command to start", lambda: peek.exec(["test", "-e", d + "/started"]).exit_code == 0)
    assert a.turn_end(task) == "kept"
    assert runner.is_alive() and peek.info()["state"] == "running"
    assert a.terminal("touch %s/go" % d, task_id=task)["returncode"] == 0  # A's next turn
    runner.join()
    assert out["r"]["returncode"] == 0 and out["r"]["output"] == "survived\n", out["r"]
    assert a.envs[task] is not b.envs[task] and a.envs[task].session_name == b.envs[task].session_name
    a.terminal("rm -rf %s" % d, task_id=task)
