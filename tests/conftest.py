"""Shared fixtures: a private redis-server, worker subprocesses, fresh namespaces."""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rollq.ops.cli import main
from rollq.producer import Producer
from tests.support.cluster import Cluster
from tests.support.dashboard import Dashboard
from tests.support.fake_vllm import FakeVLLM
from tests.support.serve_al import answers
from tests.support.servers import REPO, ROLLQ, RedisServer, Replicated, WorkerProcess, free_port
from tests.support.waiting import wait_until


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One private redis-server for the session; tests keep apart by namespace."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """A redis-server of the test's own, for restarts, passwords, AOF: ``own_redis(password=..., appendonly=...)``."""
    servers: list[RedisServer] = []

    def start(**kwargs: object) -> RedisServer:
        directory = tmp_path / f"redis-{len(servers)}"
        directory.mkdir()
        servers.append(RedisServer(directory, **kwargs).start())  # type: ignore[arg-type]
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[Replicated]:
    """A private primary, a replica in sync and a Sentinel: see :class:`servers.Replicated`."""
    servers = Replicated(tmp_path / "replicated")
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A Redis Cluster of the test's own: 3 primaries with a replica each (tests/support/cluster.py)."""
    servers = Cluster(tmp_path / "cluster")
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``rq worker -w rollq.worker.RolloutWorker`` subprocesses: ``workers(url, namespace, env=, args=)``.

    Each is stopped (SIGTERM, then SIGKILL) at the end of the test; its log is
    printed when the test fails.
    """
    started: list[WorkerProcess] = []

    def start(
        url: str | None, namespace: str, *, env: dict[str, str] | None = None, args: list[str] | None = None
    ) -> WorkerProcess:
        proc = WorkerProcess(url, namespace, tmp_path / f"worker-{len(started)}.log", env=env or {}, args=args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop(timeout=30)
        print(f"--- {proc.log_path.name} ---\n{proc.log()[-4000:]}")


@pytest.fixture(scope="session")
def al_bin() -> Path:
    """``bin/`` of a venv with Agent Lightning 0.1.2 and rollq (see al_venv.py); built once, cached under /tmp."""
    from tests.support import al_venv

    return al_venv.build("0.1.2")


@pytest.fixture(scope="session")
def al02_bin() -> Path:
    """``bin/`` of a venv with Agent Lightning 0.2.2 and rollq."""
    from tests.support import al_venv

    return al_venv.build("0.2.2")


@pytest.fixture(scope="session")
def al03_bin() -> Path:
    """``bin/`` of a venv with Agent Lightning 0.3.0 and rollq."""
    from tests.support import al_venv

    return al_venv.build("0.3.0")


@pytest.fixture
def serve_al(redis_server: RedisServer, namespace: str, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start ``rollq serve-al`` processes on the test's namespace (2 s leases; more options as arguments);
    each call returns its endpoint."""
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(*extra: str) -> str:
        port = free_port()
        log = tmp_path / f"serve-al-{len(started)}.log"
        process = subprocess.Popen(
            [ROLLQ, "--url", redis_server.url, "-n", namespace, "serve-al", "--port", str(port)]
            + ["--lease", "2", "--heartbeat", "0.2", *extra],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        started.append((process, log))
        endpoint = f"http://127.0.0.1:{port}/"
        wait_until(lambda: answers(endpoint), f"serve-al on port {port} to answer", timeout=20)
        return endpoint

    yield start
    for process, log in started:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Callable[[str], Dashboard]]:
    """Start ``rollq dashboard`` subprocesses on a Redis URL: ``dashboard(url)``; stopped and logged at the end."""
    started: list[Dashboard] = []

    def start(redis_url: str) -> Dashboard:
        started.append(Dashboard(redis_url, tmp_path / f"dashboard-{len(started)}.log"))
        return started[-1]

    yield start
    for d in started:
        d.stop()
        print(f"--- {d.log_path.name} ---\n{d.log()[-4000:]}")


@pytest.fixture
def url() -> str:
    """An embedded Redis (``memory://``) of the test's own, shared by its producer and in-process workers."""
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def producer(url: str, namespace: str) -> Producer:
    """A Producer on the test's embedded Redis (tests on a real server build their own on ``redis_server.url``)."""
    return Producer.from_url(url, namespace)


@pytest.fixture
def rollq(url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """Run ``rollq --url URL -n NAMESPACE ARGS...`` in-process (``input=`` for stdin, ``url_=`` for another URL);
    stdout and stderr are kept apart; the environment's URL and namespace are cleared first."""
    for name in ("ROLLQ_REDIS_URL", "REDIS_URL", "ROLLQ_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: str, input: str | None = None, url_: str | None = None) -> Result:
        return CliRunner().invoke(main, ["--url", url_ or url, "-n", namespace, *args], input=input, prog_name="rollq")

    return run


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    """The fake vLLM server (token ids and logprobs in vLLM's spelling) on a free port."""
    server = FakeVLLM().start()
    yield server
    server.stop()
