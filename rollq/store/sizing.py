"""Will a namespace's records fit in Redis's memory? A projection from what the namespace has done so far.

What grows with the rate, in steady state: every succeeded task's record for ``keep_seconds`` after it ends, RQ's
finished job (its hash and its results stream, ``rq:results:<id>``) for ``result_ttl``, and the results stream up to
its hard byte limit. RQ's results stream is most of the finished job: Redis gives a new stream a node of
``stream-node-max-bytes`` (4 KB by default) however small its one entry, so a finished job left about 6.4 kB where
its hash is 1.4 kB (``bench/retained.py``). At the issue-25 plan's rate (32,000 rollouts/s) the former 7-day default
of ``keep_seconds`` would have kept about 21 TB of records. A worker projects this at start-up and warns when it
exceeds ``maxmemory`` (Redis with ``noeviction`` then refuses writes; with eviction it drops rollq's keys, tasks
included).

The rate is estimated from the namespace's own history: the mean rollout duration in the stats hash and the
capacity of the workers registered on its queue (this worker's concurrency each); the sizes from ``MEMORY USAGE``
of the task records, RQ job hashes and RQ results streams of the latest published rollouts. With no finished
rollout yet there is nothing to project from, and :func:`project_memory` returns None.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import redis

from .keys import Keys, StreamField
from .stats import DURATION_PREFIX, StatsField

log = logging.getLogger(__name__)

_SAMPLE = 8  # task records sampled for their size
STREAM_OVERHEAD = 1.15
"""Redis memory per payload byte of the results stream (measured 1.1-1.3, README)."""
COMPACT_REDIS = {"stream-node-max-bytes": 512, "hash-max-listpack-value": 256}
"""The Redis settings docs/scaling.md advises, and what they save (``bench/retained.py --config ...``, 2026-12-05):

- ``stream-node-max-bytes`` 512 (Redis's default 4096): Redis gives each new stream a node that size, and RQ keeps
  every finished job's result in a stream of its own; a finished job 2.8 kB instead of 6.4, rollq's summaries
  entries 0.52 kB instead of 0.26;
- ``hash-max-listpack-value`` 256 (Redis's 64): RQ's job hash (its description and data) and rollq's task record (the
  task and policy JSON) hold longer values, which make a hash a hash table; as listpacks they take about half.

Both: 3.0 kB kept per rollout instead of 7.9, Redis's CPU per rollout within the runs' spread."""


@dataclass(frozen=True)
class RetainedSizes:
    """What one finished rollout of a namespace leaves in Redis besides its results-stream entry, from ``MEMORY
    USAGE`` of the latest published rollouts' keys."""

    record_bytes: int
    """Its task record, kept ``keep_seconds``."""
    job_bytes: int
    """RQ's finished job: its hash and its results stream, kept ``result_ttl``."""
    loose_settings: dict[str, int] | None
    """Redis's settings that keep more per rollout than :data:`COMPACT_REDIS` (None: ``CONFIG GET`` refused)."""

    @property
    def loose_now(self) -> str:
        """The loose settings as Redis has them: ``stream-node-max-bytes 4096, hash-max-listpack-value 64``."""
        return ", ".join(f"{name} {value}" for name, value in (self.loose_settings or {}).items())

    @property
    def advised(self) -> str:
        """What to set them to, as ``CONFIG SET``'s arguments: ``stream-node-max-bytes 512 ...``."""
        return " ".join(f"{name} {COMPACT_REDIS[name]}" for name in self.loose_settings or {})


@dataclass(frozen=True)
class MemoryProjection:
    """Steady-state memory of a namespace's records at its estimated rate, beside what Redis allows."""

    rollouts_per_second: float
    sizes: RetainedSizes
    keep_seconds: int
    """How long a succeeded task's record is kept."""
    result_ttl: int
    """How long RQ keeps a finished job."""
    results_max_bytes: int
    maxmemory: int
    """Redis's ``maxmemory`` (0: none set; then the host's memory is the bound)."""
    bound_bytes: int
    """What the projection is compared with: ``maxmemory``, else the host's total memory."""

    @property
    def record_bytes(self) -> int:
        return self.sizes.record_bytes

    @property
    def job_bytes(self) -> int:
        return self.sizes.job_bytes

    @property
    def projected_bytes(self) -> int:
        """Records kept for ``keep_seconds`` (0 when kept for ever: unbounded) and RQ's finished jobs for
        ``result_ttl`` at the rate, plus a full results stream."""
        kept = self.keep_seconds * self.record_bytes + self.result_ttl * self.job_bytes
        return int(self.rollouts_per_second * kept + self.results_max_bytes * STREAM_OVERHEAD)

    @property
    def fits(self) -> bool:
        return self.keep_seconds > 0 and (self.bound_bytes <= 0 or self.projected_bytes <= self.bound_bytes)


def _mean_duration(stats: dict[bytes, bytes]) -> float | None:
    """Mean rollout duration from the stats hash's histogram (count of every bucket) and its sum."""
    total = float(stats.get(StatsField.DURATION_SUM.encode(), b"0") or 0)
    count = 0
    for field, value in stats.items():
        name = field.decode(errors="replace")
        if name.startswith(DURATION_PREFIX) and name != StatsField.DURATION_SUM:
            try:
                count += int(value)
            except ValueError:
                continue
    return total / count if count and total > 0 else None


def retained_sizes(connection: redis.Redis, keys: Keys, latest: list[Any] | None = None) -> RetainedSizes | None:
    """The sizes for ``keys``'s namespace, sampled from ``latest`` (results-stream entries as ``XREVRANGE`` gives
    them; read here when None); None when nothing was published yet or the server does not answer ``MEMORY USAGE``
    (fakeredis)."""
    if latest is None:
        latest = cast(list[Any], connection.xrevrange(keys.results, count=_SAMPLE))
    if not latest:
        return None
    pipe = connection.pipeline(transaction=False)
    for _, fields in latest:
        rid = fields.get(StreamField.ROLLOUT_ID.encode(), b"").decode(errors="replace")
        # The rollout's first job (a retried one's later jobs are not sampled); a rollout published before job ids
        # hashed the namespace (rollq.store.keys.job_id) has its job under another id: it samples no job, which the
        # means below skip.
        jid = keys.job_id(rid)
        pipe.memory_usage(keys.task(rid))
        pipe.memory_usage(keys.rq_job(jid))
        pipe.memory_usage(keys.rq_results(jid))
    try:
        sizes: list[Any] = pipe.execute()
    except (redis.ResponseError, NotImplementedError, AttributeError):
        return None
    tasks, hashes, streams = ([int(s) for s in sizes[i::3] if s] for i in range(3))
    if not tasks:
        return None
    return RetainedSizes(_mean(tasks), _mean(hashes) + _mean(streams), _loose(connection))


def project_memory(
    connection: redis.Redis,
    keys: Keys,
    *,
    keep_seconds: int,
    result_ttl: int,
    results_max_bytes: int,
    concurrency: int,
) -> MemoryProjection | None:
    """The projection for ``keys``'s namespace (see the module), or None when nothing has finished yet or the
    server does not answer ``MEMORY USAGE`` / ``INFO`` (fakeredis)."""
    pipe = connection.pipeline(transaction=False)
    pipe.hgetall(keys.stats)
    pipe.scard(f"rq:workers:{keys.queue_name}")
    pipe.xrevrange(keys.results, count=_SAMPLE)
    stats, workers, latest = pipe.execute()
    duration = _mean_duration(cast(dict[bytes, bytes], stats))
    if duration is None or not latest:
        return None
    rate = max(1, int(workers)) * concurrency / max(duration, 0.001)
    sizes = retained_sizes(connection, keys, latest)
    if sizes is None:
        return None
    try:
        info: dict[str, Any] = cast(dict[str, Any], connection.info("memory"))
    except (redis.ResponseError, NotImplementedError, AttributeError):
        return None
    maxmemory = int(info.get("maxmemory", 0) or 0)
    bound = maxmemory or int(info.get("total_system_memory", 0) or 0)
    return MemoryProjection(rate, sizes, keep_seconds, result_ttl, results_max_bytes, maxmemory, bound)


def _mean(sizes: list[int]) -> int:
    return sum(sizes) // len(sizes) if sizes else 0


def _loose(connection: redis.Redis) -> dict[str, int] | None:
    """Redis's settings that differ from :data:`COMPACT_REDIS` the costly way, or None where ``CONFIG GET`` is
    renamed away or refused."""
    try:
        values = {name: int(cast(dict[str, Any], connection.config_get(name))[name]) for name in COMPACT_REDIS}
    except (redis.ResponseError, NotImplementedError, AttributeError, KeyError, ValueError):
        return None
    return {name: value for name, value in values.items() if _keeps_more(name, value)}


def _keeps_more(name: str, value: int) -> bool:
    """Whether Redis's ``value`` of setting ``name`` keeps more per rollout than :data:`COMPACT_REDIS`'s: a larger
    stream node, or a lower bound on the values a listpack hash holds."""
    advised = COMPACT_REDIS[name]
    return value > advised if name == "stream-node-max-bytes" else value < advised


def warn_if_oversized(projection: MemoryProjection | None) -> bool:
    """Log a warning when ``projection`` does not fit, and one more naming Redis's settings that keep more per
    rollout than :data:`COMPACT_REDIS` where there are such; True if it did not fit."""
    if projection is None or projection.fits:
        return False
    p = projection
    bound = f"maxmemory {p.maxmemory / 1e9:.1f} GB" if p.maxmemory else f"the host's {p.bound_bytes / 1e9:.1f} GB"
    kept = f"for {p.keep_seconds} s" if p.keep_seconds else "for ever (ROLLQ_KEEP_SECONDS=0)"
    log.warning(
        "memory: at ~%.0f rollouts/s (estimated from this namespace's mean duration and its workers), keeping "
        "succeeded task records of ~%d bytes %s, RQ's finished jobs of ~%d bytes for %d s and a full results stream "
        "needs ~%.1f GB, more than %s: lower ROLLQ_KEEP_SECONDS, ROLLQ_RESULT_TTL or ROLLQ_RESULTS_MAX_BYTES, or "
        "give Redis more memory (docs/scaling.md)",
        p.rollouts_per_second,
        p.record_bytes,
        kept,
        p.job_bytes,
        p.result_ttl,
        p.projected_bytes / 1e9 if p.keep_seconds else float("inf"),
        bound,
    )
    if p.sizes.loose_settings:
        log.warning(
            "memory: Redis has %s; CONFIG SET %s (or the same in redis.conf) keeps less per finished rollout (both "
            "settings: about 3.0 kB instead of 7.9; docs/scaling.md)",
            p.sizes.loose_now,
            p.sizes.advised,
        )
    return True
