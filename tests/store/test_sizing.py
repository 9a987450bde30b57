"""Memory sizing: a namespace's records projected from its own history, against Redis's maxmemory (issue 25)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from rollq.models.policy import RolloutStatus
from rollq.ops.cli import main
from rollq.producer.producer import Producer
from rollq.store.replies import Claim, Published
from rollq.store.sizing import project_memory, warn_if_oversized
from rollq.store.transitions import Finish
from rollq.worker.config import WorkerSettings
from tests.support.servers import RedisServer, WorkerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis


def _finish_some(producer: Producer, n: int, duration: float) -> None:
    for task in producer.enqueue_many([{"q": i} for i in range(n)]):
        claim = producer.lifecycle.claim(task.rollout_id, producer.keys.job_id(task.rollout_id), "w1")
        assert isinstance(claim, Claim)
        finish = Finish(
            rollout_id=task.rollout_id,
            attempt=claim.attempt,
            rollout_json=f'{{"rollout_id": "{task.rollout_id}", "final_reward": 1.0}}',
            status=RolloutStatus.SUCCEEDED,
            results_maxlen=1000,
            dead_letter=False,
            now=time.time(),
            duration=duration,
            keep_seconds=3600,
        )
        assert isinstance(producer.lifecycle.finish(finish), Published)


def test_the_default_keeps_succeeded_records_an_hour_not_a_week() -> None:
    # Issue 25: 7 days of records at 32,000 rollouts/s is about 21 TB.
    assert WorkerSettings.from_env({}).keep_seconds == 3600


def test_a_worker_warns_when_its_namespace_records_would_outgrow_maxmemory(
    own_redis: Callable[..., RedisServer], namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = own_redis()
    client = server.client()
    client.config_set("maxmemory", "64mb")
    producer = Producer.from_url(server.url, namespace)
    assert (
        project_memory(client, producer.keys, keep_seconds=3600, result_ttl=3600, results_max_bytes=1, concurrency=1)
        is None
    )
    _finish_some(producer, 10, duration=0.05)

    fast = project_memory(
        client, producer.keys, keep_seconds=3600, result_ttl=3600, results_max_bytes=10**6, concurrency=256
    )
    assert fast is not None and fast.maxmemory == 64 * 2**20
    assert fast.rollouts_per_second == pytest.approx(256 / 0.05, rel=0.3)
    assert 200 < fast.record_bytes < 20_000
    with caplog.at_level(logging.WARNING, logger="rollq.store.sizing"):
        assert warn_if_oversized(fast)
    assert "more than maxmemory 0.1 GB" in caplog.text and "ROLLQ_KEEP_SECONDS" in caplog.text
    # Redis's defaults: RQ's per-job result streams hold 4 KB nodes, and hashes with long values are hash tables.
    assert "CONFIG SET stream-node-max-bytes 512 hash-max-listpack-value 256" in caplog.text
    caplog.clear()
    client.config_set("stream-node-max-bytes", 512)
    client.config_set("hash-max-listpack-value", 256)
    smaller = project_memory(
        client, producer.keys, keep_seconds=3600, result_ttl=3600, results_max_bytes=10**6, concurrency=256
    )
    with caplog.at_level(logging.WARNING, logger="rollq.store.sizing"):
        assert warn_if_oversized(smaller)
    assert "ROLLQ_RESULT_TTL" in caplog.text and "CONFIG SET" not in caplog.text

    slow = project_memory(client, producer.keys, keep_seconds=60, result_ttl=60, results_max_bytes=10**6, concurrency=1)
    assert slow is not None and slow.fits and not warn_if_oversized(slow)


def test_a_worker_says_at_start_up_that_records_kept_for_ever_do_not_fit(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    env = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}
    first = workers(redis_server.url, namespace, env=env)
    producer.wait([t.rollout_id for t in producer.enqueue_many([{"sleep": 0}] * 5)], timeout=30)
    assert "memory:" not in first.log()  # nothing had finished when it started: nothing to project from
    second = workers(redis_server.url, namespace, env={**env, "ROLLQ_KEEP_SECONDS": "0"})
    wait_until(lambda: "Listening on" in second.log() or "memory:" in second.log(), "the second worker started")
    wait_until(lambda: "keeping succeeded task records" in second.log(), "the memory warning", timeout=10)
    assert "for ever (ROLLQ_KEEP_SECONDS=0)" in second.log()


def test_the_projection_counts_rqs_finished_job_with_its_results_stream_for_result_ttl(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    # RQ keeps each finished job's return value in a stream of its own (rq:results:<job>), and Redis gives a new
    # stream a 4 KB node: that stream was most of what a rollout leaves in Redis, and the projection left it out.
    producer = Producer.from_url(redis_server.url, namespace)
    workers(redis_server.url, namespace, env={"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"})
    tasks = producer.enqueue_many([{"sleep": 0}] * 5)
    producer.wait([t.rollout_id for t in tasks], timeout=30)
    client = redis_server.client()
    left = [
        sum(
            int(client.memory_usage(key) or 0)
            for key in (producer.keys.task(t.rollout_id), f"rq:job:{jid}", f"rq:results:{jid}")
        )
        for t in tasks
        for jid in [producer.keys.job_id(t.rollout_id)]
    ]
    assert all(client.exists(f"rq:results:{producer.keys.job_id(t.rollout_id)}") for t in tasks)

    projection = project_memory(
        client, producer.keys, keep_seconds=3600, result_ttl=600, results_max_bytes=10**6, concurrency=4
    )

    assert projection is not None
    assert projection.record_bytes + projection.job_bytes >= 0.9 * sum(left) / len(left)
    per_second = projection.rollouts_per_second * (3600 * projection.record_bytes + 600 * projection.job_bytes)
    assert projection.projected_bytes == pytest.approx(per_second + 10**6 * 1.15, rel=0.01)


def test_rollq_status_says_what_a_finished_rollout_keeps_and_which_redis_settings_keep_less(
    own_redis: Callable[..., RedisServer], namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    server = own_redis()
    producer = Producer.from_url(server.url, namespace)
    workers(server.url, namespace, env={"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"})
    producer.wait([t.rollout_id for t in producer.enqueue_many([{"sleep": 0}] * 3)], timeout=30)

    def status(*args: str) -> str:
        result = CliRunner().invoke(main, ["--url", server.url, "-n", namespace, "status", *args], prog_name="rollq")
        assert result.exit_code == 0, result.output
        return result.stdout

    [line] = [ln for ln in status().splitlines() if ln.strip().startswith("per rollout kept")]
    assert "RQ's finished job ~" in line and "(ROLLQ_RESULT_TTL)" in line
    assert "Redis has stream-node-max-bytes 4096, hash-max-listpack-value 64: set stream-node-max-bytes 512" in line
    assert json.loads(status("--json"))["retained"]["job_bytes"] > 4096  # the 4 KB node of its results stream

    client = server.client()
    client.config_set("stream-node-max-bytes", 512)
    client.config_set("hash-max-listpack-value", 256)
    assert "Redis has" not in status()
