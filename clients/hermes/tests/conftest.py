"""Fixtures: a real ``berth serve`` (built from this checkout) with a config that
puts ``local:*`` sessions on the local driver and every other session in its own
docker sandbox of berth's busybox test image. hermes-agent itself is not loaded:
test_replay.py makes the calls hermes makes on the plugin."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "clients", "hermes", "src"), os.path.join(ROOT, "clients", "python", "src")]

TEST_IMAGE = "berth-test/busybox:1"  # internal/testsupport/testimage.Ref

CONFIG = """
scope "local:*" {
  driver = "local"
}

scope "*" {
  driver = "docker"
  image  = "%s"
  pull   = "never"
  retention {
    on_close    = "stop"
    idle_ttl    = "7d"
    idle_action = "remove"
  }
}
""" % TEST_IMAGE


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


def _ci() -> bool:
    return os.environ.get("CI") == "true"


def _need(what: str) -> None:
    if _ci():
        pytest.fail(what)
    pytest.skip(what)


def _runtimes_env() -> None:
    """DOCKER_HOST from /tmp/runtimes.env (scripts/runtimes.sh's output) when unset."""
    if os.environ.get("DOCKER_HOST"):
        return
    try:
        with open("/tmp/runtimes.env") as f:
            for line in f:
                line = line.strip()
                if line.startswith("export "):
                    line = line[len("export "):]
                k, _, v = line.partition("=")
                if k == "DOCKER_HOST":
                    os.environ["DOCKER_HOST"] = v.strip("'\"")
    except OSError:
        pass


@pytest.fixture(scope="session")
def berth_bin(tmp_path_factory) -> str:
    """The berth binary, with berth-serve (berth serve's server) and
    berth-driver-docker beside it: $BERTH_BIN_DIR, or built here with
    CGO_ENABLED=0 (the agent in a container must be static)."""
    d = os.environ.get("BERTH_BIN_DIR")
    if d:
        return os.path.join(d, "berth")
    d = str(tmp_path_factory.mktemp("bin"))
    env = dict(os.environ, CGO_ENABLED="0")
    subprocess.run(["go", "build", "-o", d + "/", "./cmd/berth", "./cmd/berth-cli", "./cmd/berth-serve", "./cmd/berth-driver-docker"],
                   cwd=ROOT, env=env, check=True)
    return os.path.join(d, "berth")


class Daemon:
    """A running ``berth serve``: its state dir, socket and process."""

    def __init__(self, bin: str, state: str, config: str) -> None:
        self.bin, self.state, self.config = bin, state, config
        self.sock = os.path.join(state, "berth.sock")
        self.host = "unix://" + self.sock
        self.proc = None
        self.log = []

    def start(self) -> None:
        """Start it and return once it logs that it is ready (its JSON log line)."""
        self.proc = subprocess.Popen(
            [self.bin, "--config", self.config, "--state-dir", self.state, "serve", "--log-json"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.log.append(line)
                try:
                    if json.loads(line).get("@message") == "berth serve ready":
                        ready.set()
                except ValueError:
                    pass
            ready.set()  # it exited

        threading.Thread(target=read, daemon=True).start()
        ready.wait()
        if self.proc.poll() is not None:
            raise RuntimeError("berth serve exited before it was ready: %s" % b"".join(self.log).decode(errors="replace"))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()

    def berth(self, *args: str) -> subprocess.CompletedProcess:
        """Run the berth CLI against this daemon."""
        env = dict(os.environ, BERTH_HOST=self.host)
        return subprocess.run([self.bin, "--config", self.config, "--state-dir", self.state, *args],
                              env=env, capture_output=True, text=True)


@pytest.fixture(scope="session")
def daemon(berth_bin, tmp_path_factory):
    _runtimes_env()
    if not os.environ.get("DOCKER_HOST"):
        _need("no DOCKER_HOST: start the runtimes with sudo scripts/runtimes.sh and export what it prints")
    # A short state dir path: the socket path must fit (and berth's mount policy
    # refuses /tmp-wide state dirs in mounts, not here).
    state = tempfile.mkdtemp(prefix="bh-")
    cfg = os.path.join(state + ".hcl")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    d = Daemon(berth_bin, state, cfg)
    d.start()
    os.environ["BERTH_HOST"] = d.host
    os.environ.pop("BERTH_TOKEN_FILE", None)
    yield d
    # Remove every sandbox this run made (the docker ones are containers).
    for s in json.loads(d.berth("sessions", "--json").stdout or "[]"):
        d.berth("rm", s.get("session") or s.get("name"))
    d.stop()
    shutil.rmtree(state, ignore_errors=True)
    os.unlink(cfg)


@pytest.fixture(params=["local", "docker"])
def backend(request, daemon):
    """The session pattern of a backend: local:* sessions run on the host, the
    others each in a docker sandbox."""
    return request.param


@pytest.fixture
def provider(backend, monkeypatch):
    import berth_hermes

    monkeypatch.setenv("BERTH_HERMES_SESSION", ("local:{task_id}" if backend == "local" else "hermes:{task_id}"))
    return berth_hermes.BerthTerminalProvider()


@pytest.fixture
def task_id() -> str:
    return "t-" + uuid.uuid4().hex[:10]


@pytest.fixture
def env(provider, task_id, daemon):
    e = provider.create_environment(cwd="", timeout=60, task_id=task_id)
    yield e
    try:
        e.session.remove()
    except Exception:
        pass


@pytest.fixture(autouse=True)
def _empty_hermes_home(monkeypatch, tmp_path_factory):
    """Every test starts with a hermes home of its own, without config.yaml: a
    developer's ~/.hermes/config.yaml must not change what the provider reads."""
    monkeypatch.setenv("HERMES_HOME", str(tmp_path_factory.mktemp("hermes-home")))
