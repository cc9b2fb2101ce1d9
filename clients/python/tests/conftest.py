"""Fixtures: berth built from this checkout and a real ``berth serve`` with its own
state dir and config: sessions ``l:*`` on the local driver, ``d:*`` on docker with
berth's busybox test image (DOCKER_HOST; without an engine the docker cases skip,
and fail under CI=true).

Waits are for events (the daemon's health route answering, a process gone), each
bounded by BERTH_TEST_WAIT seconds (default 120), never fixed sleeps.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(SDK))
sys.path.insert(0, os.path.join(SDK, "src"))

import berth  # noqa: E402

# berth's busybox test image (internal/testsupport/testimage.Ref).
TEST_IMAGE = "berth-test/busybox:1"

WAIT = float(os.environ.get("BERTH_TEST_WAIT", "120").rstrip("s"))


def wait_for(what: str, cond: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll cond until it holds; fail naming what after timeout seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail("waited %ss for %s" % (timeout, what))
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _run(cmd: List[str], env: Optional[Dict[str, str]] = None, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)
    if p.returncode != 0:
        pytest.fail("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stdout.decode(errors="replace")))
    return p


@pytest.fixture(scope="session")
def bins(tmp_path_factory) -> str:
    """A directory with static berth, berth-cli, berth-serve, berth-driver-docker and the testimage tool,
    built from this checkout (CGO_ENABLED=0: berth-cli is also the sandboxes' agent)."""
    d = str(tmp_path_factory.mktemp("bin"))
    env = dict(os.environ, CGO_ENABLED="0")
    _run(["go", "build", "-o", d + "/", "./cmd/berth", "./cmd/berth-cli", "./cmd/berth-serve", "./cmd/berth-driver-docker"], env)
    _run(["go", "build", "-o", os.path.join(d, "testimage"), "./internal/testsupport/testimage/cmd/testimage"], env)
    return d


def docker_host() -> Optional[str]:
    """DOCKER_HOST when a Docker Engine answers there, else None."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host.startswith("unix://"):
        return None
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    try:
        s.connect(host[len("unix://") :])
        s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
        return host if b"OK" in s.recv(4096) else None
    except OSError:
        return None
    finally:
        s.close()


class Daemon:
    """One berth serve process with its state dir and config."""

    def __init__(self, bins: str, root: str, config: str, args: Optional[List[str]] = None) -> None:
        self.bins = bins
        self.berth = os.path.join(bins, "berth")
        self.root = root
        self.state = os.path.join(root, "state")
        self.config = os.path.join(root, "config.hcl")
        with open(self.config, "w") as f:
            f.write(config)
        self.args = args or []
        self.env = dict(
            os.environ,
            BERTH_STATE_DIR=self.state,
            BERTH_CONFIG=self.config,
            XDG_CONFIG_HOME=os.path.join(root, "xdg"),
        )
        self.env.pop("BERTH_HOST", None)
        self.sock = os.path.join(self.state, "berth.sock")
        self.proc: Optional[subprocess.Popen] = None
        self.log = os.path.join(root, "serve.log")

    def berth_cmd(self, *args: str, stdin: Optional[bytes] = None) -> subprocess.CompletedProcess:
        return _run([self.berth, *args], self.env, input=stdin)

    def client(self, **kw) -> berth.Client:
        return berth.Client(state_dir=self.state, **kw)

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([self.berth, "serve", "--log-level", "warn", *self.args], env=self.env, stdout=log, stderr=log)
        c = self.client(timeout=10)

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                pytest.fail("berth serve exited %s:\n%s" % (self.proc.returncode, open(self.log).read()))
            try:
                return c.health()["status"] in ("ok", "degraded")
            except berth.Error:
                return False

        try:
            wait_for("berth serve to answer its health route on " + self.sock, up)
        finally:
            c.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def remove_sessions(self) -> None:
        """berth rm every session: no sandbox outlives the tests."""
        for s in self.client(timeout=30).sessions():
            subprocess.run([self.berth, "--no-daemon", "rm", s["session"]], env=self.env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


CONFIG = """
scope "d:*" {
  driver = "docker"
  image  = "%s"
}
scope "*" {
  driver = "local"
}
""" % TEST_IMAGE


@pytest.fixture(scope="session")
def daemon(bins, tmp_path_factory):
    """The shared berth serve: l:* on local, d:* on docker (image imported first
    when an engine answers)."""
    d = Daemon(bins, str(tmp_path_factory.mktemp("serve")), CONFIG if docker_host() else 'scope "*" {\n  driver = "local"\n}\n')
    if docker_host():
        tar = os.path.join(d.root, "busybox.tar")
        _run([os.path.join(bins, "testimage"), "-o", tar])
        d.berth_cmd("image", "import", "--driver", "docker", tar)
    d.start()
    yield d
    try:
        d.remove_sessions()
    finally:
        d.stop()


@pytest.fixture(scope="session")
def client(daemon):
    c = daemon.client()
    yield c
    c.close()


@pytest.fixture(params=["local", "docker"])
def backend(request) -> str:
    """Each case runs on local and on docker; docker skips without an engine,
    except under CI=true, where it fails."""
    if request.param == "docker" and not docker_host():
        msg = "no Docker Engine at DOCKER_HOST=%r; start one with scripts/runtimes.sh and export the DOCKER_HOST it prints" % os.environ.get("DOCKER_HOST", "")
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return request.param


_n = [0]


@pytest.fixture
def session(client, backend, request):
    """A fresh session on the backend, removed afterwards."""
    _n[0] += 1
    name = "%s:%s-%d" % (backend[0], request.node.name.split("[")[0].replace("_", "-")[:40], _n[0])
    s = client.session(name)
    yield s
    try:
        s.remove()
    except berth.Error:
        pass


# A command whose tree is a shell and its child: it writes their pids (in the
# sandbox) to the file {f}, prints "ready" and waits.
TREE = "rm -f {f}; sleep 600 & echo $$ $! > {f}.tmp && mv {f}.tmp {f}; echo ready; wait"


def _tcp_daemon(bins, root, tls):
    """A berth serve on 127.0.0.1 with a bearer token (local driver only), over TLS
    with a self-signed certificate for 127.0.0.1 when tls."""
    tok = os.path.join(root, "token")
    with open(tok, "w") as f:
        f.write(os.urandom(24).hex() + "\n")
    os.chmod(tok, 0o600)
    import socket as so

    s = so.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    args = ["--listen", "tcp://127.0.0.1:%d" % port, "--token-file", tok]
    scheme = "http"
    if tls:
        cert, key = os.path.join(root, "cert.pem"), os.path.join(root, "key.pem")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
             "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        args += ["--tls-cert", cert, "--tls-key", key]
        scheme = "https"
    d = Daemon(bins, root, 'scope "*" {\n  driver = "local"\n}\n', args)
    d.url = "%s://127.0.0.1:%d" % (scheme, port)
    if tls:
        d.env["BERTH_TLS_CA"] = cert
        os.environ["BERTH_TLS_CA"] = cert
    d.client = lambda **kw: berth.Client(d.url, tok, **kw)  # type: ignore[assignment]
    try:
        d.start()
    finally:
        os.environ.pop("BERTH_TLS_CA", None)
    d.port, d.token = port, tok
    return d


@pytest.fixture(scope="module")
def tcp_daemon(bins, tmp_path_factory):
    d = _tcp_daemon(bins, str(tmp_path_factory.mktemp("tcp")), False)
    yield d
    try:
        d.remove_sessions()
    finally:
        d.stop()


@pytest.fixture(scope="module")
def tls_daemon(bins, tmp_path_factory):
    d = _tcp_daemon(bins, str(tmp_path_factory.mktemp("tls")), True)
    yield d
    d.stop()  # test_tls removes its session
