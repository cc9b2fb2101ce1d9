"""The SDK against a real berth serve (see conftest.py), on local and docker."""

import hashlib
import io
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import berth
from conftest import SDK, TREE, WAIT, Daemon, wait_for


def test_done_when(daemon, backend):
    """The issue's done-when line, as a user runs it, with berth serve running."""
    name = "%s:1" % backend[0]
    code = 'import berth; s = berth.Client().session(%r); s.shell("cd /tmp"); print(s.shell("pwd").stdout)' % name
    env = dict(daemon.env, PYTHONPATH=os.path.join(SDK, "src"))
    p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=WAIT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().strip() == "/tmp"
    daemon.client().session(name).remove()


def test_exec_result(session, backend):
    r = session.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.ok) == (3, b"out\n", b"err\n", False, False)
    assert r.stdout_text == "out\n" and isinstance(r.stdout, bytes)
    assert r.driver == backend and r.session == session.name and r.sandbox
    ok = session.exec(["true"])
    assert ok.ok and ok.exit_code == 0 and not ok.truncated and ok.spill is None
    nf = session.exec(["no-such-program-xyz"])
    assert nf.exit_code == 127 and b"no-such-program-xyz" in nf.stderr


def test_connection_kept_with_answer_end_pending(session):
    """An exec returns at its result: the end of the answer (which the daemon sends
    once it has the request body's end) is read by the pool when it next hands the
    connection out, and the next calls use that same connection."""
    pool = session.client._pool
    session.exec(["true"])
    assert len(pool._idle) == 1
    kept = pool._idle[0]
    fd = kept.sock.fileno()
    assert kept.pending is not None
    for i in range(5):
        r = session.exec(["sh", "-c", "echo %d" % i])
        assert r.stdout == b"%d\n" % i
        assert len(pool._idle) == 1 and pool._idle[0] is kept and kept.sock.fileno() == fd
    assert session.shell("echo shell").stdout == b"shell\n"
    assert pool._idle == [kept] and kept.reused


def test_shell_state(session):
    r = session.shell("mkdir -p /tmp/sdk-sh && cd /tmp/sdk-sh && export GREETING=hi")
    assert r.ok and r.cwd == "/tmp/sdk-sh"
    r = session.shell('printf "%s from %s\\n" "$GREETING" "$(pwd)"')
    assert r.stdout == b"hi from /tmp/sdk-sh\n"
    assert session.shell("exit 7").exit_code == 7
    assert session.shell("pwd").stdout_text == "/tmp/sdk-sh\n"


def test_env_cwd_stdin(session):
    r = session.exec(["sh", "-c", 'echo "$A-$B"; pwd'], env={"A": "x", "B": 2}, cwd="/tmp")
    assert r.stdout == b"x-2\n/tmp\n"
    assert session.shell("echo $C", env={"C": "per-call"}).stdout == b"per-call\n"
    assert session.exec(["cat"], stdin="text in").stdout == b"text in"
    assert session.exec(["cat"]).stdout == b""  # no stdin: EOF at once
    with pytest.raises(berth.Invalid) as e:
        session.exec(["true"], cwd="/no/such/dir")
    assert "/no/such/dir" in e.value.message
    with pytest.raises(berth.Invalid):
        session.exec(["true"], env={"A=B": "x"})
    with pytest.raises(berth.Invalid):
        session.exec("echo hi")  # a str, not argv


def test_streaming_order(session):
    """Output comes as the command writes it: the command prints, then waits for a
    line that the test sends only once it has seen that output, then prints on
    stderr, then on stdout."""
    r, w = os.pipe()
    rf = os.fdopen(r, "rb", buffering=0)
    wf = os.fdopen(w, "wb", buffering=0)
    got = []
    try:
        for ev in session.stream(["sh", "-c", "echo one; read x; echo two-$x >&2; read y; echo three-$y"], stdin=rf):
            got.append((ev.kind, ev.data))
            if ev.kind == "stdout" and ev.data == b"one\n":
                wf.write(b"A\n")
            elif ev.kind == "stderr":
                wf.write(b"B\n")
                wf.close()
    finally:
        if not wf.closed:
            wf.close()
        rf.close()
    kinds = [k for k, _ in got]
    assert kinds[0] == "started" and kinds[-1] == "exit"
    assert [d for k, d in got if k in ("stdout", "stderr")] == [b"one\n", b"two-A\n", b"three-B\n"]
    assert [k for k in kinds if k in ("stdout", "stderr")] == ["stdout", "stderr", "stdout"]
    assert got[-1] == ("exit", b"")


def test_jobs(session):
    j = session.jobs.start(shell="echo start; read never")  # waits on stdin forever
    assert j.running and j.id
    assert any(x.id == j.id for x in session.jobs.list())
    wait_for("the job's first line", lambda: session.jobs.logs(j).data == b"start\n")
    session.jobs.kill(j)
    (ended,) = [x for x in session.jobs.list() if x.id == j.id]
    assert not ended.running
    done = session.jobs.start(["sh", "-c", "echo a; echo b; exit 4"])
    logs = session.jobs.logs(done, follow=True)
    assert logs.data == b"a\nb\n" and logs.ended and logs.exit_code == 4 and logs.offset == 4
    assert session.jobs.logs(done, offset=2, follow=True).data == b"b\n"
    with pytest.raises(berth.NotFound):
        session.jobs.kill("999999")


def test_files(session, tmp_path):
    session.write_file("/tmp/sdk-a.bin", bytes(range(256)), mode=0o600)
    assert session.read_file("/tmp/sdk-a.bin") == bytes(range(256))
    assert session.exec(["stat", "-c", "%a", "/tmp/sdk-a.bin"]).stdout == b"600\n"
    with pytest.raises(berth.NotFound):
        session.read_file("/tmp/sdk-no-such")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_bytes(b"F" * 100000)
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    os.symlink("d/f.txt", src / "link")
    got = session.upload(src, "/tmp/sdk-up")
    assert got["entries"] == 5 and got["bytes"] == 100000 + len("#!/bin/sh\necho ran\n")
    assert session.exec(["/tmp/sdk-up/run.sh"]).stdout == b"ran\n"
    assert session.exec(["readlink", "/tmp/sdk-up/link"]).stdout == b"d/f.txt\n"
    out = tmp_path / "out"
    session.download("/tmp/sdk-up", out)
    assert (out / "d" / "f.txt").read_bytes() == b"F" * 100000
    assert os.readlink(out / "link") == "d/f.txt"
    assert stat.S_IMODE(os.stat(out / "run.sh").st_mode) == 0o755
    session.download("/tmp/sdk-a.bin", tmp_path / "one.bin")
    assert (tmp_path / "one.bin").read_bytes() == bytes(range(256))
    # a FIFO is refused before anything is sent
    os.mkfifo(src / "fifo")
    with pytest.raises(berth.Invalid) as e:
        session.upload(src, "/tmp/sdk-up2")
    assert "fifo" in e.value.message
    assert session.exec(["test", "-e", "/tmp/sdk-up2"]).exit_code == 1


def test_hostile_download(session, tmp_path):
    """A symlink in the sandbox that points out of the copy is refused, nothing written."""
    session.exec(["sh", "-c", "rm -rf /tmp/sdk-evil && mkdir -p /tmp/sdk-evil && ln -s /etc /tmp/sdk-evil/out"])
    with pytest.raises(berth.Invalid) as e:
        session.download("/tmp/sdk-evil", tmp_path / "evil")
    assert "outside the copy" in e.value.message
    assert os.listdir(tmp_path) == []


def test_close_remove(client, backend):
    s = client.session("%s:close-remove" % backend[0])
    s.exec(["true"])
    assert s.info()["state"] == "running"
    assert any(x["session"] == s.name for x in client.sessions())
    s.stop()
    assert s.info()["state"] == "stopped"
    assert s.exec(["echo", "back"]).stdout == b"back\n"  # a stopped sandbox starts again
    s.close()  # the default rule keeps it
    s.remove()
    with pytest.raises(berth.NotFound):
        s.info()
    assert not any(x["session"] == s.name for x in client.sessions())
    s.remove()  # idempotent


# ---- bad input and faults ----


def test_daemon_not_running(tmp_path):
    c = berth.Client(state_dir=str(tmp_path))
    with pytest.raises(berth.Unavailable) as e:
        c.session("l:1").exec(["true"])
    sock = os.path.join(str(tmp_path), "berth.sock")
    assert sock in e.value.message and "berth serve" in e.value.message and e.value.status == 0
    # a socket that a dead daemon left behind: nobody listens
    import socket as so

    s = so.socket(so.AF_UNIX)
    s.bind(sock)
    s.close()
    with pytest.raises(berth.Unavailable) as e:
        c.status()
    assert "refused" in e.value.message.lower() and sock in e.value.message


def test_invalid_session_name(client):
    for bad in ["bad name", "a/../b", "/lead", "x" * 129, "tab\tname"]:
        with pytest.raises(berth.Invalid) as e:
            client.session(bad).exec(["true"])
        assert repr(bad)[1:-1][:20] in e.value.message or bad[:20] in e.value.message, e.value.message
        assert e.value.status == 400 and e.value.kind == "invalid"
    for bad in ["", ".", ".."]:
        with pytest.raises(berth.Invalid):
            client.session(bad).exec(["true"])
    with pytest.raises(berth.Unsupported):
        client.session("l:1", owner="someone")


def test_errors_are_builtins(client, tmp_path):
    """A caller that knows nothing of berth catches its errors as Python's own:
    the daemon's answers (404 NotFound as LookupError, 400 Invalid as ValueError)
    and the client's (no daemon: Unavailable as ConnectionError)."""
    with pytest.raises(LookupError) as e:
        client.session("l:errors-builtin").jobs.kill("no-such-job")
    assert isinstance(e.value, berth.NotFound) and e.value.status == 404
    with pytest.raises(ValueError) as e:
        client.session("bad name").exec(["true"])
    assert isinstance(e.value, berth.Invalid) and e.value.status == 400
    with pytest.raises(ConnectionError) as e:
        berth.Client(state_dir=str(tmp_path)).status()
    assert isinstance(e.value, berth.Unavailable) and str(tmp_path) in str(e.value)
    assert issubclass(berth.Timeout, TimeoutError) and issubclass(berth.Unauthorized, PermissionError)
    assert issubclass(berth.ShuttingDown, ConnectionError) and issubclass(berth.DriverCrashed, berth.Unavailable)
    client.session("l:errors-builtin").remove()


def test_typed_results(client, session, backend):
    """Sessions, status, drivers and jobs are typed (attributes, dataclasses) and
    still read as the dicts they were: today's callers keep working."""
    import dataclasses

    session.exec(["true"])
    (row,) = [r for r in client.sessions() if r.session == session.name]
    assert isinstance(row, berth.SessionInfo) and dataclasses.is_dataclass(row)
    assert row.driver == backend and row.state == "running" and row.sandbox and row.created
    assert row["state"] == row.state and row.get("no-such-key") is None and "session" in row
    assert dict(row) == row.raw and row.raw["sandbox"] == row.sandbox
    st = client.status()
    assert isinstance(st, berth.Status) and st.api == "v1" and st.pid == st["pid"] > 0 and st.state_dir
    drivers = {d.name: d for d in client.drivers()}
    assert isinstance(drivers["local"], berth.DriverInfo) and drivers["local"].health == "ok"
    assert drivers["local"]["capabilities"] == drivers["local"].capabilities and drivers["local"].capabilities
    job = session.jobs.start(["sleep", "600"])
    assert isinstance(job, berth.Job) and job["id"] == job.id and job.running and job.ended is None
    (listed,) = [j for j in session.jobs.list() if j.id == job.id]
    assert listed.argv == ["sleep", "600"] and listed["argv"] == listed.argv
    session.jobs.kill(job)
    assert "raw" not in repr(listed) and job.id in repr(listed)


def test_check(session):
    """check=True raises as subprocess.run(check=True) does: a CalledProcessError
    (berth.CommandFailed) with the exit code, the command, the output and the result."""
    assert session.exec(["true"], check=True).ok
    with pytest.raises(subprocess.CalledProcessError) as e:
        session.exec(["sh", "-c", "echo out; echo err >&2; exit 3"], check=True)
    err = e.value
    assert isinstance(err, berth.CommandFailed) and isinstance(err, berth.Error)
    assert (err.returncode, err.cmd, err.stdout, err.output, err.stderr) == (3, ["sh", "-c", "echo out; echo err >&2; exit 3"], b"out\n", b"out\n", b"err\n")
    assert err.result.exit_code == 3 and session.name in str(err) and "exited with 3" in str(err)
    with pytest.raises(berth.CommandFailed) as e:
        session.shell("exit 7", check=True)
    assert e.value.returncode == 7 and e.value.cmd == "exit 7"
    with pytest.raises(berth.CommandFailed) as e:
        session.exec(["sleep", "600"], timeout=1, check=True)
    assert e.value.result.timed_out and "timed out" in str(e.value)


def test_timeout(session):
    r = session.exec(["sh", "-c", "echo partial; exec sleep 600"], timeout=1)
    assert r.timed_out and r.exit_code == 143 and r.stdout == b"partial\n" and not r.ok
    r = session.shell("echo partial-sh; sleep 600", timeout=1)
    assert r.timed_out and r.exit_code == 143 and r.stdout == b"partial-sh\n"
    with pytest.raises(berth.Invalid):
        session.exec(["true"], timeout=0)


def test_huge_output(session):
    r = session.shell("seq 1 2000000")  # 14,888,896 bytes
    assert r.truncated and r.stdout_truncated_bytes > 14_000_000
    assert len(r.stdout) <= 50 * 1024 and r.stdout.startswith(b"1\n2\n") and r.stdout.endswith(b"1999999\n2000000\n")
    assert r.spill and os.path.getsize(r.spill["stdout_file"]) == 14888896
    r = session.exec(["seq", "1", "2000000"], max_output=1000)
    assert len(r.stdout) == 1000 and r.truncated and r.stdout_truncated_bytes == 14888896 - 1000


def test_binary_output(session):
    blob = bytes(range(256)) * 4096  # 1 MiB, every byte value, invalid UTF-8
    r = session.exec(["cat"], stdin=blob)
    assert r.stdout == blob
    r = session.exec(["sh", "-c", "printf '\\377\\000\\376'; printf '\\200' >&2"])
    assert r.stdout == b"\xff\x00\xfe" and r.stderr == b"\x80"
    assert session.shell("printf '\\377\\000ok'").stdout == b"\xff\x00ok"


def test_stdin_50mb(session, backend, tmp_path):
    """50 MB of stdin: as bytes on local (written before the answer is read), as a
    file object on docker (a writer thread sends it while the output is read)."""
    data = os.urandom(1 << 20) * 50
    want = hashlib.sha256(data).hexdigest()
    if backend == "local":
        r = session.exec(["sha256sum"], stdin=data)
    else:
        p = tmp_path / "in.bin"
        p.write_bytes(data)
        with open(p, "rb") as f:
            r = session.exec(["sha256sum"], stdin=f)
    assert r.ok and r.stdout.split()[0].decode() == want


def test_daemon_restart(daemon, client, backend):
    """The daemon restarted between two calls: the next call works through the same
    Client (its kept connections are dead), and the session's shell cwd survives."""
    s = client.session("%s:restart" % backend[0])
    s.shell("mkdir -p /tmp/sdk-rs && cd /tmp/sdk-rs")
    pid = client.status()["pid"]
    daemon.stop()
    with pytest.raises(berth.Unavailable):
        client.status()
    daemon.start()
    assert client.status()["pid"] != pid
    assert s.shell("pwd").stdout == b"/tmp/sdk-rs\n"
    s.remove()


def _tree_pids(s, pidfile):
    """The pids (in the sandbox) the command wrote to pidfile."""
    return s.exec(["cat", pidfile]).stdout.split()


def _tree_gone(s, pids):
    return s.exec(["sh", "-c", "for p in %s; do kill -0 $p 2>/dev/null && exit 1; done; exit 0" % " ".join(p.decode() for p in pids)]).exit_code == 0


def test_interrupt_in_stream_loop(session):
    """A KeyboardInterrupt raised in the loop that consumes a stream cancels the
    command: its process tree (the shell and its child) dies."""
    f = "/tmp/sdk-int-%d" % os.getpid()
    with pytest.raises(KeyboardInterrupt):
        with session.stream(["sh", "-c", TREE.format(f=f)]) as st:
            for ev in st:
                if ev.kind == "stdout" and b"ready" in ev.data:
                    raise KeyboardInterrupt
    pids = _tree_pids(session, f)
    assert len(pids) == 2
    wait_for("the interrupted tree %s to die" % pids, lambda: _tree_gone(session, pids))


def test_cancel_from_another_thread(session):
    """Stream.cancel() from a second thread while the first reads: the reader gets
    the exit event with result.canceled, and the command's tree dies; a cancel
    after the result sends nothing."""
    f = "/tmp/sdk-cancel-%d" % os.getpid()
    st = session.stream(["sh", "-c", TREE.format(f=f)])
    ready = threading.Event()
    sent = []
    t = threading.Thread(target=lambda: (ready.wait(), sent.append(st.cancel())))
    t.start()
    kinds = []
    try:
        for ev in st:
            kinds.append(ev.kind)
            if ev.kind == "stdout" and b"ready" in ev.data:
                ready.set()
    finally:
        ready.set()
        t.join()
    assert sent == [True]
    assert kinds[-1] == "exit" and st.result is not None and st.result.canceled, (kinds, st.result)
    assert st.cancel() is False
    pids = _tree_pids(session, f)
    assert len(pids) == 2
    wait_for("the cancelled tree %s to die" % pids, lambda: _tree_gone(session, pids))


def test_ctrl_c_main_thread(session):
    """SIGINT to the main thread while exec() blocks in it (what Ctrl-C does): the
    KeyboardInterrupt propagates and the remote tree dies."""
    f = "/tmp/sdk-ctrlc-%d" % os.getpid()
    other = session.client.session(session.name)  # the same client, used from a second thread
    main = threading.main_thread().ident
    assert threading.current_thread().ident == main

    taken = threading.Event()

    def on_sigint(signum, frame):
        # Python's own handler, once: later signals of the loop below are dropped.
        if not taken.is_set():
            taken.set()
            raise KeyboardInterrupt

    def interrupt():
        wait_for("the command's pid file", lambda: other.exec(["test", "-s", f]).exit_code == 0)
        # A SIGINT that lands after the interpreter last checked for signals and before
        # the socket read it then blocks in is never acted on (the read is not
        # interrupted; seen once in CI, hung for good): send it again until the main
        # thread has taken one, as a user presses Ctrl-C again.
        while not taken.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            taken.wait(1.0)

    old = signal.signal(signal.SIGINT, on_sigint)
    t = threading.Thread(target=interrupt)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            session.exec(["sh", "-c", TREE.format(f=f)])
    finally:
        t.join()
        signal.signal(signal.SIGINT, old)
    pids = _tree_pids(session, f)
    assert len(pids) == 2
    wait_for("the interrupted tree %s to die" % pids, lambda: _tree_gone(session, pids))
    assert session.exec(["echo", "next"]).stdout == b"next\n"  # the session still works


def test_threads(client):
    """50 threads x 20 calls across 10 local sessions through one Client: 0 errors."""
    errs = []
    names = ["l:threads-%d" % i for i in range(10)]

    def work(i):
        s = client.session(names[i % 10])
        for k in range(20):
            try:
                r = s.exec(["echo", "%d-%d" % (i, k)])
                if r.stdout != b"%d-%d\n" % (i, k) or r.exit_code != 0:
                    errs.append("thread %d call %d: %r" % (i, k, r))
            except Exception as e:  # noqa: BLE001 — every error counts
                errs.append("thread %d call %d: %r" % (i, k, e))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(50)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errs == []
    for n in names:
        client.session(n).remove()


def test_tls(tls_daemon, monkeypatch, tmp_path):
    """https with BERTH_TLS_CA: shell mode, and a file object as stdin (sent before
    the answer is read over TLS); without the CA the certificate is refused."""
    monkeypatch.setenv("BERTH_TLS_CA", tls_daemon.env["BERTH_TLS_CA"])
    c = tls_daemon.client()
    s = c.session("tls:1")
    assert s.shell("echo over tls").stdout == b"over tls\n"
    p = tmp_path / "in"
    p.write_bytes(b"z" * (3 << 20))
    with open(p, "rb") as f:
        assert s.exec(["wc", "-c"], stdin=f).stdout.strip() == str(3 << 20).encode()
    s.remove()
    monkeypatch.delenv("BERTH_TLS_CA")
    with pytest.raises(berth.Unavailable) as e:
        berth.Client(tls_daemon.url, tls_daemon.token).status()
    assert "BERTH_TLS_CA" in e.value.message


def test_tcp_token(tcp_daemon, tmp_path):
    c = tcp_daemon.client()
    assert c.session("tcp:1").shell("echo over tcp").stdout == b"over tcp\n"
    c.session("tcp:1").remove()
    wrong = tmp_path / "wrong"
    wrong.write_text("x" * 32)
    wrong.chmod(0o600)
    with pytest.raises(berth.Unauthorized) as e:
        berth.Client(tcp_daemon.url, str(wrong)).session("tcp:1").exec(["true"])
    assert e.value.status == 401 and "token" in e.value.message
    wrong.chmod(0o644)
    with pytest.raises(berth.Invalid) as e:
        berth.Client("http://127.0.0.1:%d" % tcp_daemon.port, str(wrong))
    assert "chmod 600" in e.value.message
    with pytest.raises(berth.Invalid) as e:
        berth.Client("http://10.1.2.3:%d" % tcp_daemon.port, tcp_daemon.token)
    assert "https" in e.value.message


POOL_CONFIG = """
scope "task:*" {
  driver = "local"
  pool {
    size     = 2
    max_idle = "30m"
  }
}
scope "*" {
  driver = "local"
}
"""


@pytest.fixture(scope="module")
def pool_daemon(bins, tmp_path_factory):
    """A berth serve whose task:* sessions have a warm pool of 2 on local; at the
    end a reload without the pool drains it, so no member outlives the tests."""
    d = Daemon(bins, str(tmp_path_factory.mktemp("pool")), POOL_CONFIG)
    d.start()
    yield d
    try:
        d.remove_sessions()
        with open(d.config, "w") as f:
            f.write('scope "*" {\n  driver = "local"\n}\n')
        d.proc.send_signal(signal.SIGHUP)
        c = d.client()
        wait_for("the reloaded daemon to drain its pool", lambda: c.pools() == [])
    finally:
        d.stop()


def test_pools(pool_daemon):
    """client.pools() shows the pool filled; a new session claims a member
    (ExecResult.pooled, the member's sandbox), and the pool refills."""
    c = pool_daemon.client()
    wait_for("the pool to fill", lambda: c.pools()[0].full)
    (p,) = c.pools()
    assert isinstance(p, berth.WarmPool)
    assert (p.scope, p.driver, p.size, p.max_idle_ms, p.ready, p.creating, p.claiming, p.draining) == ("task:*", "local", 2, 1800000, 2, 0, 0, 0)
    assert p.position.endswith("config.hcl:2:1")
    assert all(isinstance(m, berth.PoolMember) and m.state == "ready" and m.ready and m.created and m.session is None for m in p.members)
    members = {m.sandbox for m in p.members}
    r = c.session("task:1").exec(["true"])
    assert r.ok and r.pooled and r.sandbox in members
    (row,) = [s for s in c.sessions() if s["session"] == "task:1"]
    assert row["pooled"] is True and row["sandbox"] == r.sandbox
    wait_for("the pool to refill", lambda: c.pools()[0].full)
    assert r.sandbox not in {m.sandbox for m in c.pools()[0].members}
    assert not c.session("other").exec(["true"]).pooled
