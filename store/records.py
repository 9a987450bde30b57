"""Reading a task record (the hash at ``Keys.task``) back into models: the one place that parses one."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from pydantic import ValidationError

from rollq.models.contract import Task
from rollq.models.errors import InvalidTaskError, UnknownTaskError
from rollq.models.policy import RolloutPolicy, TaskState

from .keys import Keys, TaskField

_FIELDS = (
    TaskField.TASK,
    TaskField.POLICY,
    TaskField.STATE,
    TaskField.CLAIMS,
    TaskField.LAST_CLAIM,
    TaskField.ATTEMPT,
    TaskField.WORKER,
    TaskField.ATTEMPTS,
    TaskField.RESULT,
    TaskField.GENERATION,
)


def parse_task(
    rollout_id: str, task_json: bytes, policy_json: bytes, *, claims: int, last_claim: float | None
) -> tuple[Task, RolloutPolicy]:
    """The task with its claim count and time as the workers left them, and its policy.

    :class:`InvalidTaskError` names the rollout and the field when either JSON is not what rollq wrote.
    """
    try:
        task = Task.model_validate_json(task_json)
        policy = RolloutPolicy.model_validate_json(policy_json)
    except ValidationError as exc:
        raise InvalidTaskError(f"task {rollout_id} is not a valid rollq task: {exc}") from exc
    return task.model_copy(update={"num_claims": claims, "last_claim_time": last_claim}), policy


@dataclass(frozen=True)
class TaskRecord:
    """A task as the workers left it, with rollq's bookkeeping beside it."""

    task: Task
    policy: RolloutPolicy
    state: TaskState
    attempt: int
    attempts_used: int
    worker: str | None
    result_id: str | None
    generation: int = 1

    @classmethod
    def parse(cls, rollout_id: str, values: list[bytes | None]) -> TaskRecord:
        task_json, policy_json, state, claims, last_claim, attempt, worker, used, result, generation = values
        assert task_json is not None and policy_json is not None
        task, policy = parse_task(
            rollout_id,
            task_json,
            policy_json,
            claims=int(claims or 0),
            last_claim=float(last_claim) if last_claim else None,
        )
        return cls(
            task=task,
            policy=policy,
            state=TaskState((state or b"queued").decode()),
            attempt=int(attempt or 0),
            attempts_used=int(used or 0),
            worker=worker.decode() if worker else None,
            result_id=result.decode() if result else None,
            generation=int(generation or 1),
        )


def read_records(connection: redis.Redis, keys: Keys, rollout_ids: list[str]) -> dict[str, TaskRecord]:
    """The records of ``rollout_ids`` that exist, in one round trip."""
    pipe = connection.pipeline(transaction=False)
    for rid in rollout_ids:
        pipe.hmget(keys.task(rid), _FIELDS)
    return {
        rid: TaskRecord.parse(rid, v) for rid, v in zip(rollout_ids, pipe.execute(), strict=True) if v[0] is not None
    }


def read_record(connection: redis.Redis, keys: Keys, rollout_id: str) -> TaskRecord:
    """The record of ``rollout_id``; :class:`UnknownTaskError` if there is none."""
    found = read_records(connection, keys, [rollout_id])
    if rollout_id not in found:
        raise UnknownTaskError(rollout_id, keys.namespace)
    return found[rollout_id]
