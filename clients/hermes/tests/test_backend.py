"""The berth terminal backend for hermes-agent, against a real berth serve: local
sessions on the host, the others each in their own docker sandbox (conftest.py).
These test the plugin's own behaviour through its public methods; hermes's call
sequences (turns, sub-agents, parallel reads, interrupts, the backend probe, task
end) are replayed in test_replay.py."""

import threading
import uuid

import pytest

import berth
import berth_hermes
from berth_hermes import environment as bh_env


# ---- hermes's contract ----


def test_provider_attributes(daemon):
    """The classification and status hermes reads off a provider
    (agent/terminal_env_provider.py at hermes-agent 3af739a)."""
    p = berth_hermes.BerthTerminalProvider()
    assert p.name == "berth" and p.is_available()
    assert p.probe() == ("ready", "")
    assert p.is_remote is True and p.is_container is True
    assert p.skip_container_guards is False  # berth may run a session on the host
    assert p.session_isolated_when_nonpersistent is True
    assert p.cache_path_base is None
    assert {"BERTH_HOST", "BERTH_TOKEN_FILE"} <= p.strip_env_keys
    schema = p.get_config_schema()
    assert schema["session_pattern"]["type"] == "string"
    assert all(e["type"] in {"boolean", "list", "number", "secret", "select", "string", "text"} for e in schema.values())
    assert p.resolve_config({})["session_pattern"] == "hermes:{task_id}"


def test_register_through_plugin_context(daemon):
    """register(ctx) calls ctx.register_terminal_environment_provider with the
    provider (hermes's PluginContext reads provider.name)."""
    got = []

    class Ctx:
        def register_terminal_environment_provider(self, provider):
            got.append(provider)

    berth_hermes.register(Ctx())
    assert len(got) == 1 and got[0].name.strip().lower() == "berth"


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


def test_per_session_sandboxes(provider, backend):
    """Each docker session (task) has a sandbox of its own; local sessions share the
    host's filesystem by design (berth's local driver)."""
    a = provider.create_environment(cwd="", timeout=30, task_id="iso-a-" + uuid.uuid4().hex[:6])
    b = provider.create_environment(cwd="", timeout=30, task_id="iso-b-" + uuid.uuid4().hex[:6])
    mine = "/tmp/bh-mine-" + uuid.uuid4().hex[:8]
    try:
        a.execute("echo a > " + mine)
        r = b.execute("cat " + mine)
        if backend == "local":
            assert r["returncode"] == 0 and r["output"] == "a\n", r
        else:
            assert r["returncode"] != 0
            assert a.session.info()["sandbox"] != b.session.info()["sandbox"]
    finally:
        a.execute("rm -f " + mine)
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
