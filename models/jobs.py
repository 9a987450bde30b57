"""How a rollq task looks as an RQ job, and how a worker checks one before running it.

Each queued attempt of a task is a real RQ job (JSON serializer) so rq-dashboard
and RQ's registries see it. The job names rollq's job function and carries only
the rollout id; the task itself lives in the task record. A worker refuses any
job that names another function, without importing anything.
"""

from __future__ import annotations

import math
from typing import Any

import redis
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.utils import now

from .errors import InvalidTaskError

ROLLOUT_FUNC = "worker.jobs.run_rollout"

# RQ keeps finished job hashes this long (the worker's default result TTL; rollq
# jobs carry none of their own): enough for rq-dashboard to show recent work,
# short enough that memory stays flat at hundreds of rollouts per second.
DEFAULT_RESULT_TTL = 60
# A job RQ marks failed is kept a day for inspection (RQ's own default is a year).
_FAILURE_TTL = 24 * 3600
# Beyond the policy timeout, so RQ's registry cleanup never flags a live attempt;
# rollq enforces the real limit itself.
_RQ_TIMEOUT_MARGIN = 60


def job_fields(
    connection: redis.Redis,
    *,
    job_id: str,
    rollout_id: str,
    queue_name: str,
    timeout_seconds: float,
    description: str,
) -> list[Any]:
    """The RQ job hash for one queued attempt, flattened as field/value pairs for a Lua ``HSET``.

    RQ builds the hash (``Job.to_dict``) so its format stays RQ's business.
    """
    job = Job.create(
        ROLLOUT_FUNC,
        args=[rollout_id],
        connection=connection,
        id=job_id,
        origin=queue_name,
        description=description,
        timeout=math.ceil(timeout_seconds) + _RQ_TIMEOUT_MARGIN,
        failure_ttl=_FAILURE_TTL,
        serializer=JSONSerializer,
        status=JobStatus.QUEUED,
    )
    job.enqueued_at = now()
    return [item for pair in job.to_dict().items() for item in pair]


def rollout_id_of(job: Job) -> str:
    """The rollout id a rollq job carries; :class:`InvalidTaskError` for anything else.

    Reading ``func_name`` only decodes the job's JSON; nothing is imported.
    """
    try:
        func_name, args, kwargs = job.func_name, job.args, job.kwargs
    except Exception as exc:  # any decoding failure means the entry is not ours
        raise InvalidTaskError(f"job {job.id}: payload is not valid rollq JSON ({type(exc).__name__}: {exc})") from exc
    if func_name != ROLLOUT_FUNC:
        raise InvalidTaskError(f"job {job.id}: refusing to run {func_name!r}; a rollq queue only runs {ROLLOUT_FUNC}")
    if kwargs or len(args) != 1 or not isinstance(args[0], str):
        raise InvalidTaskError(f"job {job.id}: expected one rollout id argument, got args={args!r} kwargs={kwargs!r}")
    return args[0]
