"""Looking up one task or rollout, and the dead-letter list with its errors: what ``rollq task``,
``rollq rollouts get`` and ``rollq dead-letter list`` print, and the dashboard shows."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, cast

from rollq.models.contract import Rollout
from rollq.models.errors import RolloutTrimmedError, RollqError
from rollq.models.wire import parse_rollout
from rollq.producer import Producer
from rollq.store.keys import StreamField, TaskField
from rollq.store.payloads import load_payloads, missing_payload
from rollq.store.records import TaskRecord, read_record, read_records_or_errors


def _fetch_rollouts(producer: Producer, entry_ids: list[str]) -> dict[str, Rollout]:
    """Rollouts by results-stream entry id, in one round trip; ids trimmed from the stream are absent."""
    pipe = producer.connection.pipeline(transaction=False)
    for entry_id in entry_ids:
        pipe.xrange(producer.keys.results, min=entry_id, max=entry_id)
    found = {}
    replies = pipe.execute()
    load_payloads(producer.connection, [reply[0][1] for reply in replies if reply])
    for entry_id, reply in zip(entry_ids, replies, strict=True):
        if reply and missing_payload(reply[0][1]) is None:
            found[entry_id] = parse_rollout(reply[0][1][StreamField.ROLLOUT.encode()])
    return found


def final_rollout(producer: Producer, rollout_id: str) -> Rollout:
    """The published rollout of ``rollout_id``; a RollqError saying why there is none."""
    record = read_record(producer.connection, producer.keys, rollout_id)
    if record.result_id is None:
        raise RollqError(f"task {rollout_id!r} has no final rollout yet (it is {record.state.value})")
    found = _fetch_rollouts(producer, [record.result_id])
    if record.result_id not in found:
        raise RolloutTrimmedError(
            f"the rollout of {rollout_id!r} was trimmed from the bounded results stream (entry {record.result_id})"
        )
    return found[record.result_id]


@dataclass(frozen=True)
class TaskView:
    """One task as an operator wants to see it."""

    rollout_id: str
    state: str
    mode: str | None
    resources_id: str | None
    attempt: int
    attempts_used: int
    max_attempts: int
    worker: str | None
    created_at: float | None
    last_claim_at: float | None
    ended_at: float | None
    error: dict[str, Any] | None
    reward: float | None
    last_worker: str | None = None
    """The worker of the last claim (``worker`` is None while the task is queued, this one is kept)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        def when(t: float | None) -> str:
            return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))

        lines = [
            f"task       {self.rollout_id}",
            f"state      {self.state}",
            f"mode       {self.mode or '-'}   resources {self.resources_id or 'latest'}",
            f"attempts   {self.attempts_used} of {self.max_attempts} used (current attempt {self.attempt})",
            f"worker     {self.worker or '-'}",
            f"created    {when(self.created_at)}",
            f"last claim {when(self.last_claim_at)}" + (f" by {self.last_worker}" if self.last_worker else ""),
            f"ended      {when(self.ended_at)}",
        ]
        if self.reward is not None:
            lines.append(f"reward     {self.reward:g}")
        if self.error:
            lines.append(f"error      {self.error.get('type')}: {self.error.get('message')}")
            if self.error.get("traceback"):
                lines.append("traceback")
                lines.extend("  " + line for line in str(self.error["traceback"]).rstrip().splitlines())
        return "\n".join(lines)


def task_view(producer: Producer, rollout_id: str) -> TaskView:
    record = read_record(producer.connection, producer.keys, rollout_id)
    ended = cast(bytes | None, producer.connection.hget(producer.keys.task(rollout_id), TaskField.ENDED))
    rollout = _fetch_rollouts(producer, [record.result_id]).get(record.result_id) if record.result_id else None
    return _view(record, float(ended) if ended else None, rollout)


def _view(record: TaskRecord, ended: float | None, rollout: Rollout | None) -> TaskView:
    task = record.task
    metadata = rollout.metadata if rollout else {}
    return TaskView(
        rollout_id=task.rollout_id,
        state=record.state.value,
        mode=task.mode,
        resources_id=metadata.get("resources_id") or task.resources_id,
        attempt=record.attempt,
        attempts_used=record.attempts_used,
        max_attempts=record.policy.max_attempts,
        worker=record.current_worker,
        created_at=task.create_time,
        last_claim_at=task.last_claim_time,
        ended_at=ended,
        error=metadata.get("error"),
        reward=rollout.final_reward if rollout else None,
        last_worker=record.worker,
    )


@dataclass(frozen=True)
class Failure:
    """A dead-lettered task and why it failed."""

    rollout_id: str
    ended_at: float
    """When it failed for good (its dead-letter score: the ``ended_at`` of ``rollq task``, which names it so)."""
    attempts_used: int
    error_type: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def failures(producer: Producer, limit: int | None = None) -> list[Failure]:
    """The dead-letter list, oldest first, each with the error its final rollout carries (a record that cannot be
    read: why, as an :class:`~rollq.models.errors.InvalidTaskError`)."""
    end = -1 if limit is None else limit - 1
    entries = cast(
        list[tuple[bytes, float]], producer.connection.zrange(producer.keys.dead_letter, 0, end, withscores=True)
    )
    ids = [member.decode() for member, _ in entries]
    records, invalid = read_records_or_errors(producer.connection, producer.keys, ids)
    rollouts = _fetch_rollouts(producer, [r.result_id for r in records.values() if r.result_id])
    out = []
    for (_member, score), rid in zip(entries, ids, strict=True):
        record = records.get(rid)
        rollout = rollouts.get(record.result_id) if record and record.result_id else None
        error = (rollout.metadata.get("error") if rollout else None) or {}
        if rid in invalid:  # named, not raised: one bad record must not hide the others
            error = {"type": type(invalid[rid]).__name__, "message": str(invalid[rid])}
        out.append(
            Failure(
                rollout_id=rid,
                ended_at=score,
                attempts_used=record.attempts_used if record else 0,
                error_type=str(error.get("type") or ("unknown (record expired)" if record is None else "unknown")),
                message=" ".join(str(error.get("message") or "").split()),
            )
        )
    return out
