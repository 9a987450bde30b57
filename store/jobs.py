"""How a rollq task looks as an RQ job, and how a worker checks one before running it.

Each queued attempt of a task is a real RQ job (JSON serializer) so rq-dashboard
and RQ's registries see it. The job names rollq's job function and carries only
the rollout id; the task itself lives in the task record. A worker refuses any
job that names another function, without importing anything.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import redis
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.utils import now

from rollq.models.errors import InvalidTaskError

ROLLOUT_FUNC = "rollq.worker.jobs.run_rollout"

# RQ keeps finished job hashes this long (the worker's default result TTL; rollq
# jobs carry none of their own): enough for rq-dashboard to show recent work,
# short enough that memory stays flat at hundreds of rollouts per second.
DEFAULT_RESULT_TTL = 60
# A job RQ marks failed is kept a day for inspection (RQ's own default is a year).
_FAILURE_TTL = 24 * 3600
# Beyond the policy timeout, so RQ's registry cleanup never flags a live attempt;
# rollq enforces the real limit itself.
_RQ_TIMEOUT_MARGIN = 60


class JobTemplate:
    """RQ job hashes for queued attempts of one queue and time limit.

    RQ builds the hash once (``Job.to_dict``), so its format stays RQ's
    business; each job then differs only in its payload (the rollout id it
    carries) and description. Building a Job per task cost more than the rest
    of an enqueue together.
    """

    def __init__(self, connection: redis.Redis, *, queue_name: str, timeout_seconds: float) -> None:
        job = Job.create(
            ROLLOUT_FUNC,
            args=[""],
            connection=connection,
            origin=queue_name,
            description="",
            timeout=math.ceil(timeout_seconds) + _RQ_TIMEOUT_MARGIN,
            failure_ttl=_FAILURE_TTL,
            serializer=JSONSerializer,
            status=JobStatus.QUEUED,
        )
        job.enqueued_at = now()
        # RQ reads an absent field as unset, like an empty one; leaving the empty
        # ones out halves what every enqueue sends.
        self._fields = {k: v for k, v in job.to_dict().items() if v != ""}

    @property
    def shared(self) -> list[Any]:
        """The fields every job of this template has, flattened as field/value items for a Lua ``HSET``."""
        return [
            item
            for name, value in self._fields.items()
            if name not in ("data", "description")
            for item in (name, value)
        ]

    @staticmethod
    def payload(rollout_id: str) -> bytes:
        """RQ's ``data`` field for a job at ``rollout_id``: (function, instance, args, kwargs) as compressed JSON."""
        return zlib.compress(JSONSerializer.dumps((ROLLOUT_FUNC, None, [rollout_id], {})))

    def fields(self, rollout_id: str, description: str) -> list[Any]:
        """The whole job hash for an attempt at ``rollout_id``, flattened for a Lua ``HSET``."""
        return ["data", self.payload(rollout_id), "description", description, *self.shared]


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
