"""EmbeddedRedis: fakeredis over TCP, good enough for a stock ``rq worker`` subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import psutil
import pytest
import redis
from fakeredis._socket import FakeSocket
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer
from rq.worker import Worker, WorkerStatus

from rollq.store.embedded import EmbeddedRedis

# tests/ is not a package: the rq worker subprocess imports the job functions as `embedded_jobs.<name>`.
JOBS_DIR = Path(__file__).resolve().parents[1] / "support"


@pytest.fixture
def embedded() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


def rq_worker(url: str, queue_name: str, *options: str) -> list[str]:
    return [
        sys.executable, "-m", "rq.cli", "worker", "--url", url,
        "-S", "rq.serializers.JSONSerializer", "-w", "rq.worker.SimpleWorker", *options, queue_name,
    ]  # fmt: skip


# A stock RQ worker's pubsub thread waits up to 60 s at a time, and redis-py 8.2's PubSubWorkerThread.stop() joins it
# with no bound: about one stop in twenty, the thread has read the UNSUBSCRIBE reply before its flag was cleared, and
# the worker's exit waits out that minute (py-spy: BaseWorker.teardown -> unsubscribe -> PubSubWorkerThread.stop ->
# join). rollq's own worker wakes that thread each second (docs/rq.md, `subscribe`); these tests run stock RQ.
STOCK_WORKER_EXIT_SECONDS = 60 + 30


def worker_env() -> dict[str, str]:
    path = [str(JOBS_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def test_url_names_the_port_picked_at_start() -> None:
    server = EmbeddedRedis()
    with pytest.raises(RuntimeError):
        _ = server.url
    with server:
        assert server.url.startswith("redis://127.0.0.1:")
        assert server.url.endswith("/0")
        assert redis.Redis.from_url(server.url).ping()


def test_pipelines_do_not_stall_on_nagle(embedded: EmbeddedRedis) -> None:
    # With Nagle's algorithm on, every pipeline waits ~44 ms for a delayed ACK: 100 of them would take over 4 s.
    client = redis.Redis.from_url(embedded.url)
    started = time.perf_counter()
    for i in range(100):
        pipe = client.pipeline(transaction=i % 2 == 0)
        pipe.set("n", i)
        pipe.get("n")
        pipe.incr("count")
        assert pipe.execute() == [True, str(i).encode(), i + 1]
    assert time.perf_counter() - started < 2.0


def test_connection_survives_an_error_reply(embedded: EmbeddedRedis) -> None:
    client = redis.Redis.from_url(embedded.url, single_connection_client=True)
    client_id = client.client_id()
    client.set("text", "not a number")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        client.incr("text")
    assert client.get("text") == b"not a number"
    assert client.client_id() == client_id  # the same server-side connection: nothing reconnected


def test_command_crashing_inside_fakeredis_is_an_error_reply(
    embedded: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(self: FakeSocket, *args: Any) -> None:
        raise RuntimeError("fakeredis bug")

    monkeypatch.setattr(FakeSocket, "echo", crash)
    # One connection for plain commands and pipelines alike.
    client = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(embedded.url, max_connections=1))
    client_id = client.client_id()
    # The commands pipelined behind the crashing one are still answered, on the same connection.
    pipe = client.pipeline(transaction=False)
    pipe.echo("hello")
    pipe.ping()
    pipe.client_id()
    replies = pipe.execute(raise_on_error=False)
    assert isinstance(replies[0], redis.ResponseError)
    assert "RuntimeError: fakeredis bug" in str(replies[0])
    assert replies[1:] == [True, client_id]


def test_unparseable_input_gets_a_protocol_error_and_is_disconnected_like_redis(embedded: EmbeddedRedis) -> None:
    host, port = embedded.url.removeprefix("redis://").removesuffix("/0").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"$4\r\nPING\r\n")  # a bulk string, not an array: fakeredis cannot parse it
        received = b""
        while chunk := conn.recv(4096):
            received += chunk
    assert received.startswith(b"-ERR Protocol error")


def test_in_process_client_sees_keys_written_over_tcp(embedded: EmbeddedRedis) -> None:
    redis.Redis.from_url(embedded.url).set("written-over-tcp", "yes")
    local = fakeredis.FakeRedis(server=embedded.fake_server)
    assert local.get("written-over-tcp") == b"yes"
    local.set("written-in-process", "yes")
    assert redis.Redis.from_url(embedded.url).get("written-in-process") == b"yes"


def test_stop_disconnects_a_client_blocked_in_blpop() -> None:
    server = EmbeddedRedis().start()
    client = redis.Redis.from_url(server.url, socket_timeout=20)
    client.ping()
    outcome: list[BaseException | None] = []

    def block() -> None:
        try:
            client.blpop(["never-filled"], timeout=30)
            outcome.append(None)
        except redis.ConnectionError as error:
            outcome.append(error)

    blocked = threading.Thread(target=block, daemon=True)
    blocked.start()
    time.sleep(0.3)  # let BLPOP park on the server
    server.stop()
    blocked.join(timeout=10)
    assert outcome and isinstance(outcome[0], redis.ConnectionError)


def test_rq_worker_subprocess_drains_jobs(embedded: EmbeddedRedis) -> None:
    connection = redis.Redis.from_url(embedded.url)
    queue = Queue(f"embedded-{uuid.uuid4().hex[:8]}", connection=connection, serializer=JSONSerializer)
    jobs = queue.enqueue_many([Queue.prepare_data("embedded_jobs.noop") for _ in range(20)])

    worker = subprocess.run(
        rq_worker(embedded.url, queue.name, "--burst"), env=worker_env(), capture_output=True, text=True,
        timeout=STOCK_WORKER_EXIT_SECONDS,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stderr
    assert queue.count == 0
    assert FinishedJobRegistry(queue=queue).count == 20
    fetched = Job.fetch_many([job.id for job in jobs], connection=connection, serializer=JSONSerializer)
    assert [job.get_status() if job else None for job in fetched] == [JobStatus.FINISHED] * 20


def test_idle_rq_worker_blocks_instead_of_spinning(embedded: EmbeddedRedis) -> None:
    # RQ sees no version (fakeredis has no INFO) and dequeues with BLPOP, which blocks. Were it to use BLMOVE, which
    # fakeredis never blocks on, the worker and the server would each burn ~50% of a core while idle.
    queue = Queue(f"idle-{uuid.uuid4().hex[:8]}", connection=redis.Redis.from_url(embedded.url))
    worker = psutil.Popen(
        rq_worker(embedded.url, queue.name), env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # Measure once start-up (imports, registration, maintenance) is over and the worker waits for jobs.
        deadline = time.monotonic() + 30
        while not any(w.get_state() == WorkerStatus.IDLE for w in Worker.all(queue=queue)):
            assert worker.poll() is None and time.monotonic() < deadline, "the worker never went idle"
            time.sleep(0.1)
        time.sleep(0.2)
        worker_before, server_before, started = sum(worker.cpu_times()[:2]), time.process_time(), time.perf_counter()
        time.sleep(2.0)
        elapsed = time.perf_counter() - started
        worker_cpu = (sum(worker.cpu_times()[:2]) - worker_before) / elapsed
        server_cpu = (time.process_time() - server_before) / elapsed
    finally:
        # What is measured is the idle worker, not its exit, which may wait out its pubsub thread's minute (above).
        worker.terminate()
        try:
            worker.wait(timeout=10)
        except psutil.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
    assert worker_cpu + server_cpu < 0.25, (worker_cpu, server_cpu)
