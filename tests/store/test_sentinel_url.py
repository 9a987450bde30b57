"""redis+sentinel:// URLs: parsed into a Sentinel-managed client of the named primary."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.sentinel import SentinelConnectionPool

from rollq.producer.aio import AsyncProducer
from rollq.producer.producer import Producer
from rollq.store.connection import check_reachable, connect, connect_async, describe_client
from tests.support.servers import REPO, RQ, RedisServer, Replicated, WorkerProcess, free_port, require_redis_server
from tests.support.waiting import wait_until


def test_sentinel_url_names_the_sentinels_service_db_and_primary_password() -> None:
    client = connect("redis+sentinel://:s3cret@10.0.0.1:26380,10.0.0.2/rollq-primary/3")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "rollq-primary"
    assert pool.connection_kwargs["db"] == 3
    assert pool.connection_kwargs["password"] == "s3cret"
    sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(s["host"], s["port"]) for s in sentinels] == [("10.0.0.1", 26380), ("10.0.0.2", 26379)]
    assert client.get_retry() is not None  # the same retry policy as a redis:// client


_MALFORMED = [
    "redis+sentinel://h:26379/",
    "redis+sentinel://h:26379/svc/0/extra",
    "redis+sentinel://:26379/svc",
    "redis+sentinel://h:port/svc",
    "redis+sentinel://h:26379/svc/zero",
]


@pytest.mark.parametrize("url", _MALFORMED)
def test_sentinel_url_without_a_service_or_host_is_rejected(url: str) -> None:
    with pytest.raises(ValueError, match="service_name"):
        connect(url)


@pytest.mark.parametrize("url", _MALFORMED)
def test_a_malformed_sentinel_url_is_rejected_by_the_async_client_with_the_expected_form(url: str) -> None:
    with pytest.raises(ValueError, match=r"expected redis\+sentinel://\[:password@\]host:port"):
        connect_async(url)


def test_an_async_sentinel_url_names_the_sentinels_service_db_and_primary_password() -> None:
    client = connect_async("redis+sentinel://:s3cret@10.0.0.1:26380,10.0.0.2/rollq-primary/3", max_connections=4)
    pool = client.connection_pool
    assert isinstance(pool, AsyncSentinelPool) and isinstance(pool, BlockingConnectionPool)
    assert (pool.service_name, pool.max_connections) == ("rollq-primary", 4)
    assert pool.connection_kwargs["db"] == 3 and pool.connection_kwargs["password"] == "s3cret"
    sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(s["host"], s["port"]) for s in sentinels] == [("10.0.0.1", 26380), ("10.0.0.2", 26379)]


@pytest.fixture
def sentinel(own_redis: Callable[..., RedisServer], tmp_path: Path) -> Iterator[tuple[RedisServer, str]]:
    """A private primary and one Sentinel watching it: (the primary, the redis+sentinel:// URL)."""
    primary = own_redis()
    port = free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nsentinel monitor rollq-test 127.0.0.1 {primary.port} 1\n"
    )
    process = subprocess.Popen(
        [require_redis_server(), str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield primary, f"redis+sentinel://127.0.0.1:{port}/rollq-test/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.redis
def test_sentinel_url_reaches_the_primary_its_sentinel_names(sentinel: tuple[RedisServer, str]) -> None:
    primary, url = sentinel
    connect(url).set("rollq-sentinel-probe", "1")
    assert primary.client().get("rollq-sentinel-probe") == b"1"


class _Interrupted(Exception):
    pass


@pytest.mark.redis
def test_a_read_cut_short_does_not_hand_its_reply_to_the_next_command(sentinel: tuple[RedisServer, str]) -> None:
    # redis-py's Sentinel connection kept a connection whose read was interrupted (as RQ's SIGTERM
    # handler does to a blocking dequeue): the next command then read the BLPOP's nil as its reply.
    _, url = sentinel
    client = connect(url)
    client.rpush("rollq-desync", "a")

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Interrupted):
            client.blpop(["rollq-empty"], timeout=1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    time.sleep(1.2)  # the BLPOP's nil reply has arrived by now on the connection it was sent on
    assert client.lrange("rollq-desync", 0, -1) == [b"a"]


@pytest.mark.slow
@pytest.mark.redis
def test_a_command_sent_while_the_primary_dies_reaches_the_promoted_replica(tmp_path: Path) -> None:
    # redis-py 8 reconnected a dropped Sentinel connection to the dead primary's address until its
    # retries ran out (~17 s), although the Sentinel named the new primary within seconds.
    binary = require_redis_server()
    primary_port, replica_port, sentinel_port = free_port(), free_port(), free_port()
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    config = tmp_path / "sentinel.conf"
    config.write_text(
        f"port {sentinel_port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor rollq-fo 127.0.0.1 {primary_port} 1\n"
        "sentinel down-after-milliseconds rollq-fo 500\nsentinel failover-timeout rollq-fo 5000\n"
    )
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    primary = subprocess.Popen([binary, "--port", str(primary_port), *common], **quiet)  # type: ignore[call-overload]
    replica = subprocess.Popen(
        [binary, "--port", str(replica_port), *common, "--replicaof", "127.0.0.1", str(primary_port)],
        **quiet,  # type: ignore[call-overload]
    )
    sentinel = subprocess.Popen([binary, str(config), "--sentinel"], **quiet)  # type: ignore[call-overload]
    try:
        wait_until(
            lambda: redis.Redis(port=replica_port).info("replication")["master_link_status"] == "up",
            "the replica in sync",
            timeout=10,
        )
        wait_until(
            lambda: int(redis.Redis(port=sentinel_port).sentinel_master("rollq-fo")["num-slaves"]) >= 1,
            "the Sentinel seeing the replica",
            timeout=10,
        )
        client = connect(f"redis+sentinel://127.0.0.1:{sentinel_port}/rollq-fo/0")
        client.set("before", "1")
        came_back: list[float] = []

        def blocked() -> None:
            client.blpop(["rollq-empty"], timeout=2)  # in flight when the primary dies, then sent again
            came_back.append(time.monotonic())

        thread = threading.Thread(target=blocked)
        thread.start()
        time.sleep(0.3)
        primary.kill()
        primary.wait()
        killed = time.monotonic()
        promoted = wait_until(
            lambda: (
                redis.Redis(port=sentinel_port).sentinel_get_master_addr_by_name("rollq-fo")[1] == replica_port
                and time.monotonic()
            ),
            "the Sentinel naming the replica as the new primary",
            timeout=60,
        )
        thread.join(timeout=60)
        client.set("after", "1")
        assert redis.Redis(port=replica_port).get("after") == b"1"
        # Timed from when the Sentinel named the new primary (1-2 s after the kill on a quiet machine, longer under
        # a full test run's load, where the whole command once took 9.5 s from the kill): from there, the client's
        # reconnect and the BLPOP's own 2 s on the new primary. Retrying the dead address took ~17 s from the kill.
        assert came_back, "the blocked command never came back"
        assert came_back[0] - promoted < 6, (
            f"the blocked command came back {came_back[0] - promoted:.1f} s after the Sentinel named the new primary"
            f" ({promoted - killed:.1f} s after the kill)"
        )
    finally:
        for process in (sentinel, replica, primary):
            process.kill()
            process.wait()


@pytest.mark.redis
def test_the_cli_reachability_check_and_start_up_log_accept_a_sentinel_url(sentinel: tuple[RedisServer, str]) -> None:
    # `rollq worker` checks the URL before starting; that check once parsed only redis://, rediss://, unix://.
    _, url = sentinel
    assert check_reachable(url) == url
    assert describe_client(connect(url)) == url


@pytest.mark.redis
def test_an_async_producer_over_sentinel_enqueues_and_reads_a_rollout(
    replicated: Replicated, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    async def main() -> None:
        async with AsyncProducer.from_url(replicated.url, namespace) as producer:
            assert isinstance(producer.connection.connection_pool, AsyncSentinelPool)
            task = await producer.enqueue({"sleep": 0})
            assert replicated.primary.client().exists(producer.keys.task(task.rollout_id))
            workers(replicated.primary.url, namespace, env={"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"})
            [rollout] = await producer.wait([task.rollout_id], timeout=30)
            assert rollout.rollout_id == task.rollout_id and rollout.metadata["status"] == "succeeded"
            assert (await producer.get_rollout(task.rollout_id)) is not None

    asyncio.run(main())


@pytest.mark.redis
def test_an_async_sentinel_client_waits_for_a_free_connection_instead_of_failing(replicated: Replicated) -> None:
    # redis-py's asyncio Sentinel pool raises "Too many connections" past max_connections; a trainer
    # gathering thousands of coroutines must queue on the pool, as it does on a redis:// URL.
    async def main() -> None:
        client = connect_async(replicated.url, max_connections=2)
        replies = await asyncio.gather(*(client.blpop([f"rollq-empty-{i}"], timeout=0.2) for i in range(6)))
        assert replies == [None] * 6
        await client.aclose()

    asyncio.run(main())


@pytest.mark.redis
def test_an_async_command_after_the_primary_dies_reaches_the_promoted_replica(replicated: Replicated) -> None:
    # As the blocking client (see above): a dropped connection asks the Sentinel again rather than
    # retrying the dead primary's address until its retries run out.
    async def main() -> float:
        client = connect_async(replicated.url)
        await client.set("before", "1")
        assert replicated.primary.process is not None
        replicated.primary.process.kill()
        replicated.primary.process.wait()
        started = time.monotonic()
        await client.set("after", "1")
        took = time.monotonic() - started
        await client.aclose()
        return took

    took = asyncio.run(main())
    assert replicated.replica.client().get("after") == b"1"
    assert took < 8, f"the write took {took:.1f} s to reach the promoted replica"


# Every entry point takes a redis+sentinel:// URL, whichever way it is given (issue 25). RQ's own CLI builds
# its client with redis-py's Redis.from_url, which refused the scheme with a ValueError before any rollq code ran.
_RQ_URL_WAYS = ["--url", "RQ_REDIS_URL", "ROLLQ_REDIS_URL", "-c module"]


@pytest.mark.redis
@pytest.mark.parametrize("way", _RQ_URL_WAYS)
def test_a_stock_rq_worker_given_a_sentinel_url_runs_rollouts(
    replicated: Replicated, namespace: str, workers: Callable[..., WorkerProcess], tmp_path: Path, way: str
) -> None:
    env = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}
    url: str | None = None
    args: list[str] = []
    if way == "--url":
        url = replicated.url
    elif way == "-c module":
        (tmp_path / "rq_sentinel_settings.py").write_text(f"REDIS_URL = {replicated.url!r}\n")
        args = ["-c", "rq_sentinel_settings", "--path", str(tmp_path)]
    else:
        env[way] = replicated.url
    worker = workers(url, namespace, env=env, args=args)
    producer = Producer.from_url(replicated.url, namespace)
    try:
        [rollout] = producer.wait([producer.enqueue({"sleep": 0}).rollout_id], timeout=30)
    except TimeoutError:
        raise AssertionError(worker.log()) from None
    assert rollout.metadata["status"] == "succeeded"
    assert "ValueError" not in worker.log()


@pytest.mark.redis
def test_a_stock_rq_worker_given_another_redis_than_rollq_redis_url_refuses_to_start(
    replicated: Replicated, own_redis: Callable[..., RedisServer], namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    # Both name a Sentinel service, so the comparison must tell services apart, not primaries' hosts (None).
    other = own_redis()
    worker = workers(other.url, namespace, env={"ROLLQ_AGENT": "x:y", "ROLLQ_REDIS_URL": replicated.url})
    assert worker.wait(timeout=60) != 0
    assert "ROLLQ_REDIS_URL is redis+sentinel://" in worker.log()
    same = workers(replicated.url, namespace + "-same", env={"ROLLQ_REDIS_URL": replicated.url, "ROLLQ_AGENT": "x:y"})
    assert same.wait(timeout=60) != 0
    assert "ROLLQ_REDIS_URL is" not in same.log()  # it got past the check (and then failed on the bad agent)


@pytest.mark.redis
def test_rollq_worker_and_commands_take_a_sentinel_url_from_rollq_redis_url(
    replicated: Replicated, namespace: str
) -> None:
    rollq = str(Path(RQ).parent / "rollq")
    env = {**os.environ, "ROLLQ_REDIS_URL": replicated.url, "ROLLQ_NAMESPACE": namespace, "PYTHONPATH": str(REPO)}
    enqueued = subprocess.run(
        [rollq, "enqueue"], input='{"input": {"sleep": 0}}\n', capture_output=True, text=True, timeout=60, env=env
    )
    assert enqueued.returncode == 0, enqueued.stderr
    worked = subprocess.run(
        [rollq, "worker", "--burst", "--agent", "tests.support.fault_agents:FaultAgent"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert worked.returncode == 0, worked.stderr
    status = subprocess.run([rollq, "status", "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["succeeded"] == 1, status.stdout


@pytest.mark.redis
def test_a_producer_with_no_url_uses_a_sentinel_rollq_redis_url(
    replicated: Replicated, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLQ_REDIS_URL", replicated.url)
    producer = Producer.from_url(namespace=namespace)
    assert isinstance(producer.connection.connection_pool, SentinelConnectionPool)
    task = producer.enqueue({"q": 1})
    assert replicated.primary.client().exists(producer.keys.task(task.rollout_id)) == 1
    aio = AsyncProducer.from_url(namespace=namespace)
    assert isinstance(aio.connection.connection_pool, AsyncSentinelPool)
    assert asyncio.run(aio.get_task(task.rollout_id)) is not None


@pytest.mark.redis
def test_the_dashboard_and_its_metrics_read_a_namespace_through_a_sentinel_url(
    replicated: Replicated, namespace: str
) -> None:
    pytest.importorskip("rq_dashboard")
    from rollq.ops.dashboard import create_app

    Producer.from_url(replicated.url, namespace).enqueue({"q": 1})
    client = create_app(replicated.url, namespace).test_client()
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert f'rollq_queue_depth{{namespace="{namespace}"}} 1.0' in metrics.get_data(as_text=True)
    assert client.get("/").status_code == 200  # rq-dashboard's own page, through its Sentinel URL parser
