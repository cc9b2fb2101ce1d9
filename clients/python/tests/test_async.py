"""berth.AsyncClient against a real berth serve (see conftest.py), on local and docker.

Each case runs its coroutine with asyncio.run (no pytest-asyncio) and then checks
that the call left nothing behind: no task but the case's own, no connection in
flight (every open one is idle in the pool), and none at all once the client is
closed. Waits are for events, bounded by BERTH_TEST_WAIT, never fixed sleeps.
"""

import asyncio
import hashlib
import json
import os
import subprocess
import time

import pytest

import berth
from conftest import TREE, WAIT, wait_for

_n = [0]


def _idle_only(c: berth.AsyncClient, tasks: bool = True) -> None:
    """Nothing of the client's is in flight: no task (unless tasks is False: a test
    server's run beside), no connection but idle ones."""
    me = asyncio.current_task()
    if tasks:
        assert [t for t in asyncio.all_tasks() if t is not me] == []
    pool = c._pool
    assert pool.live == set(pool.idle), (pool.live, pool.idle)


async def _closed(c: berth.AsyncClient, tasks: bool = True) -> None:
    _idle_only(c, tasks)
    await c.close()
    assert not c._pool.live and not c._pool.idle


@pytest.fixture
def arun(daemon, backend, request):
    """arun(body): run ``await body(client, session)`` in a new event loop, with an
    AsyncClient of the shared daemon and a fresh AsyncSession on the backend; then
    check that nothing is left in flight, remove the session and close the client."""
    _n[0] += 1
    name = "%s:a-%s-%d" % (backend[0], request.node.name.split("[")[0].replace("_", "-")[:40], _n[0])

    def run(body):
        async def main():
            c = berth.AsyncClient(state_dir=daemon.state)
            s = c.session(name)
            try:
                out = await body(c, s)
                _idle_only(c)
                return out
            finally:
                try:
                    await s.remove()
                except berth.Error:
                    pass
                await _closed(c)

        return asyncio.run(main())

    return run


async def await_for(what, cond, timeout=WAIT):
    """Poll the coroutine function cond until it returns true; fail naming what after
    timeout seconds (conftest.wait_for for async conditions)."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not await cond():
        if time.monotonic() > deadline:
            pytest.fail("waited %ss for %s" % (timeout, what))
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)


async def _tree_gone(s, pids):
    r = await s.exec(["sh", "-c", "for p in %s; do kill -0 $p 2>/dev/null && exit 1; done; exit 0" % " ".join(p.decode() for p in pids)])
    return r.exit_code == 0


async def _pids(s, f):
    """The pids (in the sandbox) that TREE wrote to f, once it has."""

    async def written():
        return (await s.exec(["test", "-s", f])).exit_code == 0

    await await_for("the command's pid file " + f, written)
    pids = (await s.exec(["cat", f])).stdout.split()
    assert len(pids) == 2
    return pids


def _audit(daemon, session):
    """The audit log's exec lines of session, oldest first."""
    out = []
    with open(os.path.join(daemon.state, "audit.log")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("session") == session and rec.get("route") == "/v1/sessions/{name}/exec":
                out.append(rec)
    return out


def _sha(argv):
    return hashlib.sha256("\0".join(argv).encode()).hexdigest()


# ---- results ----


def test_exec_result(arun, backend):
    async def body(c, s):
        r = await s.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.ok) == (3, b"out\n", b"err\n", False, False)
        assert isinstance(r, berth.ExecResult) and isinstance(r.stdout, bytes)
        assert r.driver == backend and r.session == s.name and r.sandbox
        r = await s.exec(["sh", "-c", "printf '\\377\\000\\376'; printf '\\200' >&2"])
        assert (r.stdout, r.stderr, r.exit_code) == (b"\xff\x00\xfe", b"\x80", 0)
        nf = await s.exec(["no-such-program-xyz"])
        assert nf.exit_code == 127 and b"no-such-program-xyz" in nf.stderr
        r = await s.exec(["sh", "-c", 'echo "$A-$B"; pwd'], env={"A": "x", "B": 2}, cwd="/tmp")
        assert r.stdout == b"x-2\n/tmp\n"
        r = await s.exec(["seq", "1", "200000"], max_output=1000)
        assert len(r.stdout) == 1000 and r.truncated and r.stdout_truncated_bytes == 1288895 - 1000

    arun(body)


def test_shell_state(arun):
    async def body(c, s):
        r = await s.shell("mkdir -p /tmp/asdk-sh && cd /tmp/asdk-sh && export GREETING=hi")
        assert r.ok and r.cwd == "/tmp/asdk-sh"
        r = await s.shell('printf "%s from %s\\n" "$GREETING" "$(pwd)"')
        assert r.stdout == b"hi from /tmp/asdk-sh\n"
        assert (await s.shell("exit 7")).exit_code == 7
        assert (await s.shell("pwd")).stdout_text == "/tmp/asdk-sh\n"
        assert (await s.shell("echo $C", env={"C": "per-call"})).stdout == b"per-call\n"
        # bounded as Session.shell: the capped text, the whole stream in the spill file
        r = await s.shell("seq 1 200000")
        assert r.truncated and len(r.stdout) <= 50 * 1024 and r.stdout.startswith(b"1\n2\n") and r.stdout.endswith(b"199999\n200000\n")
        assert r.spill and os.path.getsize(r.spill["stdout_file"]) == 1288895

    arun(body)


def test_stdin(arun, tmp_path):
    """stdin as bytes (1 MiB of every byte value), a 5 MB str (UTF-8), a file object
    and an async iterable; none at all is EOF at once."""
    blob = bytes(range(256)) * 4096
    text = "héllo wörld ✓\n" * (5_000_000 // 17)
    want = hashlib.sha256(text.encode()).hexdigest()
    p = tmp_path / "in.bin"
    p.write_bytes(blob)

    async def pieces():
        for i in range(100):
            yield b"%d\n" % i

    async def body(c, s):
        assert (await s.exec(["cat"], stdin=blob)).stdout == blob
        r = await s.exec(["sha256sum"], stdin=text)
        assert r.ok and r.stdout.split()[0].decode() == want
        assert (await s.exec(["cat"], stdin="small")).stdout == b"small"
        with open(p, "rb") as f:
            assert (await s.exec(["cat"], stdin=f)).stdout == blob
        assert (await s.exec(["wc", "-l"], stdin=pieces())).stdout.strip() == b"100"
        assert (await s.shell("cat", stdin=b"to the shell")).stdout == b"to the shell"
        assert (await s.exec(["cat"])).stdout == b""
        with pytest.raises(berth.Invalid):
            await s.exec(["cat"], stdin=12)

        async def broken():
            yield b"some"
            raise RuntimeError("the source broke")

        # the caller's error, and the command, which never got its whole stdin, killed
        with pytest.raises(RuntimeError, match="the source broke"):
            await s.exec(["cat"], stdin=broken())

    arun(body)


def test_streaming_order(arun):
    """Output comes as the command writes it: the command prints, then waits for a
    line that the test feeds (an async iterable as stdin) only once it has seen that
    output, then prints on stderr, then on stdout."""

    async def body(c, s):
        q: asyncio.Queue = asyncio.Queue()

        async def feed():
            while True:
                line = await q.get()
                if line is None:
                    return
                yield line

        got = []
        async with s.stream(["sh", "-c", "echo one; read x; echo two-$x >&2; read y; echo three-$y"], stdin=feed()) as st:
            async for ev in st:
                got.append((ev.kind, ev.data))
                if ev.kind == "stdout" and ev.data == b"one\n":
                    q.put_nowait(b"A\n")
                elif ev.kind == "stderr":
                    q.put_nowait(b"B\n")
                    q.put_nowait(None)
        kinds = [k for k, _ in got]
        assert kinds[0] == "started" and kinds[-1] == "exit"
        assert [d for k, d in got if k in ("stdout", "stderr")] == [b"one\n", b"two-A\n", b"three-B\n"]
        assert [k for k in kinds if k in ("stdout", "stderr")] == ["stdout", "stderr", "stdout"]
        assert st.result is not None and st.result.ok and await st.cancel() is False
        # shell mode streams too (stdout and stderr written at once may come in either order)
        evs = [ev async for ev in s.stream(shell="echo a; echo b >&2")]
        assert evs[0].kind == "started" and evs[-1].kind == "exit" and evs[-1].result.cwd
        assert sorted((e.kind, e.data) for e in evs[1:-1]) == [("stderr", b"b\n"), ("stdout", b"a\n")]

    arun(body)


def test_connection_kept(arun):
    """Sequential calls use one connection: an exec returns at its result and leaves
    the answer's end to the pool, which reads it when it next hands the connection
    out."""

    async def body(c, s):
        await s.exec(["true"])
        pool = c._pool
        (kept,) = pool.idle
        assert kept.pending is not None
        for i in range(5):
            assert (await s.exec(["echo", str(i)])).stdout == b"%d\n" % i
            assert pool.idle == [kept] and pool.live == {kept}
        assert (await s.shell("echo shell")).stdout == b"shell\n"
        await c.status()
        assert pool.idle == [kept] and kept.reused

    arun(body)


def test_check(arun):
    async def body(c, s):
        assert (await s.exec(["true"], check=True)).ok
        with pytest.raises(subprocess.CalledProcessError) as e:
            await s.exec(["sh", "-c", "echo out; echo err >&2; exit 3"], check=True)
        err = e.value
        assert isinstance(err, berth.CommandFailed) and isinstance(err, berth.Error)
        assert (err.returncode, err.cmd, err.stdout, err.stderr) == (3, ["sh", "-c", "echo out; echo err >&2; exit 3"], b"out\n", b"err\n")
        assert err.result.exit_code == 3 and s.name in str(err)
        with pytest.raises(berth.CommandFailed) as e:
            await s.shell("exit 7", check=True)
        assert e.value.returncode == 7 and e.value.cmd == "exit 7"

    arun(body)


def test_timeout(arun):
    async def body(c, s):
        r = await s.exec(["sh", "-c", "echo partial; exec sleep 600"], timeout=1)
        assert r.timed_out and r.exit_code == 143 and r.stdout == b"partial\n" and not r.ok
        r = await s.shell("echo partial-sh; sleep 600", timeout=1)
        assert r.timed_out and r.exit_code == 143 and r.stdout == b"partial-sh\n"
        with pytest.raises(berth.CommandFailed) as e:
            await s.exec(["sleep", "600"], timeout=1, check=True)
        assert e.value.result.timed_out
        with pytest.raises(berth.Invalid):
            await s.exec(["true"], timeout=0)

    arun(body)


# ---- errors ----


def test_errors(arun, daemon):
    async def body(c, s):
        for bad in ["bad name", "a/../b", "x" * 129]:
            with pytest.raises(berth.Invalid) as e:
                await c.session(bad).exec(["true"])
            assert e.value.status == 400 and e.value.kind == "invalid" and bad[:20] in e.value.message
        with pytest.raises(berth.Invalid):
            await c.session("bad name").info()
        with pytest.raises(berth.Invalid):
            c.session("")
        with pytest.raises(berth.NotFound) as e:
            await s.info()  # no sandbox yet
        assert e.value.status == 404 and isinstance(e.value, LookupError)
        await s.exec(["true"])
        with pytest.raises(berth.NotFound):
            await s.read_file("/tmp/asdk-no-such-file")
        with pytest.raises(berth.Invalid) as e:
            await s.exec(["true"], cwd="/no/such/dir")
        assert "/no/such/dir" in e.value.message
        # the connection an error answer came on is not kept in flight
        assert c._pool.live == set(c._pool.idle)

    arun(body)


def test_daemon_not_running(tmp_path):
    sock = os.path.join(str(tmp_path), "berth.sock")

    async def main():
        c = berth.AsyncClient(state_dir=str(tmp_path))
        with pytest.raises(berth.Unavailable) as e:
            await c.session("l:1").exec(["true"])
        assert sock in e.value.message and "berth serve" in e.value.message and e.value.status == 0
        assert isinstance(e.value, ConnectionError)
        with pytest.raises(berth.Unavailable) as e:
            async for _ in c.session("l:1").stream(["true"]):
                pass
        assert sock in e.value.message
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(sock)  # a socket that a dead daemon left behind: nobody listens
        s.close()
        with pytest.raises(berth.Unavailable) as e:
            await c.status()
        assert "refused" in e.value.message.lower() and sock in e.value.message
        await _closed(c)

    asyncio.run(main())
    with pytest.raises(berth.Invalid):
        berth.AsyncClient(state_dir=str(tmp_path), timeout=0)


# ---- cancellation ----


def test_cancel_exec(arun, daemon):
    """Cancelling the task that awaits exec() cancels the remote command: the call
    sends the cancel event and waits for its result, so the command's process tree
    (a shell and its child) is killed; the session works on."""
    f = "/tmp/asdk-cancel-%d" % os.getpid()
    argv = ["sh", "-c", TREE.format(f=f)]

    async def body(c, s):
        task = asyncio.ensure_future(s.exec(argv))
        pids = await _pids(s, f)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await await_for("the cancelled tree %s to die" % pids, lambda: _tree_gone(s, pids))
        assert (await s.exec(["echo", "next"])).stdout == b"next\n"
        return s.name

    name = arun(body)
    # the daemon ran it to a result (the tree killed by SIGTERM): the cancel event,
    # not a dropped connection, stopped it
    wait_for("the audit line of the cancelled exec", lambda: any(r.get("command_sha256") == _sha(argv) for r in _audit(daemon, name)))
    (rec,) = [r for r in _audit(daemon, name) if r.get("command_sha256") == _sha(argv)]
    # (a dropped connection is recorded as the error kind canceled, without an exit code)
    assert rec["status"] == 200 and rec.get("exit_code") in (143, 137) and "error_kind" not in rec, rec


@pytest.mark.skipif(not hasattr(asyncio, "timeout"), reason="asyncio.timeout is Python 3.11+")
def test_asyncio_timeout(arun):
    """An asyncio.timeout that runs out while exec() waits: the remote tree is killed
    and the caller gets TimeoutError (the deadline is moved to now once the command
    runs, so the case does not depend on the machine's speed)."""
    f = "/tmp/asdk-tmo-%d" % os.getpid()

    async def body(c, s):
        async def later(cm):
            pids = await _pids(s, f)
            cm.reschedule(asyncio.get_running_loop().time())
            return pids

        with pytest.raises(TimeoutError):
            async with asyncio.timeout(None) as cm:
                t = asyncio.ensure_future(later(cm))
                try:
                    await s.exec(["sh", "-c", TREE.format(f=f)])
                finally:
                    pids = await t
        await await_for("the timed-out tree %s to die" % pids, lambda: _tree_gone(s, pids))

    arun(body)


def test_cancel_stream(arun):
    """A stream given up in its loop (an exception inside ``async with``) cancels the
    command; stream.cancel() from another task gives the reader the exit event with
    result.canceled, and the tree dies."""
    f = "/tmp/asdk-cst-%d" % os.getpid()
    g = "/tmp/asdk-cst2-%d" % os.getpid()

    async def body(c, s):
        with pytest.raises(KeyError):
            async with s.stream(["sh", "-c", TREE.format(f=f)]) as st:
                async for ev in st:
                    if ev.kind == "stdout" and b"ready" in ev.data:
                        raise KeyError("out")
        pids = await _pids(s, f)
        await await_for("the abandoned tree %s to die" % pids, lambda: _tree_gone(s, pids))

        st = s.stream(["sh", "-c", TREE.format(f=g)])
        ready = asyncio.Event()
        sent = []

        async def canceller():
            await ready.wait()
            sent.append(await st.cancel())

        t = asyncio.ensure_future(canceller())
        kinds = []
        async for ev in st:
            kinds.append(ev.kind)
            if ev.kind == "stdout" and b"ready" in ev.data:
                ready.set()
        await t
        assert sent == [True] and kinds[-1] == "exit" and st.result is not None and st.result.canceled, (kinds, st.result)
        assert await st.cancel() is False
        pids = await _pids(s, g)
        await await_for("the cancelled tree %s to die" % pids, lambda: _tree_gone(s, pids))

    arun(body)


def test_cancel_with_stdin_feeder(arun):
    """A task cancelled while its stdin (an async iterable that never ends) is being
    fed: the feeder task stops, the command is cancelled, nothing is left."""

    async def body(c, s):
        fed = asyncio.Event()

        async def endless():
            yield b"first\n"
            fed.set()
            await asyncio.Event().wait()  # never set: stdin stays open
            yield b"never\n"

        task = asyncio.ensure_future(s.exec(["cat"], stdin=endless()))
        await fed.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await s.exec(["echo", "after"])).stdout == b"after\n"

    arun(body)


# ---- concurrency ----


def test_concurrent(arun, backend):
    """50 tasks x 4 calls across 10 sessions through one AsyncClient: 0 errors, each
    output its own; afterwards at most MAX_IDLE connections are kept."""
    names = ["%s:aconc-%d" % (backend[0], i) for i in range(10)]

    async def body(c, s):
        errs = []

        async def work(i):
            ss = c.session(names[i % 10])
            for k in range(4):
                try:
                    r = await ss.exec(["echo", "%d-%d" % (i, k)])
                    if r.stdout != b"%d-%d\n" % (i, k) or r.exit_code != 0:
                        errs.append("task %d call %d: %r" % (i, k, r))
                except Exception as e:  # noqa: BLE001 — every error counts
                    errs.append("task %d call %d: %r" % (i, k, e))

        await asyncio.gather(*(work(i) for i in range(50)))
        assert errs == []
        assert len(c._pool.idle) <= 16
        _idle_only(c)
        await asyncio.gather(*(c.session(n).remove() for n in names))

    arun(body)


# ---- lifecycle, files, daemon ----


def test_lifecycle(arun, backend):
    async def body(c, s):
        await s.exec(["true"])
        assert (await s.info())["state"] == "running"
        (row,) = [r for r in await c.sessions() if r.session == s.name]
        assert isinstance(row, berth.SessionInfo) and row.driver == backend
        st = await c.status()
        assert isinstance(st, berth.Status) and st.api == "v1" and st.pid > 0
        assert "local" in {d.name for d in await c.drivers()}
        assert (await c.health())["status"] in ("ok", "degraded")
        assert (await c.explain(s.name))
        assert await c.pools() == []
        assert isinstance(await c.prune(dry_run=True), dict)
        await s.write_file("/tmp/asdk-f.bin", bytes(range(256)), mode=0o600)
        assert await s.read_file("/tmp/asdk-f.bin") == bytes(range(256))
        await s.stop()
        assert (await s.info())["state"] == "stopped"
        assert (await s.exec(["echo", "back"])).stdout == b"back\n"
        await s.close()  # the default rule keeps it
        assert await s.recreate() is True
        await s.remove()
        with pytest.raises(berth.NotFound):
            await s.info()
        await s.remove()  # idempotent

    arun(body)


def test_daemon_restart(arun, daemon):
    """The daemon restarted between two calls: the kept connection is dead, noticed,
    and replaced; the session's shell state survives."""

    async def body(c, s):
        await s.shell("mkdir -p /tmp/asdk-rs && cd /tmp/asdk-rs")
        pid = (await c.status()).pid
        assert len(c._pool.idle) == 1
        daemon.stop()
        with pytest.raises(berth.Unavailable):
            await c.status()
        daemon.start()
        assert (await c.status()).pid != pid
        assert (await s.shell("pwd")).stdout == b"/tmp/asdk-rs\n"

    arun(body)


def test_tls(tls_daemon, monkeypatch, tmp_path):
    """https with BERTH_TLS_CA: shell mode, and a 3 MiB file object as stdin, read
    and written at once over one TLS connection; without the CA the certificate is
    refused."""
    monkeypatch.setenv("BERTH_TLS_CA", tls_daemon.env["BERTH_TLS_CA"])
    p = tmp_path / "in"
    p.write_bytes(b"z" * (3 << 20))

    async def main():
        c = berth.AsyncClient(tls_daemon.url, tls_daemon.token)
        s = c.session("atls:1")
        assert (await s.shell("echo over tls")).stdout == b"over tls\n"
        with open(p, "rb") as f:
            assert (await s.exec(["wc", "-c"], stdin=f)).stdout.strip() == str(3 << 20).encode()
        rs = await asyncio.gather(*(c.session("atls:%d" % (i % 3)).exec(["echo", str(i)]) for i in range(12)))
        assert [r.stdout for r in rs] == [b"%d\n" % i for i in range(12)]
        for i in range(3):
            await c.session("atls:%d" % i).remove()
        await _closed(c)

    asyncio.run(main())
    monkeypatch.delenv("BERTH_TLS_CA")

    async def untrusted():
        c = berth.AsyncClient(tls_daemon.url, tls_daemon.token)
        with pytest.raises(berth.Unavailable) as e:
            await c.status()
        assert "BERTH_TLS_CA" in e.value.message
        await _closed(c)

    asyncio.run(untrusted())


def test_tcp_token(tcp_daemon, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("x" * 32)
    wrong.chmod(0o600)

    async def main():
        c = berth.AsyncClient(tcp_daemon.url, tcp_daemon.token)
        assert (await c.session("atcp:1").shell("echo over tcp")).stdout == b"over tcp\n"
        await c.session("atcp:1").remove()
        await _closed(c)
        bad = berth.AsyncClient(tcp_daemon.url, str(wrong))
        with pytest.raises(berth.Unauthorized) as e:
            await bad.session("atcp:1").exec(["true"])
        assert e.value.status == 401 and "token" in e.value.message
        with pytest.raises(berth.Unauthorized):
            await bad.status()
        await _closed(bad)

    asyncio.run(main())
    wrong.chmod(0o644)
    with pytest.raises(berth.Invalid) as e:
        berth.AsyncClient(tcp_daemon.url, str(wrong))
    assert "chmod 600" in e.value.message


# ---- the HTTP/1.1 client against canned answers (no daemon) ----

CANNED = {
    # chunked, with a chunk extension and a trailer
    "/v1/status": b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\n{"ap\r\n9\r\ni":"v1"}\n\r\n0\r\nX-Trailer: 1\r\n\r\n',
    # an informational answer first, then Content-Length
    "/v1/sessions": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]",
    # HTTP/1.0, the body ends with the connection
    "/v1/drivers": b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n[{"name":"x"}]',
    "/v1/health": b"not http\r\n\r\n",
    "/v1/pools": None,  # never answered
}


def _canned_server(tmp_path, close_after=False):
    """A unix socket server answering CANNED by path; conns counts its connections."""
    path = str(tmp_path / "canned.sock")
    conns = []

    async def serve(reader, writer):
        conns.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ")[1].decode()
                answer = CANNED[target]
                if answer is None:
                    await reader.read()  # until the client goes
                    return
                writer.write(answer)
                await writer.drain()
                if close_after or answer.startswith(b"HTTP/1.0"):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    return path, conns, serve


def test_http_framing(tmp_path):
    """Answers framed by chunks (with an extension and trailers), by Content-Length
    after a 1xx, and by the connection's end; kept-alive reuse; a kept connection
    that the server closed is replaced; no answer within the client's timeout is
    berth.Timeout; an answer that is not HTTP is berth.Unavailable."""
    path, conns, serve = _canned_server(tmp_path)

    async def main():
        server = await asyncio.start_unix_server(serve, path)
        c = berth.AsyncClient("unix://" + path, timeout=WAIT)
        assert (await c.status()).api == "v1"
        assert await c.sessions() == []
        assert (await c.status()).api == "v1"
        assert len(conns) == 1  # one connection, kept between the calls
        assert [d.name for d in await c.drivers()] == ["x"]  # closed by the server after
        assert (await c.status()).api == "v1"
        with pytest.raises(berth.Unavailable) as e:
            await c.health()
        assert "went away" in e.value.message
        await _closed(c, tasks=False)
        slow = berth.AsyncClient("unix://" + path, timeout=0.2)
        with pytest.raises(berth.Timeout) as e:
            await slow.pools()
        assert "within 0.2s" in e.value.message and isinstance(e.value, TimeoutError)
        await _closed(slow, tasks=False)
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_http_server_closes_kept(tmp_path):
    """A server that closes every connection after its answer (without saying so):
    each next call notices the kept connection is gone, or retries a GET once on a
    new one."""
    path, conns, serve = _canned_server(tmp_path, close_after=True)

    async def main():
        server = await asyncio.start_unix_server(serve, path)
        c = berth.AsyncClient("unix://" + path, timeout=WAIT)
        for _ in range(5):
            assert (await c.status()).api == "v1"
        assert len(conns) == 5
        await _closed(c, tasks=False)
        server.close()
        await server.wait_closed()

    asyncio.run(main())
