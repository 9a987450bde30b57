"""The lost-job sweep's round trips: one pass costs a few, not one per queued task.

Found by bench/cluster (issue 25, dead host at `tuned`): a pass reads up to ``AUDIT_SCAN`` (1,000) queued tasks
and sent one ``reissue`` script call, one round trip, for each. It runs on a worker's heartbeat thread, so with
3,000 tasks queued and a 4 ms round trip a pass held that thread 4.2-4.7 s: the worker's own heartbeats and the
namespace's reaping waited behind it, and a dead host's attempts were reaped 9-16 s after it died instead of
``unresponsive_seconds`` (6 s) plus a heartbeat.
"""

from __future__ import annotations

from typing import Any

from redis.connection import Connection

from rollq.producer.producer import Producer
from rollq.store.reaper import _audit


def test_one_sweep_pass_over_hundreds_of_queued_tasks_costs_a_few_round_trips(redis_server, namespace, monkeypatch):
    producer = Producer.from_url(redis_server.url, namespace)
    producer.enqueue_many([{}] * 300)
    lifecycle = producer.lifecycle
    clock = lifecycle.beat()
    sends = 0
    send = Connection.send_packed_command

    def counted(self: Connection, command: Any, check_health: bool = True) -> None:
        nonlocal sends
        sends += 1
        send(self, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counted)
    _audit(lifecycle, clock)
    monkeypatch.undo()
    # The lock, the cursor (GET, SSCAN, SET), the states, the records, the reissues: 9 round trips here.
    assert sends <= 12, f"{sends} round trips for one pass over 300 queued tasks"


def test_the_sweep_still_queues_again_only_the_task_whose_job_vanished(redis_server, namespace):
    producer = Producer.from_url(redis_server.url, namespace)
    tasks = producer.enqueue_many([{}] * 20)
    keys, connection = producer.keys, producer.connection
    gone = tasks[3].rollout_id
    connection.delete(keys.rq_job(keys.job_id(gone)))
    assert _audit(producer.lifecycle, producer.lifecycle.beat()) == 1
    assert connection.hget(keys.task(gone), "job") != keys.job_id(gone).encode()


def test_a_pass_with_every_job_hash_in_place_calls_no_reissue_script(redis_server, namespace, monkeypatch):
    # The steady state: each queued task's job hash exists and RQ's lists hold every job, so reissue.lua would
    # answer 0 for each; the pass checks the hashes itself (one EXISTS a task) and sends no script (issue 24).
    producer = Producer.from_url(redis_server.url, namespace)
    producer.enqueue_many([{}] * 50)
    lifecycle = producer.lifecycle

    def no_reissues(checks: Any) -> list[int]:
        raise AssertionError(f"reissue.lua called for {len(checks)} task(s) whose job is in place")

    monkeypatch.setattr(lifecycle, "reissue_many", no_reissues)
    assert _audit(lifecycle, lifecycle.beat()) == 0
