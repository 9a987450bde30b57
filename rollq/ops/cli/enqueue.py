"""``rollq enqueue``: queue tasks from a JSONL file, every line checked before anything is queued."""

from __future__ import annotations

import itertools
import json
import sys
import time
import uuid
from typing import IO, Any

import click
import redis
from pydantic import ValidationError
from tqdm import tqdm

from rollq.models.click_types import Seconds
from rollq.models.contract import Task
from rollq.models.errors import EnqueueIncompleteError, EnqueueUndoneError, UnknownResourcesError
from rollq.models.policy import MAX_POLICY_SECONDS
from rollq.producer.producer import ENQUEUE_CHUNK, why_not_queued

from . import context
from .errors import RedisLostError, one_line_errors, redis_at, unreachable

_LINE_KEYS = {"input", "rollout_id", "mode", "resources_id", "metadata"}


def _parse_line(number: int, line: str, mode: str | None, resources_id: str | None) -> Task:
    """One JSONL line as a Task (with the command's defaults), or ValueError naming the line."""
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {number}: not JSON ({exc.msg})") from exc
    except RecursionError:
        raise ValueError(f"line {number}: nested deeper than JSON parsing allows") from None
    if not isinstance(entry, dict) or "input" not in entry:
        raise ValueError(f'line {number}: expected an object with an "input" key')
    unknown = set(entry) - _LINE_KEYS
    if unknown:
        raise ValueError(f"line {number}: unknown key(s) {', '.join(sorted(unknown))}")
    try:
        return Task(
            rollout_id=entry.get("rollout_id") or f"rollout-{uuid.uuid4().hex}",
            input=entry["input"],
            mode=entry.get("mode", mode),
            resources_id=entry.get("resources_id", resources_id),
            metadata=entry.get("metadata") or {},
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"line {number}: {where}: {first['msg']}") from exc


def _read_tasks(stream: IO[str], mode: str | None, resources_id: str | None) -> tuple[list[Task], list[int]]:
    """Every line of ``stream`` as a Task, checked before anything is queued, and each one's line number; the error
    names the first bad line and counts the others."""
    tasks, numbers, errors = [], [], []
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            tasks.append(_parse_line(number, line, mode, resources_id))
            numbers.append(number)
        except ValueError as exc:
            errors.append(str(exc))
    if errors:
        more = f" (and {len(errors) - 1} more bad line(s))" if len(errors) > 1 else ""
        raise ValueError(f"{errors[0]}{more}; nothing was queued")
    ids = [t.rollout_id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(rid for rid in ids if ids.count(rid) > 1)
        raise ValueError(f"rollout id {dup!r} appears on more than one line; nothing was queued")
    return tasks, numbers


def _stopped_at(exc: Exception, queued: int, total: int, next_line: int) -> ValueError:
    """The one line ``rollq enqueue`` ends with when ``exc`` stopped it after ``queued`` of the file's ``total``
    tasks (the lines before ``next_line``) were queued (their ids are printed): what Redis answered, and how to
    queue the rest without queueing a line twice (a line that gives no rollout_id gets a new one each run)."""
    reason, rest = why_not_queued(exc.__cause__ if isinstance(exc, EnqueueIncompleteError) and exc.__cause__ else exc)
    return ValueError(
        f"{queued} of {total} task(s) queued before {reason}; {rest} (their ids are printed above): queue the file "
        f"from line {next_line} on (re-running all of it queues again each line that gives no rollout_id; give "
        "every line a rollout_id to make a re-run safe)"
    )


def _lost_redis(exc: BaseException, queued: int, total: int, next_line: int) -> RedisLostError:
    """The line ``rollq enqueue`` exits 3 with when Redis went out of reach (``exc``) after ``queued`` of the file's
    ``total`` tasks (the lines before ``next_line``) were queued (none: it was sending the first chunk): the chunk it
    was sending may have been applied (its reply lost) or not, and a re-run with the same rollout ids queues none
    twice (an id Redis already has is answered known, nothing written), while a line without one gets a new id each
    run."""
    line = " ".join(str(exc).split()).rstrip(".")
    known = (
        f"partway: {line}; {queued} of {total} task(s) are known queued (their ids are printed above)"
        if queued
        else f"sending the first chunk: {line}; no task is known queued"
    )
    return RedisLostError(
        f"lost Redis at {redis_at()} {known}; the chunk in flight from line {next_line} on (up to {ENQUEUE_CHUNK:,} "
        f"lines) may or may not have been queued, the lines after it were not. Once Redis is back, run the file again "
        f"from line {next_line} on (or all of it): a line that gives its rollout_id is not queued twice (an id Redis "
        "already has is answered known); a line that gives none gets a new id each run, so one of the chunk in "
        "flight may be queued twice"
    )


def _unreached(exc: BaseException) -> RedisLostError:
    """The line ``rollq enqueue`` exits 3 with when Redis could not be reached before it sent any task."""
    line = " ".join(str(exc).split()).rstrip(".")
    return RedisLostError(f"cannot reach Redis at {redis_at()}: {line}; nothing was queued")


@click.command()
@click.argument("source", type=click.File("r"), default="-")
@click.option(
    "--mode", type=click.Choice(["train", "val", "test"]), default=None, help="Mode for lines that give none."
)
@click.option(
    "--resources-id", default=None, help="Resources version for lines that give none (default: latest at run time)."
)
@click.option(
    "--timeout",
    "timeout_seconds",
    type=Seconds(0, MAX_POLICY_SECONDS, min_open=True),
    default=None,
    help="Hard limit per attempt, seconds [default 300].",
)
@click.option("--max-attempts", type=click.IntRange(min=1), default=None, help="Attempts per task [default 3].")
@click.option(
    "--retry-on",
    type=click.Choice(["exception", "timeout", "unresponsive"]),
    multiple=True,
    help="Failure kinds that get another attempt; repeatable [default: timeout, unresponsive].",
)
@click.pass_context
@one_line_errors
def enqueue(
    ctx: click.Context,
    source: IO[str],
    mode: str | None,
    resources_id: str | None,
    timeout_seconds: float | None,
    max_attempts: int | None,
    retry_on: tuple[str, ...],
) -> None:
    """Queue tasks from a JSONL file (or stdin), one object per line.

    Each line: {"input": ..., "rollout_id"?, "mode"?, "resources_id"?, "metadata"?}.
    The whole file is checked first: one bad line queues nothing. A rollout id
    already known is not queued again (so re-running a file whose lines give
    their rollout ids is safe).

    Prints the rollout id of each line, then (on stderr) how many were new. If
    Redis refuses part of the file (full), the ids of the lines queued are
    printed, then how many of how many and the line to go on from; exit 1.
    If Redis goes out of reach partway (the first chunk too), likewise, saying
    that the chunk in flight may or may not have been queued; exit 3. Redis
    out of reach before any task was sent: nothing was queued; exit 3.
    """
    from rollq.models.policy import RolloutPolicy

    tasks, numbers = _read_tasks(source, mode, resources_id)
    pinned = sorted({t.resources_id for t in tasks if t.resources_id})
    try:
        # Redis answers before any task is sent: a first chunk that then loses it may have been applied, while
        # Redis out of reach here means plainly that nothing was queued.
        producer = context.producer(ctx)
        producer.connection.ping()
        missing = [rid for rid in pinned if not producer.connection.exists(producer.keys.resources(rid))]
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        if not unreachable(exc):
            raise
        raise _unreached(exc) from exc
    if missing:
        raise ValueError(
            f"unknown resources id(s) {', '.join(missing)} in namespace {producer.namespace!r}; nothing was queued"
        )
    overrides = {
        "timeout_seconds": timeout_seconds,
        "max_attempts": max_attempts,
        "retry_on": frozenset(retry_on) or None,
    }
    policy = producer.policy.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    RolloutPolicy.model_validate(policy.model_dump())  # model_copy skips validation

    def batch_key(task: Task) -> tuple[Any, ...]:
        return (task.mode, task.resources_id, json.dumps(task.metadata, sort_keys=True, default=str))

    new = known = 0
    # Consecutive lines that share their options go out as one batch (one round trip per 2000).
    with tqdm(total=len(tasks), desc="enqueue", unit="task", file=sys.stderr, disable=len(tasks) < 1000) as bar:
        for (line_mode, line_resources, _), group in itertools.groupby(tasks, key=batch_key):
            batch = list(group)
            started = time.time()
            try:
                queued = producer.enqueue_many(
                    [task.input for task in batch],
                    mode=line_mode,
                    resources_id=line_resources,
                    metadata=batch[0].metadata,
                    rollout_ids=[task.rollout_id for task in batch],
                    policy=policy,
                )
            except (redis.RedisError, UnknownResourcesError, EnqueueUndoneError, EnqueueIncompleteError) as exc:
                # What stops it partway. Earlier batches, and the first chunks of this one, stay queued: say which,
                # and where to go on.
                done = exc.tasks if isinstance(exc, EnqueueIncompleteError) else []
                if done:
                    click.echo("\n".join(task.rollout_id for task in done))
                handled = new + known + len(done)
                cause = exc.__cause__ if isinstance(exc, EnqueueIncompleteError) and exc.__cause__ else exc
                if unreachable(cause):  # the first chunk too: Redis answered the ping, then the chunk was sent
                    raise _lost_redis(cause, handled, len(tasks), numbers[handled]) from exc
                if not handled:
                    raise
                raise _stopped_at(exc, handled, len(tasks), numbers[handled]) from exc
            # A known id comes back as the stored task, created before this call began.
            fresh = sum(1 for task in queued if (task.create_time or 0) >= started)
            new, known = new + fresh, known + len(queued) - fresh
            click.echo("\n".join(task.rollout_id for task in queued))
            bar.update(len(batch))
    click.echo(f"queued {new} new task(s); {known} already known (not queued again)", err=True)
