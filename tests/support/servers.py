"""Real processes for integration tests: a private redis-server and rq worker subprocesses.

Every server is started by the test on a free port in a temporary directory, so
tests never touch a Redis they did not start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from tests.support.binaries import require
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
RQ = str(Path(sys.executable).parent / "rq")
ROLLQ = str(Path(sys.executable).parent / "rollq")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_redis_server() -> str:
    """The redis-server binary (see :func:`tests.support.binaries.require`)."""
    return require("redis-server", "apt-get install redis-server")


class RedisServer:
    """A redis-server of the test's own: free port, private directory, optional password and AOF."""

    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        appendonly: bool = False,
        replica_of: int | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.binary = require_redis_server()
        self.extra = list(extra)
        self.directory = directory
        self.password = password
        self.appendonly = appendonly
        self.replica_of = replica_of
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def start(self) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            "--logfile",
            str(self.directory / "redis.log"),
            # A replica's first sync starts at once: Redis's default waits 5 s for more replicas to share a diskless
            # transfer, which was 5 s of every test that starts a replica.
            "--repl-diskless-sync-delay",
            "0",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        args += self.extra
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start; see {self.directory / 'redis.log'}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # a clean shutdown flushes the AOF
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


class Replicated:
    """A private primary, one replica in sync with it, and one Sentinel watching them (down-after 500 ms).

    ``url`` is the ``redis+sentinel://`` URL of the primary; ``pause_replica`` freezes the replica (SIGSTOP)
    so that it acknowledges nothing, as a replica behind a slow link would.
    """

    SERVICE = "rollq-replicated"

    def __init__(self, directory: Path) -> None:
        (directory / "primary").mkdir(parents=True)
        (directory / "replica").mkdir()
        self.directory = directory
        self.primary = RedisServer(directory / "primary")
        self.replica = RedisServer(directory / "replica", replica_of=self.primary.port)
        self.sentinel: subprocess.Popen[bytes] | None = None
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        directory = self.directory
        self.primary.start()
        self.replica.start()
        self.sentinel_port = free_port()
        config = directory / "sentinel.conf"
        config.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {directory}\n"
            f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {self.SERVICE} 500\nsentinel failover-timeout {self.SERVICE} 5000\n"
        )
        self.sentinel = subprocess.Popen(
            [require_redis_server(), str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        replica, primary = self.replica.client(), self.primary.client()
        wait_until(lambda: replica.info("replication")["master_link_status"] == "up", "the replica in sync")
        # The primary counts a replica for WAIT only once it acknowledged something; before that WAIT says 0.
        wait_until(lambda: bool(primary.set("rollq-warm", "1")) and primary.wait(1, 100) == 1, "a replica ack")
        sentinel = redis.Redis(port=self.sentinel_port)
        wait_until(
            lambda: int(sentinel.sentinel_master(self.SERVICE)["num-slaves"]) >= 1,  # type: ignore[index]
            "the Sentinel seeing the replica",
        )

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.SERVICE}/0"

    def pause_replica(self) -> None:
        assert self.replica.process is not None
        self.replica.process.send_signal(signal.SIGSTOP)

    def resume_replica(self) -> None:
        assert self.replica.process is not None
        self.replica.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.sentinel is not None:
            self.sentinel.kill()
            self.sentinel.wait()
        if self.replica.process is not None:
            self.resume_replica()
        self.replica.stop()
        self.primary.stop()


class WorkerProcess:
    """A stock ``rq worker -w rollq.worker.RolloutWorker`` subprocess with its output in a log file."""

    def __init__(
        self,
        url: str | None,
        namespace: str,
        log_path: Path,
        *,
        env: dict[str, str],
        args: list[str] | None = None,
        cwd: Path | None = None,
        rq: str | Path = RQ,
    ) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115  # closed in wait()
        # From the repository (the default) the test agents import as tests.*; from another directory, as a
        # user's worker would start, only that directory and the installed rollq are on the path.
        path = (
            os.environ.get("PYTHONPATH", "")
            if cwd is not None
            else f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        )
        full_env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **env}
        self.process = subprocess.Popen(
            # url None: no --url, for a URL given RQ's other ways (RQ_REDIS_URL, -c, ROLLQ_REDIS_URL).
            [
                str(rq),
                "worker",
                "-w",
                "rollq.worker.RolloutWorker",
                *(["--url", url] if url else []),
                *(args or []),
                namespace,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd or REPO,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._log.close()

    def stop(self, timeout: float = 60) -> int | None:
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()
        return self.process.wait()
