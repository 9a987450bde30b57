"""Delivery a trainer can trust, on a real redis-server and real worker processes (issue 12).

Re-runs are visible (generation), trimming never leaves a silent gap, the
stream is bounded in bytes, and readers ride out Redis outages.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_agents import wait_until

from rollq.models.errors import RolloutsTrimmedError
from rollq.producer.producer import Producer

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.fault_agents:FaultAgent"}
ROLLQ = str(Path(sys.executable).parent / "rollq")


def test_a_rerun_after_a_dead_letter_requeue_carries_the_next_generation(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace)
    fine = producer.enqueue({"sleep": 0}).rollout_id
    rid = producer.enqueue({"raise": "deterministic bug"}).rollout_id
    workers(redis_server.url, namespace, env=AGENT)
    reader = iter(producer.rollouts("trainers", idle_timeout=10))
    first = {r.rollout_id: r for r in (next(reader), next(reader))}
    assert first[fine].metadata["generation"] == 1
    assert (first[rid].metadata["status"], first[rid].metadata["generation"]) == ("failed", 1)

    assert producer.requeue_dead([rid]) == [rid]
    second = next(reader)
    assert (second.rollout_id, second.metadata["status"], second.metadata["generation"]) == (rid, "failed", 2)
    assert producer.wait([rid], timeout=10)[0].metadata["generation"] == 2

    wait_until(lambda: producer.dead_letter() == [rid], 10, "the re-run to be dead-lettered again")
    assert producer.requeue_dead([rid]) == [rid]
    assert next(reader).metadata["generation"] == 3


def _ids(producer: Producer, n: int, spec: dict | None = None) -> list[str]:
    return [t.rollout_id for t in producer.enqueue_many([spec or {"sleep": 0}] * n)]


def test_a_consumer_group_behind_the_count_bound_loses_nothing(redis_server, namespace, workers):
    # 1000 rollouts finish before the group reads any; the count bound is 100.
    producer = Producer.from_url(redis_server.url, namespace, results_maxlen=100)
    reader = producer.rollouts("trainers", idle_timeout=2)
    reader._ensure_group()
    ids = _ids(producer, 1000)
    env = {**AGENT, "ROLLQ_RESULTS_MAXLEN": "100", "ROLLQ_CONCURRENCY": "32"}
    workers(redis_server.url, namespace, env=env)
    wait_until(lambda: producer.connection.hget(producer.keys.task(ids[-1]), "state") == b"succeeded", 60, "the run")
    wait_until(lambda: all(s is not None for s in _states(producer, ids)), 30, "every task to end")

    received = [r.rollout_id for r in reader]
    assert sorted(received) == sorted(ids)
    # Once the group has read them, the next publish trims the stream back to its bound.
    producer.enqueue({"sleep": 0})
    wait_until(lambda: producer.connection.xlen(producer.keys.results) <= 100, 30, "the stream to be trimmed")


def _states(producer: Producer, ids: list[str]) -> list[bytes | None]:
    pipe = producer.connection.pipeline(transaction=False)
    for rid in ids:
        pipe.hget(producer.keys.task(rid), "ended")
    return pipe.execute()


def test_the_hard_byte_limit_trims_a_lagging_group_and_its_reader_says_how_many_it_lost(
    redis_server, namespace, workers
):
    limit = 200_000  # about 85 rollouts of 2.3 kB; routine trimming keeps half
    producer = Producer.from_url(redis_server.url, namespace, results_max_bytes=limit)
    reader = producer.rollouts("trainers", idle_timeout=2)
    reader._ensure_group()
    ids = _ids(producer, 300, {"huge": 2000})
    env = {**AGENT, "ROLLQ_RESULTS_MAX_BYTES": str(limit), "ROLLQ_MAX_RESULT_BYTES": "10000", "ROLLQ_CONCURRENCY": "8"}
    workers(redis_server.url, namespace, env=env)
    wait_until(lambda: all(s is not None for s in _states(producer, ids)), 60, "every task to end")

    connection = producer.connection
    payload = sum(len(f[b"rollout_id"]) + len(f[b"rollout"]) for _, f in connection.xrange(producer.keys.results))
    assert int(connection.hget(producer.keys.stats, "results:bytes")) == payload
    assert payload <= limit

    received: list[str] = []
    with pytest.raises(RolloutsTrimmedError) as lost:
        received += [r.rollout_id for r in reader]
    assert lost.value.group == "trainers" and lost.value.lost > 100
    assert f"{lost.value.lost} rollout(s)" in str(lost.value) and lost.value.from_id in str(lost.value)
    received += [r.rollout_id for r in reader]  # the reader carries on after saying so
    assert len(received) + lost.value.lost == len(ids)
    assert set(received) <= set(ids) and len(set(received)) == len(received)

    status = subprocess.run(
        [ROLLQ, "--url", redis_server.url, "-n", namespace, "status"], capture_output=True, text=True, timeout=60
    )
    assert f"lost {lost.value.lost} to trimming" in status.stdout, status.stdout
    assert "kB" in status.stdout and "oldest" in status.stdout


WAITER = """
import json, sys
from rollq.models.errors import RolloutTimeoutError, RolloutTrimmedError
from rollq.producer.producer import Producer

url, namespace, ids_file = sys.argv[1:]
producer = Producer.from_url(url, namespace, results_maxlen=100)
ids = json.load(open(ids_file))
print("waiting", flush=True)
try:
    producer.wait(ids, timeout=25)
    print(json.dumps({"returned": len(ids)}))
except RolloutTrimmedError as exc:
    print(json.dumps({"trimmed": exc.rollout_ids, "received": sorted(exc.received)}))
except RolloutTimeoutError as exc:
    print(json.dumps({"timeout": exc.missing}))
"""


def test_wait_paused_while_its_rollouts_are_trimmed_reports_them_as_trimmed(
    redis_server, namespace, workers, tmp_path
):
    producer = Producer.from_url(redis_server.url, namespace, results_maxlen=100)
    ids = _ids(producer, 1000)
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAITER, redis_server.url, namespace, str(tmp_path / "ids.json")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiter.stdout is not None and waiter.stdout.readline() == "waiting\n"
        time.sleep(1.0)  # past wait()'s first look at the task records
        waiter.send_signal(signal.SIGSTOP)
        workers(redis_server.url, namespace, env={**AGENT, "ROLLQ_RESULTS_MAXLEN": "100", "ROLLQ_CONCURRENCY": "32"})
        wait_until(lambda: all(s is not None for s in _states(producer, ids)), 60, "every task to end")
        assert producer.connection.xlen(producer.keys.results) <= 100
        waiter.send_signal(signal.SIGCONT)
        outcome = json.loads(waiter.communicate(timeout=60)[0])
    finally:
        waiter.kill()
    assert "trimmed" in outcome, outcome
    assert len(outcome["trimmed"]) >= 850  # the stream keeps about its last 100
    assert sorted(outcome["trimmed"] + outcome["received"]) == sorted(ids)
    assert set(_states(producer, outcome["trimmed"])) != {None}
