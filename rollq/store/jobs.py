"""How a rollq task looks as an RQ job, and how a worker checks one before running it.

With ``worker/rq_worker.py`` this is one of the two modules that touch RQ (tests/worker/test_rq_contract.py pins what
they use): the job hash format, RQ's key names, fetching jobs, and the fence that keeps a Redis Cluster
namespace's RQ keys in its slot (:func:`fence_worker`, :func:`clean_worker_registry`, :func:`suspended`).

Each queued attempt of a task is a real RQ job (JSON serializer) so rq-dashboard
and RQ's registries see it. The job names rollq's job function and carries only
the rollout id; the task itself lives in the task record. A worker refuses any
job that names another function, without importing anything.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
import rq.job
import rq.results
from rq import worker_registration
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.suspension import WORKERS_SUSPENDED
from rq.utils import now
from rq.worker import BaseWorker, Worker

from rollq.models.errors import InvalidTaskError

log = logging.getLogger(__name__)

ROLLOUT_FUNC = "rollq.worker.jobs.run_rollout"

# RQ keeps finished job hashes this long (the worker's default result TTL; rollq
# jobs carry none of their own): an hour of history in rq-dashboard. Each kept
# job costs Redis about 1-2 KB, so at 100 rollouts/s an hour is ~0.5 GB: the
# setting is capped at a week, and high-rate runs should lower it.
DEFAULT_RESULT_TTL = 3600
MAX_RESULT_TTL = 7 * 24 * 3600
# A job RQ marks failed is kept a day for inspection (RQ's own default is a year).
_FAILURE_TTL = 24 * 3600
# Beyond the policy timeout, so RQ's registry cleanup never flags a live attempt;
# rollq enforces the real limit itself.
_RQ_TIMEOUT_MARGIN = 60


RQ_QUEUES_KEY: str = Queue.redis_queues_keys
"""RQ's set of known queues (rq-dashboard lists queues from it)."""
RQ_WORKERS_KEY: str = Worker.redis_workers_keys
"""RQ's set of every worker's key."""
RQ_SUSPENDED_KEY: str = WORKERS_SUSPENDED
"""RQ's flag that suspends every worker (``rq suspend``)."""


def _own(global_key: str, tag: str) -> str:
    """A cluster namespace's own copy of RQ's global key: ``rq:queues`` -> ``rq:{name}:queues``."""
    head, _, tail = global_key.partition(":")
    return f"{head}:{tag}:{tail}"


def rq_queues_key(tag: str) -> str:
    """The set of known queues of cluster namespace ``tag`` (``{name}``), in its slot."""
    return _own(RQ_QUEUES_KEY, tag)


def rq_workers_key(tag: str) -> str:
    """The set of worker keys of cluster namespace ``tag`` (``{name}``), in its slot."""
    return _own(RQ_WORKERS_KEY, tag)


def rq_suspended_key(tag: str) -> str:
    """The suspension flag of cluster namespace ``tag`` (``{name}``), in its slot."""
    return _own(RQ_SUSPENDED_KEY, tag)


def rq_queue_key(queue_name: str) -> str:
    """RQ's list of queued job ids for ``queue_name``."""
    return Queue.redis_queue_namespace_prefix + queue_name


def rq_intermediate_key(queue_key: str) -> str:
    """RQ's list of job ids a worker has taken off ``queue_key`` but not yet started."""
    return IntermediateQueue.get_intermediate_queue_key(queue_key)


def rq_job_key(job_id: str) -> str:
    """RQ's hash for one job."""
    return Job.redis_job_namespace_prefix + job_id


def rq_results_key(job_id: str) -> str:
    """RQ's stream of one job's results (``rq:results:<id>``), kept ``result_ttl`` after the job ends."""
    return str(rq.results.Result.get_key(job_id))


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
    def payload(rollout_ids: str | Sequence[str]) -> bytes:
        """RQ's ``data`` field for a job at ``rollout_ids`` (one id, or a pack's ids in order): (function,
        instance, args, kwargs) as compressed JSON; the args are the rollout ids, nothing else."""
        args = [rollout_ids] if isinstance(rollout_ids, str) else list(rollout_ids)
        return zlib.compress(JSONSerializer.dumps((ROLLOUT_FUNC, None, args, {})))

    def fields(self, rollout_id: str, description: str) -> list[Any]:
        """The whole job hash for an attempt at ``rollout_id``, flattened for a Lua ``HSET``."""
        return ["data", self.payload(rollout_id), "description", description, *self.shared]


_TAGGED_JOB_ID = re.compile(r"\{[A-Za-z0-9_.-]{1,64}\}[A-Za-z0-9_-]+")
"""A cluster namespace's job id: its hash tag, then an id RQ accepts."""


MAX_PACK = 1000
"""The most tasks one RQ job may carry (``Settings.tasks_per_job``'s bound); a job naming more is refused."""


def rollout_ids_of(job: Job) -> list[str]:
    """The rollout ids a rollq job carries, in order: one, or a pack's (``tasks_per_job`` > 1); distinct, non-empty
    strings, at most :data:`MAX_PACK`; :class:`InvalidTaskError` for anything else.

    Reading ``func_name`` only decodes the job's JSON; nothing is imported.
    """
    try:
        func_name, args, kwargs = job.func_name, job.args, job.kwargs
    except Exception as exc:  # any decoding failure means the entry is not ours
        raise InvalidTaskError(f"job {job.id}: payload is not valid rollq JSON ({type(exc).__name__}: {exc})") from exc
    if func_name != ROLLOUT_FUNC:
        raise InvalidTaskError(f"job {job.id}: refusing to run {func_name!r}; a rollq queue only runs {ROLLOUT_FUNC}")
    if (
        kwargs
        or not isinstance(args, list | tuple)
        or not 1 <= len(args) <= MAX_PACK
        or not all(isinstance(a, str) and a for a in args)
        or len(set(args)) != len(args)
    ):
        raise InvalidTaskError(
            f"job {job.id}: expected 1 to {MAX_PACK} distinct rollout id arguments, got args={args!r} kwargs={kwargs!r}"
        )
    return list(args)


def rollout_id_of(job: Job) -> str:
    """The one rollout id a single-task rollq job carries; :class:`InvalidTaskError` for a pack or anything else."""
    ids = rollout_ids_of(job)
    if len(ids) != 1:
        raise InvalidTaskError(f"job {job.id}: a pack of {len(ids)} tasks where one rollout id was expected")
    return ids[0]


@dataclass(frozen=True)
class JobRegistries:
    """The started, finished and failed registries of one queue's jobs on one connection, built once.

    RQ 2.12 builds a new registry object at every ``Job.started_job_registry`` (and finished, failed) read, and each
    resolves its serializer through a runtime Protocol ``isinstance`` check (12 us a registry here): a job's start
    and end read three of them. The objects hold nothing but the queue's name, connection, serializer and job class,
    so one set serves every job of the queue (:attr:`RollqJob.shared_registries`).
    """

    started: StartedJobRegistry
    finished: FinishedJobRegistry
    failed: FailedJobRegistry

    @classmethod
    def of(cls, job: Job) -> JobRegistries:
        """The registries RQ would build for ``job`` (its origin, connection, serializer and class)."""
        return cls(
            Job.started_job_registry.fget(job),  # type: ignore[attr-defined]
            Job.finished_job_registry.fget(job),  # type: ignore[attr-defined]
            Job.failed_job_registry.fget(job),  # type: ignore[attr-defined]
        )

    def serve(self, job: Job) -> bool:
        """Whether these are ``job``'s registries (its queue, its connection)."""
        return self.started.name == job.origin and self.started.connection is job.connection


def install_rq_fast_paths() -> None:
    """Let RQ's per-job helpers skip work whose answer rollq knows, with the same results (issue 24).

    At 1000 rollouts in flight a worker builds, reads and writes hundreds of RQ jobs a second, and three of
    RQ 2.12's helpers on that path cost more than the rest of their callers:

    - ``resolve_serializer`` (in ``rq.job`` and ``rq.results``) checks ``isinstance(serializer, Serializer)``
      against a runtime-checkable ``Protocol``, which on Python 3.11 walks the protocol's attributes on every
      call: ~15 us, twice per rollout (the ``RollqJob`` each dequeue reads, the ``Result`` each job's end
      writes), ~4% of a worker's GIL samples. For :class:`~rq.serializers.JSONSerializer`, the one rollq uses,
      the answer is always the class itself: given, it is returned at once; anything else goes to RQ's function;
    - ``str_to_date`` (``rq.job``, twice per dequeued job: created_at, enqueued_at) parses with
      ``datetime.strptime``, ~8 us; a timestamp of RQ's own form (``2026-01-02T03:04:05.123456Z``) is read with
      ``datetime.fromisoformat`` instead (~1 us), any other goes to RQ's function;
    - ``utcformat`` (``rq.job``, ~7 times per job) formats with ``strftime``; an aware or naive ``datetime`` of
      a four-digit year is formatted directly, character for character the same;
    - ``Job.to_dict`` compresses the job's ``data`` anew each time the job is saved (once per job, at its end):
      ``zlib.compress`` sets up ~256 KB of deflate state for ~100 bytes, 30-80 us of CPU outside the GIL (so
      py-spy's ``--gil`` profile never showed it). ``rq.job``'s ``zlib`` becomes :class:`_RememberedData`, which
      remembers the compressed bytes each ``Job.restore`` read and gives them back when the same data is
      compressed again: the field keeps the bytes it had (those ``zlib.compress`` makes, as the producer wrote
      them with it); any other data is compressed as before.

    Called when :mod:`rollq.worker.rq_worker` is imported; pinned by ``tests/worker/test_rq_contract.py``.
    """
    for module in (rq.job, rq.results):
        _wrap(module, "resolve_serializer", _resolve_json_at_once)
    _wrap(rq.job, "str_to_date", _str_to_date)
    _wrap(rq.job, "utcformat", _utcformat)
    if not isinstance(rq.job.zlib, _RememberedData):  # type: ignore[attr-defined]
        rq.job.zlib = _RememberedData()  # type: ignore[attr-defined,assignment]


class _RememberedData:
    """``zlib`` as ``rq.job`` uses it, remembering what ``decompress`` read so that ``compress`` of the same bytes
    returns them instead of compressing again (see :func:`install_rq_fast_paths`); bounded, thread-safe under the
    GIL (one dict read or write at a time)."""

    LIMIT = 4096
    error = zlib.error

    def __init__(self) -> None:
        self._packed: dict[bytes, bytes] = {}

    def decompress(self, data: Any, *args: Any, **kwargs: Any) -> bytes:
        plain = zlib.decompress(data, *args, **kwargs)
        if not args and not kwargs and type(data) is bytes:
            if len(self._packed) >= self.LIMIT:
                self._packed.clear()
            self._packed[plain] = data
        return plain

    def compress(self, data: Any, *args: Any, **kwargs: Any) -> bytes:
        if not args and not kwargs and type(data) is bytes:
            packed = self._packed.get(data)
            if packed is not None:
                return packed
        return zlib.compress(data, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(zlib, name)


def _wrap(module: Any, name: str, fast: Any) -> None:
    rqs = getattr(module, name)
    if getattr(rqs, "rollq_fast_path", False):
        return

    def wrapped(value: Any = None, _rqs: Any = rqs) -> Any:
        return fast(value, _rqs)

    wrapped.rollq_fast_path = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = rqs  # type: ignore[attr-defined]
    setattr(module, name, wrapped)


def _resolve_json_at_once(serializer: Any, rqs: Any) -> Any:
    return serializer if serializer is JSONSerializer else rqs(serializer)


_RQ_TIMESTAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def _str_to_date(value: Any, rqs: Any) -> Any:
    if type(value) is bytes and len(value) == 27 and _RQ_TIMESTAMP.fullmatch(value):
        try:
            return datetime.fromisoformat(value[:-1].decode()).replace(tzinfo=UTC)
        except ValueError:
            pass  # out of range (a 13th month...): RQ's own parser says so
    return rqs(value)


def _utcformat(dt: Any, rqs: Any) -> Any:
    if type(dt) is not datetime or dt.year < 1000:
        return rqs(dt)
    return f"{dt.year}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}.{dt.microsecond:06d}Z"


class RollqJob(Job):
    """RQ's Job with every path from job-hash data to code closed; the job class of rollq workers.

    RQ imports and calls the functions a job hash names: ``failure_callback_name``
    when its registry clean-up finds an abandoned job (at every worker start-up),
    ``success_callback_name`` and ``stopped_callback_name`` around a job, and the
    job's own function; it also posts to the ``webhooks`` URLs a hash lists.
    Anyone who can write to Redis could pick those. rollq sets none of them, so a
    rollq worker reads none of them: the callbacks are always None, the webhooks
    always empty, and the function is never loaded (the worker runs its agent).
    """

    shared_registries: JobRegistries | None = None
    """The registries of the job's queue built once, set by a worker on the jobs it runs (see JobRegistries)."""

    def __init__(self, id: str | None = None, connection: Any = None, serializer: Any = None) -> None:
        # RQ 2.12 refuses job ids other than [A-Za-z0-9_-]+; a cluster namespace's job ids start with its hash tag
        # ({name}), so that every key RQ derives from the id lands in the namespace's slot (see store.keys).
        tagged = id is not None and _TAGGED_JOB_ID.fullmatch(id) is not None
        super().__init__(None if tagged else id, connection, serializer)
        if tagged:
            self._id = id

    @property
    def started_job_registry(self) -> StartedJobRegistry:
        shared = self.shared_registries
        return shared.started if shared is not None else super().started_job_registry

    @property
    def finished_job_registry(self) -> FinishedJobRegistry:
        shared = self.shared_registries
        return shared.finished if shared is not None else super().finished_job_registry

    @property
    def failed_job_registry(self) -> FailedJobRegistry:
        shared = self.shared_registries
        return shared.failed if shared is not None else super().failed_job_registry

    @property
    def func(self) -> Any:
        raise InvalidTaskError(f"job {self.id}: rollq never imports a job's function (it names {self.func_name!r})")

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None

    def restore(self, raw_data: Any) -> None:
        super().restore(raw_data)
        named = [
            name
            for name in (self._success_callback_name, self._failure_callback_name, self._stopped_callback_name)
            if name
        ]
        if named or self.webhooks:
            log.warning(
                "job %s names callbacks %s and %d webhook(s); rollq ignores them (nothing in Redis selects code)",
                self.id,
                named,
                len(self.webhooks),
            )
        self.webhooks = []


def read_rollq_jobs(connection: redis.Redis, job_ids: list[str]) -> dict[str, Job | InvalidTaskError | None]:
    """Each of ``job_ids`` as a Job if it is a well-formed rollq job, else the InvalidTaskError saying why, or None
    when it has no hash; in one round trip.

    RQ's own ``Job.fetch``/``fetch_many`` raise on the first malformed hash (a bad
    ``status``, ``created_at`` or ``dependency_ids``), which would stop a whole
    pass over a list for one foreign entry; here each job is judged on its own.
    One HGETALL a job: RQ's worker never reads a job's dependencies set (only
    rq-dashboard's job page does, through ``Job.dependency_ids``), and a rollq job
    has none, so its SMEMBERS, one command a rollout, is not sent (issue 24).
    """
    pipe = connection.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(Job.key_for(job_id))
    replies = pipe.execute(raise_on_error=False)
    found: dict[str, Job | InvalidTaskError | None] = {}
    for job_id, raw in zip(job_ids, replies, strict=True):
        if isinstance(raw, Exception):
            found[job_id] = InvalidTaskError(f"job {job_id}: RQ cannot read its hash ({type(raw).__name__}: {raw})")
            continue
        if not raw:
            found[job_id] = None
            continue
        job = RollqJob(job_id, connection=connection, serializer=JSONSerializer)
        try:
            job.restore(raw)
            job.get_status(refresh=False)
            rollout_ids_of(job)
        except InvalidTaskError as exc:
            found[job_id] = exc
            continue
        except Exception as exc:  # anything RQ cannot read back is not a well-formed rollq job
            found[job_id] = InvalidTaskError(f"job {job_id}: RQ cannot read its hash ({type(exc).__name__}: {exc})")
            continue
        found[job_id] = job
    return found


def cluster_worker_name(tag: str, name: str | None) -> str:
    """The RQ worker name of a worker of cluster namespace ``tag`` (``{name}``): RQ's own choice (a uuid4 hex) or
    the given name, prefixed with the tag so that ``rq:worker:<name>`` (and its pub/sub channel, its executions)
    is in the namespace's slot."""
    name = name or uuid.uuid4().hex
    return name if name.startswith(tag) else tag + name


def fence_worker(worker: BaseWorker, queues_key: str, workers_key: str) -> None:
    """Point RQ's per-class global keys of ``worker`` and its queues at a cluster namespace's own:
    ``Worker.redis_workers_keys`` (RQ's ``register``/``unregister`` read it through the instance) and
    ``Queue.redis_queues_keys`` (read through the instance by ``Queue.enqueue_job``, ``delete``...)."""
    worker.redis_workers_keys = workers_key
    for queue in worker.queues:
        queue.redis_queues_keys = queues_key


def clean_worker_registry(queue: Queue, workers_key: str) -> None:
    """RQ's ``worker_registration.clean_worker_registry`` for a cluster namespace: the same clean-up of the queue's
    worker set, with the namespace's own set of all workers instead of ``rq:workers`` (RQ 2.12 names that one
    by constant, in the same ``MULTI``: a cross-slot error on a cluster)."""
    by_queue = worker_registration.WORKERS_BY_QUEUE_KEY % queue.name
    keys = sorted(worker_registration.get_keys(queue))
    if not keys:
        return
    with queue.connection.pipeline(transaction=True) as pipe:
        for key in keys:
            pipe.exists(key)
        gone = [key for key, exists in zip(keys, pipe.execute(), strict=True) if not exists]
        if gone:
            pipe.srem(by_queue, *gone)
            pipe.srem(workers_key, *gone)
            pipe.execute()


def suspended(worker: BaseWorker, suspended_key: str) -> bool:
    """RQ's ``is_suspended(connection, worker)`` with a cluster namespace's own flag for ``rq:suspended``: the
    worker's heartbeat and the flag's ``EXISTS`` in one ``MULTI``, as RQ sends them (both keys in the slot)."""
    with worker.connection.pipeline() as pipe:
        worker.heartbeat(pipeline=pipe)
        pipe.exists(suspended_key)
        return bool(pipe.execute()[-1])
