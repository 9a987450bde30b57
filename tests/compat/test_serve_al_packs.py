"""``rollq serve-al`` hands out the tasks of packs (``tasks_per_job`` > 1) at once, each exactly once: a pack it
dequeues is split there and then into single-task jobs at the front of the queue (``lua/split.lua``), not set aside
for the reapers' lost-job sweep (tens of seconds per task). Real redis-server and ``rollq serve-al`` processes, Agent
Lightning 0.1's HTTP exchange spoken with urllib; the kill-safety check drives the transitions directly."""

from __future__ import annotations

import time

import pytest

from rollq.compat.gateway import Gateway
from rollq.models.policy import RolloutPolicy, TaskState
from rollq.producer.producer import Producer
from rollq.store.jobs import read_rollq_jobs, rollout_ids_of
from rollq.store.stats import requeue_stat
from tests.support.http_json import get_json as _get
from tests.support.http_json import post_json as _post

pytestmark = pytest.mark.redis


def test_every_task_of_a_pack_is_handed_out_at_once_exactly_once_and_its_rollout_delivered(
    redis_server, namespace, serve_al, tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ROLLQ_TASKS_PER_JOB", "3")  # serve-al's environment too: it warns at start
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=60))
    endpoint = serve_al("--lease", "60")  # no hand-back while the test polls, however slow the machine
    # Packs of 3, 3 and 1 (ROLLQ_TASKS_PER_JOB; a pack of one is claimed as it is).
    ids = [t.rollout_id for t in producer.enqueue_many([{"q": i} for i in range(7)], mode="train")]
    assert producer.connection.llen(producer.keys.rq_queue) == 3

    handed: list[str] = []
    started = time.monotonic()
    while len(handed) < len(ids) and time.monotonic() - started < 5:
        answer = _get(endpoint + "task")
        if answer["is_available"]:
            handed.append(answer["task"]["rollout_id"])
    took = time.monotonic() - started
    # Queue order kept (a pack's tasks go back at the front), each task once, none in 5 s left to a sweep.
    assert [h.partition("#")[0] for h in handed] == ids, (handed, took)
    assert not _get(endpoint + "task")["is_available"]
    k = producer.keys
    assert producer.connection.llen(k.quarantine) == 0
    assert producer.connection.llen(k.rq_queue) == producer.connection.llen(k.rq_intermediate) == 0
    assert int(producer.connection.hget(k.stats, requeue_stat("split")) or 0) == 6

    for reward, client_id in enumerate(handed):
        assert _post(endpoint + "rollout", {"rollout_id": client_id, "final_reward": float(reward)})["status"] == (
            "delivered"
        )
    rollouts = producer.wait(ids, timeout=10)
    assert [r.final_reward for r in rollouts] == [float(i) for i in range(7)]
    assert all((r.metadata["status"], r.metadata["attempt"]) == ("succeeded", 1) for r in rollouts)
    assert producer.connection.xlen(k.results) == len(ids)
    assert all(producer.task_info(rid).state == TaskState.SUCCEEDED for rid in ids)
    log = (tmp_path / "serve-al-0.log").read_text()
    assert "ROLLQ_TASKS_PER_JOB=3: serve-al runs jobs of one task" in log and " ERROR " not in log, log


def test_a_pack_stranded_by_a_gateway_killed_before_its_split_is_put_back_and_split_by_the_next(
    redis_server, namespace
) -> None:  # type: ignore[no-untyped-def]
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=1))
    ids = [t.rollout_id for t in producer.enqueue_many([{"q": 1}, {"q": 2}], tasks_per_job=2)]
    k, connection = producer.keys, producer.connection
    # What a gateway does before the split: the pack into RQ's intermediate list; then it dies.
    pack = connection.lmove(k.rq_queue, k.rq_intermediate, "LEFT", "RIGHT").decode()
    job = read_rollq_jobs(connection, [pack])[pack]
    assert job is not None and not isinstance(job, Exception) and rollout_ids_of(job) == ids

    # The reapers' restore path: marked on one pass, put back whole on a later one.
    now = float(connection.time()[0])
    assert not producer.lifecycle.restore(ids, pack, now)
    assert producer.lifecycle.restore(ids, pack, now + 2)
    assert [j.decode() for j in connection.lrange(k.rq_queue, 0, -1)] == [pack]

    gateway = Gateway(connection, namespace, lease_seconds=30)
    taken = [gateway.next_task(), gateway.next_task()]
    assert [t.rollout_id.partition("#")[0] for t in taken if t is not None] == ids
    assert gateway.next_task() is None
    assert not connection.exists(k.rq_job(pack)) and connection.llen(k.quarantine) == 0
