"""The berth terminal backend for hermes-agent, against a real berth serve: local
sessions on the host, the others each in their own docker sandbox (conftest.py).
Where hermes's own modules could be loaded (hermes_ref.py), the provider is
hermes's TerminalEnvironmentProvider and interrupts go through hermes's
tools.interrupt; the tests that need them say so when they are missing."""

import os
import threading
import uuid

import pytest

import berth
import berth_hermes
from berth_hermes import environment as bh_env
from conftest import HERMES


def need_hermes(module: str) -> None:
    if HERMES.get(module) != "ok":
        pytest.skip("hermes's %s is not loaded here: %s" % (module, HERMES.get(module)))


def wait_until(what: str, cond, limit: float = 120.0) -> None:
    """Wait until cond() is true, checking on an event's timed wait (a condition, not
    a fixed sleep); fail after limit seconds, naming what."""
    ev = threading.Event()
    waited = 0.0
    while not cond():
        if waited >= limit:
            pytest.fail("timed out after %ss waiting for %s" % (limit, what))
        ev.wait(0.05)
        waited += 0.05


# ---- hermes's contract ----


def test_provider_is_hermes_provider(daemon):
    need_hermes("agent.terminal_env_provider")
    from agent.terminal_env_provider import TerminalEnvironmentProvider

    p = berth_hermes.BerthTerminalProvider()
    assert isinstance(p, TerminalEnvironmentProvider)
    assert p.name == "berth" and p.is_available()
    assert p.probe() == ("ready", "")
    assert p.skip_container_guards is False  # berth may run a session on the host
    assert p.session_isolated_when_nonpersistent is True
    assert {"BERTH_HOST", "BERTH_TOKEN_FILE"} <= p.strip_env_keys
    schema = p.validated_config_schema()  # hermes's own schema checks
    assert schema["session_pattern"]["type"] == "string"
    ok = p.doctor_checks()
    assert ok[0][0] is True


def test_register_through_plugin_context(daemon):
    """register(ctx) calls ctx.register_terminal_environment_provider with a
    provider hermes's PluginContext accepts (it checks isinstance against
    TerminalEnvironmentProvider and reads provider.name; hermes_cli/plugins.py
    itself is not loaded here)."""
    got = []

    class Ctx:
        def register_terminal_environment_provider(self, provider):
            got.append(provider)

    berth_hermes.register(Ctx())
    assert len(got) == 1 and got[0].name.strip().lower() == "berth"
    if HERMES.get("agent.terminal_env_provider") == "ok":
        from agent.terminal_env_provider import TerminalEnvironmentProvider

        assert isinstance(got[0], TerminalEnvironmentProvider)


def test_unavailable_without_daemon(monkeypatch, tmp_path):
    monkeypatch.setenv("BERTH_HOST", "unix://%s/none.sock" % tmp_path)
    p = berth_hermes.BerthTerminalProvider()
    assert p.is_available()  # BERTH_HOST set: is_available makes no call
    monkeypatch.delenv("BERTH_HOST")
    monkeypatch.setenv("BERTH_STATE_DIR", str(tmp_path))
    assert not p.is_available() and p.probe()[0] == "needs_setup"
    monkeypatch.setenv("BERTH_HOST", "unix://%s/none.sock" % tmp_path)
    env = p.create_environment(cwd="", timeout=10, task_id="x")
    with pytest.raises(Exception) as ei:
        env.execute("true")
    assert isinstance(ei.value, (berth.Unavailable, RuntimeError))
    assert "none.sock" in str(ei.value) and "berth serve" in str(ei.value)


def test_session_names():
    assert bh_env.session_name("hermes:{task_id}", "abc") == "hermes:abc"
    assert bh_env.session_name("hermes:{task_id}", None) == "hermes:default"
    with pytest.raises(ValueError, match="must contain"):
        bh_env.session_name("fixed", "x")
    with pytest.raises(ValueError, match="only {task_id}"):
        bh_env.session_name("{task_id}:{other}", "x")


def test_bad_session_name(provider):
    env = provider.create_environment(cwd="", timeout=10, task_id="bad name")
    with pytest.raises(berth.Invalid) as ei:
        env.execute("true")
    assert "bad name" in str(ei.value)


# ---- commands ----


def test_cwd_and_exports_persist(env):
    r = env.execute("cd /tmp && export BH_FOO=bar")
    assert r["returncode"] == 0, r
    r = env.execute("pwd; echo $BH_FOO")
    assert r["output"] == "/tmp\nbar\n" and r["returncode"] == 0
    assert r["cwd"] == "/tmp" and env.cwd == "/tmp"


def test_initial_cwd(provider, task_id, backend, tmp_path):
    start = str(tmp_path) if backend == "local" else "/etc"
    env = provider.create_environment(cwd=start, timeout=30, task_id=task_id)
    try:
        assert env.execute("pwd")["output"] == start + "\n"
        env.execute("cd /")
        assert env.execute("pwd")["output"] == "/\n"  # the start dir is for the first command only
        r = env.execute("pwd", cwd="/does/not/exist")
        assert r["returncode"] == 126, r  # as hermes's wrapper: cd ... || exit 126
    finally:
        env.session.remove()


def test_host_session_starts_in_project_dir(provider, task_id, backend, tmp_path, monkeypatch):
    """hermes gives a plugin backend a container's cwd (it treats every plugin as a
    container and rewrites host paths: tools/terminal_tool_config.py
    ``_is_unusable_container_cwd``, hermes-agent 0a6ef40), e.g. /root. A session
    that berth's config runs on the host starts in hermes's terminal.cwd, the
    user's project directory, instead; a container session keeps hermes's cwd.

    hermes's terminal tool passes that default as the call's cwd too, whenever it
    has no usable record of the session's cwd (on the first call, and after any
    host path, which it discards: test_replay.py's test_turn): on the host that
    default means where the session is, never root's home."""
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    monkeypatch.setenv("TERMINAL_CWD", str(project))  # hermes exports terminal.cwd so
    env = provider.create_environment(cwd="/root", timeout=30, task_id=task_id)
    try:
        got = env.execute("pwd", cwd="/root")["output"].strip()
        if backend == "local":
            assert got == str(project)
            assert env.execute("cd sub", cwd="/root")["returncode"] == 0
            assert env.execute("pwd", cwd="/root")["output"] == str(project / "sub") + "\n"
            assert env.execute("pwd", cwd="/tmp")["output"] == "/tmp\n"  # any other cwd is hermes's own
        else:
            assert got == "/root"  # hermes's container default
    finally:
        env.session.remove()


def test_merged_output_and_exit_code(env):
    r = env.execute("echo out; echo err >&2; echo out2; exit 3")
    assert r["returncode"] == 3
    assert r["output"] == "out\nerr\nout2\n"


def test_stdin(env):
    r = env.execute("cat; echo; wc -c", stdin_data="hello\nworld")
    assert r["output"].startswith("hello\nworld\n"), r
    big = "x" * (5 << 20)
    r = env.execute("wc -c", stdin_data=big)
    assert r["output"].strip() == str(len(big))


def test_timeout_keeps_partial_output(env):
    r = env.execute("echo partial; sleep 600", timeout=10)
    assert r["returncode"] == 124, r
    assert r["output"] == "partial\n\n[Command timed out after 10s]"
    r = env.execute("sleep 600", timeout=5)
    assert r["output"] == "[Command timed out after 5s]"  # no leading newline without output


def test_calls_of_one_session_side_by_side(env):
    """hermes runs read-only tools in parallel and sub-agents share a session
    (tools/terminal_tool.py at hermes-agent 027fc66 keys both to one environment):
    calls of one session run side by side. The first waits for a file only the
    second makes; one call at a time, it would time out (124) with nothing run."""
    d = "/tmp/bh-side-%s" % uuid.uuid4().hex[:8]
    env.execute("mkdir -p %s" % d)
    got = {}

    def first():
        got["first"] = env.execute("while [ ! -e %s/go ]; do sleep 0.02; done; echo first" % d, timeout=120)

    t = threading.Thread(target=first)
    t.start()
    r = env.execute("touch %s/go; echo second" % d, timeout=120)
    t.join()
    assert r["returncode"] == 0 and r["output"] == "second\n", r
    assert got["first"]["returncode"] == 0 and got["first"]["output"] == "first\n", got["first"]
    env.execute("rm -rf %s" % d)


def test_detached_children_outlive_the_call(env):
    tag = str(600000 + uuid.uuid4().int % 99999)
    # A child holding stdout (hermes #8340 hung on this) and one fully detached.
    r = env.execute("sleep %s & (sleep %s1 >/dev/null 2>&1 &) ; echo started" % (tag, tag), timeout=60)
    assert r["returncode"] == 0 and r["output"] == "started\n", r
    r = env.execute("ps -o pid,args | grep '[s]leep %s'" % tag)
    assert ("sleep %s\n" % tag) in r["output"] and ("sleep %s1" % tag) in r["output"], r["output"]
    env.execute("pkill -f 'sleep %s' || true" % tag)


def test_interrupt_kills_the_tree(env, backend, tmp_path):
    need_hermes("tools.interrupt")
    from tools.interrupt import set_interrupt

    tag = str(700000 + uuid.uuid4().int % 99999)
    marker = "/tmp/bh-started-%s" % tag
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", env.execute("echo before; touch %s; sleep %s" % (marker, tag), timeout=600)))
    t.start()
    peek = env.client.session(env.session_name)
    wait_until("the command to start", lambda: peek.exec(["test", "-e", marker]).exit_code == 0)
    set_interrupt(True, t.ident)
    try:
        t.join()
    finally:
        set_interrupt(False, t.ident)
    r = out["r"]
    peek.exec(["rm", "-f", marker])
    assert r["returncode"] == 130 and r["output"] == "before\n\n[Command interrupted]", r
    left = peek.exec(["sh", "-c", "ps -o args | grep '[s]leep %s' || true" % tag])
    assert left.stdout_text == "", "the interrupted command's tree is still there: %r" % left.stdout_text


def test_binary_output(env):
    r = env.execute("printf 'a\\377\\376b\\n'")
    assert r["output"] == "a\ufffd\ufffdb\n"


def test_bounded_capture_names_spill_files(provider, task_id, daemon):
    """A bounded capture is what hermes's own gives (tools/environments/base_output.py
    at hermes-agent 0294b43: ``_BoundedOutputCollector.render``, 40/60 head and tail
    around a notice, within the window; ``_finalize_wait_result``:
    ``output_total_chars`` and ``full_output_path`` when output was left out), so
    hermes cuts nothing more and can point the model at the whole output."""
    env = provider.create_environment(cwd="", timeout=60, task_id=task_id, backend_config={"bounded_output": 4096})
    whole = "".join("%d\n" % i for i in range(1, 200001))
    try:
        r = env.execute("seq 1 200000", bounded_capture=True)
        assert r["returncode"] == 0
        out = r["output"]
        assert out.startswith("1\n2\n") and out.endswith("199999\n200000\n")
        assert len(out) <= 4096 and "[OUTPUT TRUNCATED - " in out and "out of {:,} total]".format(len(whole)) in out
        assert r["output_total_chars"] == len(whole)
        with open(r["full_output_path"]) as f:
            assert f.read() == whole
        small = env.execute("echo small", bounded_capture=True)  # within the window: whole, no path
        assert small["output"] == "small\n" and "full_output_path" not in small
        full = env.execute("seq 1 200000")  # hermes's default: full fidelity
        assert full["output"] == "".join("%d\n" % i for i in range(1, 200001))
    finally:
        env.session.remove()


def test_forwarded_and_literal_env(provider, task_id, monkeypatch):
    monkeypatch.setenv("BH_SECRET", "s3cret")
    cc = {"docker_forward_env": ["BH_SECRET", "BH_UNSET"], "docker_env": {"BH_LIT": "1"}}
    env = provider.create_environment(cwd="", timeout=30, task_id=task_id, container_config=cc, future_key=1)
    try:
        r = env.execute("echo $BH_SECRET $BH_LIT ${BH_UNSET-unset} $AI_AGENT")
        assert r["output"] == "s3cret 1 unset hermes-agent\n"
    finally:
        env.session.remove()


def test_config_from_hermes_home(backend, task_id, monkeypatch, tmp_path):
    """hermes hands a plugin neither its terminal.backends.berth block nor, for a
    backend other than docker, docker_forward_env and docker_env: its
    _build_plugin_env passes cwd, timeout, task_id, image and container_config only,
    and _get_env_config empties the docker keys (tools/terminal_tool_backends.py,
    hermes-agent 027fc66). So the provider reads them from hermes's config.yaml, as
    hermes's own create_environment call below gives them (no backend_config)."""
    import yaml

    import berth_hermes
    from berth_hermes import provider as bh_provider

    home = tmp_path / "hermes-home"
    home.mkdir()
    pattern = ("local:cfg-{task_id}" if backend == "local" else "hermes:cfg-{task_id}")
    (home / "config.yaml").write_text(yaml.safe_dump({"terminal": {
        "backend": "berth",
        "docker_forward_env": ["BH_FROM_YAML"],
        "docker_env": {"BH_LIT_YAML": "2"},
        "backends": {"berth": {"session_pattern": pattern, "bounded_output": 1000}},
    }}))
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.delenv("BERTH_HERMES_SESSION", raising=False)
    monkeypatch.setenv("BH_FROM_YAML", "forwarded")
    monkeypatch.setattr(bh_provider, "_get_hermes_home", None)  # hermes absent here: $HERMES_HOME
    p = berth_hermes.BerthTerminalProvider()
    # The call hermes makes (_build_plugin_env): container_config as _get_env_config
    # leaves it for a plugin backend, the docker keys empty.
    env = p.create_environment(cwd="", timeout=30, task_id=task_id, image="",
                               container_config={"docker_forward_env": [], "docker_env": {}})
    try:
        assert env.session_name == pattern.format(task_id=task_id)
        assert env.bounded_output == 1000
        r = env.execute("echo $BH_FROM_YAML $BH_LIT_YAML")
        assert r["output"] == "forwarded 2\n", r
    finally:
        env.session.remove()
    # A config that does not parse: defaults, and a warning (never half a config).
    (home / "config.yaml").write_text("terminal: [unclosed\n")
    assert bh_provider.hermes_terminal_config() == {}


def test_cleanup_applies_on_close(env, backend):
    kept = "/tmp/bh-kept-" + uuid.uuid4().hex[:8]
    env.execute("echo hi > " + kept)
    env.cleanup()
    env.cleanup()  # idempotent
    state = env.client.session(env.session_name).info()["state"]
    # docker sessions: on_close = "stop"; local:* sessions: the default, keep.
    assert state == ("stopped" if backend == "docker" else "running"), state
    r = env.execute("cat %s; rm %s" % (kept, kept))  # the next command starts it again, files kept
    assert r["output"] == "hi\n" and r["returncode"] == 0


def test_persistent_across_turns(env, backend):
    """hermes skips the end-of-turn teardown of an environment that reads as
    persistent (tools/terminal_tool_lifecycle.py ``is_persistent_env`` at
    hermes-agent 027fc66: ``_session_scoped`` or ``_persistent``), so a background
    server started in one turn still runs in the next; on_close applies only when
    hermes ends the task (cleanup)."""
    assert bool(getattr(env, "_session_scoped", False) or getattr(env, "_persistent", False))
    r = env.execute("sleep 600 >/dev/null 2>&1 & echo $!")
    pid = r["output"].strip()
    assert r["returncode"] == 0 and pid.isdigit(), r
    # The next turn: the same environment object, no cleanup in between.
    assert env.execute("kill -0 %s && echo alive" % pid)["output"] == "alive\n"
    env.execute("kill %s" % pid)


def test_cleanup_force_remove(env, backend):
    """hermes forwards force_remove only to a cleanup whose signature takes it
    (tools/terminal_tool_lifecycle.py ``_cleanup_env``, hermes-agent 027fc66); with
    it the sandbox goes, whatever on_close says (the prompt probe left a stopped
    hermes:prompt-backend-probe before)."""
    import inspect

    env.execute("true")
    assert "force_remove" in inspect.signature(env.cleanup).parameters
    env.cleanup()  # the task ends: on_close (stop on docker, keep on local)
    env.cleanup(force_remove=True)  # a user's teardown after it still removes
    with pytest.raises(berth.NotFound):
        env.client.session(env.session_name).info()


def test_per_session_sandboxes(provider, backend):
    if backend == "local":
        pytest.skip("local sessions share the host filesystem by design")
    a = provider.create_environment(cwd="", timeout=30, task_id="iso-a-" + uuid.uuid4().hex[:6])
    b = provider.create_environment(cwd="", timeout=30, task_id="iso-b-" + uuid.uuid4().hex[:6])
    try:
        a.execute("echo a > /tmp/mine")
        assert b.execute("cat /tmp/mine")["returncode"] != 0
        assert a.session.info()["sandbox"] != b.session.info()["sandbox"]
    finally:
        a.session.remove()
        b.session.remove()


def test_daemon_restart_keeps_cwd(daemon, provider, task_id):
    env = provider.create_environment(cwd="", timeout=30, task_id=task_id)
    try:
        env.execute("cd /tmp")
        daemon.stop()
        daemon.start()
        r = env.execute("pwd")
        assert r["output"] == "/tmp\n" and r["returncode"] == 0
    finally:
        env.session.remove()


def test_default_session():
    assert bh_env.session_name("hermes:{task_id}", "default", "main") == "main"
    assert bh_env.session_name("hermes:{task_id}", None, "main") == "main"
    assert bh_env.session_name("hermes:{task_id}", "sub-1", "main") == "hermes:sub-1"
    p = berth_hermes.BerthTerminalProvider()
    e = p.create_environment(cwd="", timeout=5, backend_config={"default_session": "main"})
    assert e.session_name == "main"


def test_is_hermes_base_environment(env, tmp_path):
    """With hermes's tools/environments/base.py loaded, the environment is a
    BaseEnvironment, and hermes's own helpers built on execute() work through it:
    fetch_file (base64 over the exec channel) and fetch_realpath."""
    need_hermes("tools.environments.base")
    from tools.environments.base import BaseEnvironment, FileFetchError

    assert isinstance(env, BaseEnvironment)
    d = "/tmp/bh-f-" + uuid.uuid4().hex[:8]
    env.execute("mkdir -p %s && printf 'a\\nb\\0c' > %s/data && ln -sf %s/data %s/link" % (d, d, d, d))
    try:
        dest = tmp_path / "got"
        env.fetch_file(d + "/data", dest, max_bytes=1 << 20)
        assert dest.read_bytes() == b"a\nb\0c"
        assert env.fetch_realpath(d + "/link") == d + "/data"
        with pytest.raises(FileFetchError):
            env.fetch_file(d + "/missing", dest, max_bytes=1 << 20)
        with pytest.raises(FileFetchError, match="exceeds"):
            env.fetch_file(d + "/data", dest, max_bytes=2)
    finally:
        env.execute("rm -rf " + d)


def test_connection_error_is_hermes_kind(monkeypatch, tmp_path):
    need_hermes("tools.environments.base")
    from tools.environments.base import EnvironmentConnectionError

    monkeypatch.setenv("BERTH_HOST", "unix://%s/none.sock" % tmp_path)
    env = berth_hermes.BerthTerminalProvider().create_environment(cwd="", timeout=10, task_id="x")
    with pytest.raises(EnvironmentConnectionError, match="none.sock"):
        env.execute("true")
