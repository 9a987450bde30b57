"""A producer's wait right after its own enqueue reads the records of only the tasks with a results entry since they
were queued (issue 24: one HGET a rollout less when the trainer waits at once); any other wait reads every record."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from rollq.models.contract import Rollout
from rollq.models.errors import RolloutTrimmedError
from rollq.models.policy import RolloutStatus
from rollq.producer import Producer
from rollq.producer import results as results_module
from rollq.store.keys import TaskField
from rollq.store.replies import Claim
from rollq.store.transitions import Finish


def _producer(name: str) -> Producer:
    return Producer.from_url(f"memory://{name}", namespace="waits")


def _run(producer: Producer, rollout_ids: list[str], *, maxlen: int = 100, fail: bool = False) -> None:
    """Claim and publish each task (failed and dead-lettered with ``fail``), as a worker would."""
    for rid in rollout_ids:
        job = producer.connection.hget(producer.keys.task(rid), TaskField.JOB)
        claim = producer.lifecycle.claim(rid, job.decode(), "w1")
        assert isinstance(claim, Claim)
        rollout = Rollout(rollout_id=rid, final_reward=0.0 if fail else 1.0, metadata={"run": claim.attempt})
        producer.lifecycle.finish(
            Finish(
                rollout_id=rid,
                attempt=claim.attempt,
                rollout_json=rollout.model_dump_json(),
                status=RolloutStatus.FAILED if fail else RolloutStatus.SUCCEEDED,
                results_maxlen=maxlen,
                dead_letter=fail,
                now=time.time(),
            )
        )


@pytest.fixture
def record_reads(monkeypatch: pytest.MonkeyPatch) -> list[list[str] | None]:
    """Each look a wait took at task records: the ids it was limited to, or None for every missing one."""
    reads: list[list[str] | None] = []
    check = results_module._Collected.check_records

    def counted(self: results_module._Collected, connection, keys, only=None) -> int:  # type: ignore[no-untyped-def]
        reads.append(None if only is None else sorted(only))
        return check(self, connection, keys, only)

    monkeypatch.setattr(results_module._Collected, "check_records", counted)
    return reads


def test_a_wait_right_after_enqueue_reads_only_the_records_of_tasks_ended_since(
    record_reads: list[list[str] | None],
) -> None:
    producer = _producer(uuid.uuid4().hex)
    _run(producer, [t.rollout_id for t in producer.enqueue_many([{"i": -1}])])  # the stream is not empty
    ids = [t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(3)])]
    _run(producer, ids[:1])  # ended before the wait: its record says how, as for any wait
    later = threading.Timer(0.3, _run, args=(producer, ids[1:]))  # ended during the wait: read off the stream
    later.start()
    rollouts = producer.wait(ids, timeout=10)
    later.join()
    assert [r.rollout_id for r in rollouts] == ids
    assert record_reads == [[ids[0]]]


def test_a_wait_right_after_enqueue_with_nothing_ended_reads_no_record(record_reads: list[list[str] | None]) -> None:
    producer = _producer(uuid.uuid4().hex)
    ids = [t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(3)])]
    later = threading.Timer(0.3, _run, args=(producer, ids))
    later.start()
    assert [r.rollout_id for r in producer.wait(ids, timeout=10)] == ids
    later.join()
    assert record_reads in ([], [[]])


def test_a_wait_for_tasks_queued_longer_ago_than_recent_reads_their_records(
    record_reads: list[list[str] | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    producer = _producer(uuid.uuid4().hex)
    ids = [t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(3)])]
    _run(producer, ids)
    monkeypatch.setattr(results_module, "RECENT_SECONDS", -1.0)
    assert [r.rollout_id for r in producer.wait(ids, timeout=5)] == ids
    assert record_reads == [None]


def test_a_wait_for_tasks_another_producer_queued_reads_their_records(record_reads: list[list[str] | None]) -> None:
    name = uuid.uuid4().hex
    ids = [t.rollout_id for t in _producer(name).enqueue_many([{"i": i} for i in range(3)])]
    other = _producer(name)
    _run(other, ids)
    assert [r.rollout_id for r in other.wait(ids, timeout=5)] == ids
    assert record_reads == [None]


def test_a_wait_from_where_tasks_were_queued_reports_rollouts_trimmed_before_it_read_them() -> None:
    # Entries trimmed between the enqueue and the wait's first read: the trim is past where the read started, so the
    # records are read and the trimmed ids reported at once, not at the timeout.
    producer = _producer(uuid.uuid4().hex)
    ids = [t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(3)])]
    _run(producer, ids, maxlen=1)
    started = time.monotonic()
    with pytest.raises(RolloutTrimmedError) as raised:
        producer.wait(ids, timeout=30)
    assert time.monotonic() - started < 10
    assert set(raised.value.rollout_ids) | set(raised.value.received) == set(ids)


def test_a_wait_for_a_task_requeued_from_the_dead_letter_set_since_its_enqueue_gets_the_rerun(
    record_reads: list[list[str] | None],
) -> None:
    # Its first run's entry is on the stream since the enqueue, but its record says it runs again: the wait is for
    # the re-run, as any wait's is.
    producer = _producer(uuid.uuid4().hex)
    (rid,) = [t.rollout_id for t in producer.enqueue_many([{"i": 0}])]
    _run(producer, [rid], fail=True)
    assert producer.requeue_dead([rid]) == [rid]
    later = threading.Timer(0.3, _run, args=(producer, [rid]))
    later.start()
    (rollout,) = producer.wait([rid], timeout=10)
    later.join()
    assert rollout.metadata["run"] == 2 and rollout.final_reward == 1.0
    assert record_reads == [[rid]]
