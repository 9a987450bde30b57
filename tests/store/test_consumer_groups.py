"""Consumer groups have a lifecycle: an abandoned one stops pinning the results stream once idle past the bound
(what it then loses is counted for it), `rollq groups list/delete/idle-after`, idle groups in `rollq status`
and `/metrics`."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable

import pytest

from rollq.producer import Producer
from tests.support.servers import ROLLQ, RedisServer, WorkerProcess

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent", "ROLLQ_CONCURRENCY": "8", "ROLLQ_RESULTS_MAXLEN": "20"}


def _run(producer: Producer, n: int) -> None:
    """Queue ``n`` quick tasks and wait until each has ended (their rollouts may be trimmed: records are read)."""
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0}] * n)]
    deadline = time.monotonic() + 120
    while True:
        pipe = producer.connection.pipeline(transaction=False)
        for rid in ids:
            pipe.hget(producer.keys.task(rid), "ended")
        if all(pipe.execute()):
            return
        assert time.monotonic() < deadline, "tasks did not finish"
        time.sleep(0.1)


def _rollq(url: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ROLLQ, "--url", url, "-n", namespace, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.redis
def test_an_abandoned_group_stops_pinning_the_results_stream_once_idle_and_can_be_listed_and_deleted(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    client = producer.connection
    workers(redis_server.url, namespace, env=AGENT)
    _run(producer, 5)
    # A reader that read one rollout and went away (a Ctrl-C'd `rollq rollouts tail --group g1`).
    client.xgroup_create(producer.keys.results, "g1", id="0")
    client.xreadgroup("g1", "reader-1", {producer.keys.results: ">"}, count=1)
    assert _rollq(redis_server.url, namespace, "groups", "idle-after", "1").stdout.strip() == "1"
    time.sleep(1.5)

    _run(producer, 100)

    # Before: the group pinned all 105 entries where the bound was 20.
    assert client.xlen(producer.keys.results) <= 21
    listed = json.loads(_rollq(redis_server.url, namespace, "groups", "list", "--json").stdout)
    (g1,) = listed["groups"]
    assert (g1["name"], g1["idle"], g1["consumers"]) == ("g1", True, 1) and g1["lost"] >= 80
    assert "IDLE" in _rollq(redis_server.url, namespace, "status").stdout
    metrics = _rollq(redis_server.url, namespace, "status", "--prometheus").stdout
    assert f'rollq_consumer_group_idle{{group="g1",namespace="{namespace}"}} 1.0' in metrics

    assert _rollq(redis_server.url, namespace, "groups", "delete", "g1").stdout.strip() == "deleted g1"
    assert json.loads(_rollq(redis_server.url, namespace, "groups", "list", "--json").stdout)["groups"] == []


@pytest.mark.redis
def test_an_active_group_still_holds_back_trimming(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    client = producer.connection
    workers(redis_server.url, namespace, env=AGENT)
    _run(producer, 1)
    client.xgroup_create(producer.keys.results, "busy", id="0")
    assert client.xreadgroup("busy", "reader-1", {producer.keys.results: ">"}, count=1)  # a consumer, just now
    _run(producer, 60)
    # Within the default hour the reader may come back for everything it has not read.
    assert client.xlen(producer.keys.results) == 61
    (busy,) = json.loads(_rollq(redis_server.url, namespace, "groups", "list", "--json").stdout)["groups"]
    assert busy["idle"] is False and busy["lost"] == 0


def _rollq_fails(url: str, namespace: str, *args: str) -> str:
    done = subprocess.run([ROLLQ, "--url", url, "-n", namespace, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.stdout, done.stderr)
    return done.stderr


@pytest.mark.redis
def test_groups_commands_name_a_results_trim_hash_or_stream_of_another_type_in_one_line(
    redis_server: RedisServer, namespace: str
) -> None:
    # A helper's audit: list, idle-after and delete failed with Redis's bare WRONGTYPE where the trim hash (or the
    # results stream) held another type; the rest of rollq names the key and its type.
    producer = Producer.from_url(redis_server.url, namespace)
    client, keys = producer.connection, producer.keys
    client.xgroup_create(keys.results, "g1", id="0", mkstream=True)
    client.rpush(keys.results_trim, "not a hash")
    named = (
        f"rollq: the results trim hash {keys.results_trim} is a list, not a hash: something other than rollq wrote it"
    )
    for args in (["list"], ["list", "--json"], ["idle-after"], ["idle-after", "5"], ["idle-after", "--default"]):
        assert _rollq_fails(redis_server.url, namespace, "groups", *args) == named + "\n", args
    assert _rollq_fails(redis_server.url, namespace, "groups", "delete", "g1") == named + "\n"
    assert client.lrange(keys.results_trim, 0, -1) == [b"not a hash"]  # left for whoever wrote it to explain
    assert [g["name"] for g in client.xinfo_groups(keys.results)] == [b"g1"]  # a failed delete removed nothing
    client.delete(keys.results_trim, keys.results)
    client.set(keys.results, "junk")
    named = f"rollq: the results stream {keys.results} is a string, not a stream: something other than rollq wrote it"
    for args in (["list"], ["delete", "g1"]):
        assert _rollq_fails(redis_server.url, namespace, "groups", *args) == named + "\n", args
