"""Shared fixtures: a private redis-server, worker subprocesses, fresh namespaces."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from servers import RedisServer, Replicated, WorkerProcess


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
    import al_venv

    return al_venv.build("0.1.2")


@pytest.fixture(scope="session")
def al02_bin() -> Path:
    """``bin/`` of a venv with Agent Lightning 0.2.2 and rollq."""
    import al_venv

    return al_venv.build("0.2.2")


@pytest.fixture(scope="session")
def al03_bin() -> Path:
    """``bin/`` of a venv with Agent Lightning 0.3.0 and rollq."""
    import al_venv

    return al_venv.build("0.3.0")
