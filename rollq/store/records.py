"""Reading a task record (the hash at ``Keys.task``) back into models: the one place that parses one."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import BaseModel, ValidationError

from rollq.models.contract import Task
from rollq.models.errors import InvalidTaskError, UnknownTaskError
from rollq.models.policy import RolloutPolicy, TaskState

from .keys import Keys, TaskField, foreign_key

log = logging.getLogger(__name__)

_warned: set[tuple[str, frozenset[str]]] = set()
# Each model's field names, read once: pydantic's ``model_fields`` is a descriptor that works out its answer on each
# read (1.5-3 us, twice per claimed task; up to 1.7% of the GIL samples at 1000 in flight, GC included).
_KNOWN_FIELDS: dict[type[BaseModel], frozenset[str]] = {}


def _validate(model: type[BaseModel], raw: bytes | str, what: str) -> Any:
    """``model`` from JSON ``raw``; fields a newer rollq added are ignored, with one warning per set of them.

    ValueError for JSON nested deeper than the parser's recursion allows (a hostile record 100,000 deep once
    raised RecursionError out of every reaper pass and ``Producer.wait`` of the namespace)."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ValueError(f"{model.__name__} JSON of {len(raw)} bytes is nested too deep to parse") from None
    if isinstance(data, dict):
        known = _KNOWN_FIELDS.get(model)
        if known is None:
            known = _KNOWN_FIELDS[model] = frozenset(model.model_fields)
        unknown = data.keys() - known
        if unknown and (model.__name__, frozenset(unknown)) not in _warned:
            _warned.add((model.__name__, frozenset(unknown)))
            log.warning(
                "%s of %s has field(s) this rollq does not know, ignored (written by a newer version?): %s",
                model.__name__,
                what,
                ", ".join(sorted(unknown)),
            )
    return model.model_validate(data)


RECORD_FIELDS = (
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
    TaskField.ENDED,
)
"""The task hash fields a :class:`TaskRecord` is parsed from, in ``HMGET`` order."""


_POLICIES: dict[bytes | str, RolloutPolicy] = {}
"""Policies by their JSON: the tasks of a run share a few, and a RolloutPolicy is frozen, so one read serves all."""


def parse_task(
    rollout_id: str, task_json: bytes, policy_json: bytes, *, claims: int, last_claim: float | None
) -> tuple[Task, RolloutPolicy]:
    """The task with its claim count and time as the workers left them, and its policy.

    :class:`InvalidTaskError` names the rollout and the field when either JSON is not what rollq wrote.
    """
    try:
        task = _validate(Task, task_json, f"task {rollout_id}")
        policy = _POLICIES.get(policy_json)
        if policy is None:
            policy = _validate(RolloutPolicy, policy_json, f"task {rollout_id}")
            if len(_POLICIES) >= 64:
                _POLICIES.clear()
            _POLICIES[policy_json] = policy
    except json.JSONDecodeError as exc:
        raise InvalidTaskError(f"task {rollout_id} is not a valid rollq task: Invalid JSON: {exc}") from exc
    except (ValidationError, ValueError) as exc:
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
    """The worker of the last claim, as the record keeps it (a requeue leaves it): see :attr:`current_worker`."""
    result_id: str | None
    generation: int = 1
    ended: float | None = None

    @property
    def current_worker(self) -> str | None:
        """The worker that holds the task now or whose attempt ended it: None while the task is queued (its record
        still names the worker of the attempt a reaper, a retry or a hand-back took back)."""
        return None if self.state == TaskState.QUEUED else self.worker

    @classmethod
    def parse(cls, rollout_id: str, values: list[bytes | None]) -> TaskRecord:
        """The record from its fields; :class:`InvalidTaskError` naming the field that is not what rollq wrote."""
        task_json, policy_json, state, claims, last_claim, attempt, worker, used, result, generation, ended = values
        if task_json is None or policy_json is None:
            raise InvalidTaskError(f"task {rollout_id} has no {TaskField.POLICY if task_json else TaskField.TASK}")
        named = {TaskField.CLAIMS: claims, TaskField.ATTEMPT: attempt, TaskField.ATTEMPTS: used}
        named[TaskField.GENERATION] = generation or b"1"
        try:
            numbers = {field: int(raw or 0) for field, raw in named.items()}
            claimed_at = float(last_claim) if last_claim else None
            ended_at = float(ended) if ended else None
            task_state = TaskState((state or b"queued").decode())
        except ValueError as exc:
            raise InvalidTaskError(f"task {rollout_id} has a field that is not what rollq wrote: {exc}") from exc
        task, policy = parse_task(
            rollout_id, task_json, policy_json, claims=numbers[TaskField.CLAIMS], last_claim=claimed_at
        )
        return cls(
            task=task,
            policy=policy,
            state=task_state,
            attempt=numbers[TaskField.ATTEMPT],
            attempts_used=numbers[TaskField.ATTEMPTS],
            worker=worker.decode() if worker else None,
            result_id=result.decode() if result else None,
            generation=numbers[TaskField.GENERATION],
            ended=ended_at,
        )


def wrong_type(error: BaseException) -> bool:
    """True for Redis's WRONGTYPE: a command (or a script's) met a key holding another type than rollq wrote."""
    return isinstance(error, redis.ResponseError) and "WRONGTYPE" in str(error)


def foreign_keys(connection: redis.Redis, read: dict[str, tuple[str, str]]) -> list[str]:
    """Each key of ``read`` (key -> the Redis type rollq or RQ writes there, what it is) that holds another type,
    named (:func:`~rollq.store.keys.foreign_key`): what a caller that met :func:`wrong_type` says, one round trip."""
    pipe = connection.pipeline(transaction=False)
    for key in read:
        pipe.type(key)
    kinds = [k.decode() if isinstance(k, bytes) else str(k) for k in pipe.execute()]
    return [
        foreign_key(what, key, kind, want)
        for (key, (want, what)), kind in zip(read.items(), kinds, strict=True)
        if kind not in (want, "none")
    ]


def not_a_record(rollout_id: str, key: str, error: Exception) -> InvalidTaskError:
    """The :class:`InvalidTaskError` of a task key that holds no hash (WRONGTYPE); any other error is raised."""
    if not wrong_type(error):
        raise error
    return InvalidTaskError(f"task {rollout_id} is not a valid rollq task: its key {key} holds no hash ({error})")


def read_records_or_errors(
    connection: redis.Redis, keys: Keys, rollout_ids: list[str]
) -> tuple[dict[str, TaskRecord], dict[str, InvalidTaskError]]:
    """The records of ``rollout_ids`` that exist, in one round trip, and apart from them the error of each that
    cannot be parsed: one bad record must not stop the caller from handling the others."""
    pipe = connection.pipeline(transaction=False)
    for rid in rollout_ids:
        pipe.hmget(keys.task(rid), RECORD_FIELDS)
    return parse_records_or_errors(keys, rollout_ids, pipe.execute(raise_on_error=False))


def parse_records_or_errors(
    keys: Keys, rollout_ids: Sequence[str], replies: Sequence[Any]
) -> tuple[dict[str, TaskRecord], dict[str, InvalidTaskError]]:
    """:func:`read_records_or_errors` from the replies of its ``HMGET`` pipeline (``raise_on_error=False``)."""
    records: dict[str, TaskRecord] = {}
    errors: dict[str, InvalidTaskError] = {}
    for rid, values in zip(rollout_ids, replies, strict=True):
        if isinstance(values, Exception):
            errors[rid] = not_a_record(rid, keys.task(rid), values)
            continue
        if values[0] is None and values[1] is None:
            continue
        try:
            records[rid] = TaskRecord.parse(rid, values)
        except InvalidTaskError as exc:
            errors[rid] = exc
    return records, errors


def read_records(connection: redis.Redis, keys: Keys, rollout_ids: list[str]) -> dict[str, TaskRecord]:
    """The records of ``rollout_ids`` that exist, in one round trip; :class:`InvalidTaskError` if one is invalid."""
    records, errors = read_records_or_errors(connection, keys, rollout_ids)
    if errors:
        raise next(iter(errors.values()))
    return records


def read_record(connection: redis.Redis, keys: Keys, rollout_id: str) -> TaskRecord:
    """The record of ``rollout_id``; :class:`UnknownTaskError` if there is none."""
    found = read_records(connection, keys, [rollout_id])
    if rollout_id not in found:
        raise UnknownTaskError(rollout_id, keys.namespace)
    return found[rollout_id]
