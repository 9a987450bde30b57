"""A snapshot of one namespace: what is queued, running, finished, failed, stuck."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from rq.queue import Queue

from rollq.models.policy import RolloutStatus
from rollq.store.consumer_groups import DamagedGroupKeyError, list_groups
from rollq.store.eviction import MemoryState, memory_state
from rollq.store.keys import Keys, TaskField, parse_inflight_member
from rollq.store.llm_gate import LLMGate
from rollq.store.queries import first_entry_id
from rollq.store.replication import degraded_processes
from rollq.store.rq_workers import ListedWorker
from rollq.store.sizing import RetainedSizes, retained_sizes
from rollq.store.stats import REQUEUED_PREFIX, StatsField, outcome_stat
from rollq.worker.rq_worker import WORKER_CONCURRENCY_FIELD

# A worker heartbeats at least every few seconds while alive; RolloutPolicy's default
# unresponsive_seconds is the point at which rollq itself gives up on one.
DEAD_AFTER_SECONDS = 30.0


@dataclass
class Snapshot:
    """Counts for ``rollq status``; ``counters`` is the raw stats hash (outcomes by mode, requeues, durations)."""

    namespace: str
    queued: int
    in_flight: int
    in_flight_by_worker: dict[str, int]
    stale_attempts: int
    succeeded: int
    failed: int
    cancelled: int
    """Tasks ended by ``Producer.cancel`` / ``rollq tasks cancel``: each has a rollout on the results stream too, so
    the three outcomes add up to what was published."""
    dead_letter: int
    superseded: int
    requeued: dict[str, int]
    results_stream_length: int
    results_stream_bytes: int  # payload bytes (rollout JSON + id); Redis memory is about 1.1-1.3x this
    results_oldest_age_seconds: float | None
    consumer_groups: list[dict[str, Any]]
    resource_versions: list[str]
    latest_resources: str | None
    workers: list[dict[str, Any]]
    counters: dict[str, float] = field(default_factory=dict)
    results_stream_memory_bytes: int | None = None
    """``MEMORY USAGE`` of the results stream key alone (a big rollout's JSON is in a payload key of its own,
    rollq.store.payloads: counted in ``results_stream_bytes``, not here); None where the server has no such command
    (the embedded one)."""
    memory: MemoryState | None = None
    """Redis's memory limit, use and eviction policy; None where ``INFO`` is not available."""
    reward_missing: int = 0
    """Succeeded rollouts published with no reward at all (the agent's reward never reached rollq)."""
    task_missing: int = 0
    """Results kept on the superseded stream because their task record was gone (Redis lost it), not superseded."""
    llm_gate: dict[str, Any] | None = None
    """The weight-sync gate: ``paused`` (bool), ``epoch``, ``workers`` reporting, ``acknowledged``, LLM calls
    ``in_flight`` under the pause and ``waiting`` at the gates; None when no worker's proxy reports."""
    consumer_groups_error: str | None = None
    """Why ``consumer_groups`` could not be read (a results stream or trim hash of another type, named), if so: the
    rest of the snapshot stands."""
    replication_degraded: int = 0
    """Processes whose transitions do not wait for replicas, none having acknowledged in time
    (:mod:`rollq.store.replication`): a failover now could undo their work."""
    retained: RetainedSizes | None = None
    """What a finished rollout leaves in Redis besides its results-stream entry (``snapshot(retained=True)``, as
    ``rollq status`` asks; None otherwise, or where the server does not answer ``MEMORY USAGE``)."""

    @property
    def redis_refusing_writes(self) -> bool:
        """Whether Redis refuses writes now for lack of memory (workers wait, enqueues fail after retrying)."""
        return self.memory is not None and self.memory.full

    @property
    def outcomes(self) -> dict[RolloutStatus, int]:
        """Published rollouts by status (every :class:`RolloutStatus`), for views that show one count per status."""
        return outcome_totals(self.counters)

    @property
    def workers_alive(self) -> int:
        return sum(1 for w in self.workers if w["alive"])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _groups(connection: redis.Redis, keys: Keys) -> tuple[list[dict[str, Any]], str | None]:
    """The consumer groups, or none and why: one auxiliary key of another type (``list_groups`` names it) failed the
    whole of ``rollq status``, ``/metrics`` and the dashboard."""
    try:
        return [g.to_dict() for g in list_groups(connection, keys)], None
    except DamagedGroupKeyError as exc:
        return [], " ".join(str(exc).split())


def _oldest_age(connection: redis.Redis, keys: Keys, now: float) -> float | None:
    # The head's id only: the entry itself can be megabytes (a dashboard reads this on every page).
    first = first_entry_id(connection, keys.results)
    return max(0.0, now - int(first.split("-")[0]) / 1000) if first else None


def snapshot(
    connection: redis.Redis,
    keys: Keys,
    now: float | None = None,
    *,
    dead_after: float = DEAD_AFTER_SECONDS,
    retained: bool = False,
) -> Snapshot:
    """Read everything ``rollq status`` shows, in a few pipelined round trips plus one per consumer-group query;
    ``retained``: also sample what a finished rollout leaves in Redis (:func:`rollq.store.sizing.retained_sizes`:
    ``MEMORY USAGE`` of the latest rollouts' keys and two ``CONFIG GET``), which pages read on every load skip."""
    now = time.time() if now is None else now
    pipe = connection.pipeline(transaction=False)
    pipe.scard(keys.queued_tasks)  # tasks, not RQ jobs: a pack is one job, a cancelled task's job lingers
    pipe.zrange(keys.inflight, 0, -1)
    pipe.zcount(keys.inflight, "-inf", now)
    pipe.zcard(keys.dead_letter)
    pipe.hgetall(keys.stats)
    pipe.xlen(keys.results)
    pipe.zrange(keys.resources_versions, 0, -1)
    pipe.get(keys.resources_latest)
    queued, inflight, stale, dead, stats, xlen, versions, latest = pipe.execute()

    rollout_ids = []
    for member in inflight:
        try:
            rollout_ids.append(parse_inflight_member(member)[0])
        except ValueError:  # not rollq's (the reapers drop it): counted below, its worker unknown
            pass
    pipe = connection.pipeline(transaction=False)
    for rollout_id in rollout_ids:
        pipe.hget(keys.task(rollout_id), TaskField.WORKER)
    # A task key that is not a hash (WRONGTYPE) counts as unknown too, not as a failed status.
    workers_of = [w if isinstance(w, bytes) and w else b"?" for w in pipe.execute(raise_on_error=False)]
    by_worker = Counter(w.decode() for w in workers_of + [b"?"] * (len(inflight) - len(rollout_ids)))

    counters = {k.decode(): float(v) for k, v in stats.items()}
    totals = outcome_totals(counters)
    workers = _workers(connection, keys, dict(by_worker), now, dead_after)
    groups, groups_error = _groups(connection, keys)
    return Snapshot(
        namespace=keys.namespace,
        queued=int(queued),
        in_flight=len(inflight),
        in_flight_by_worker=dict(by_worker),
        stale_attempts=int(stale),
        succeeded=totals[RolloutStatus.SUCCEEDED],
        failed=totals[RolloutStatus.FAILED],
        cancelled=totals[RolloutStatus.CANCELLED],
        dead_letter=int(dead),
        superseded=int(counters.get(StatsField.SUPERSEDED, 0)),
        requeued={
            k.removeprefix(REQUEUED_PREFIX): int(v) for k, v in counters.items() if k.startswith(REQUEUED_PREFIX)
        },
        results_stream_length=int(xlen),
        results_stream_bytes=int(counters.get(StatsField.RESULTS_BYTES, 0)) if xlen else 0,
        results_oldest_age_seconds=_oldest_age(connection, keys, now),
        consumer_groups=groups,
        consumer_groups_error=groups_error,
        resource_versions=[v.decode() for v in versions],
        latest_resources=latest.decode() if latest else None,
        workers=workers,
        counters=counters,
        results_stream_memory_bytes=_memory_usage(connection, keys.results) if xlen else 0,
        memory=memory_state(connection),
        reward_missing=int(counters.get(StatsField.REWARD_MISSING, 0)),
        task_missing=int(counters.get(StatsField.TASK_MISSING, 0)),
        llm_gate=_llm_gate(connection, keys),
        replication_degraded=degraded_processes(connection, keys.replication_degraded, now),
        retained=retained_sizes(connection, keys) if retained and xlen else None,
    )


def outcome_counts(counters: dict[str, float]) -> dict[tuple[RolloutStatus, str], float]:
    """Published rollouts by ``(status, mode)`` from the stats hash (``succeeded:train``; mode ``""`` for none).

    Every :class:`RolloutStatus` is an outcome, read from its ``outcome_stat`` field: status, ``--json``,
    ``/metrics`` and the dashboard all count from here, so that a new status cannot be left out of one of them
    (cancelled rollouts were, and the counts no longer added up to the results stream)."""
    out: dict[tuple[RolloutStatus, str], float] = {}
    for status in RolloutStatus:
        prefix = outcome_stat(status, None)  # the prefix every mode's counter of that status starts with
        for key, value in counters.items():
            if key.startswith(prefix):
                out[(status, key.removeprefix(prefix))] = value
    return out


def outcome_totals(counters: dict[str, float]) -> dict[RolloutStatus, int]:
    """Published rollouts by status, all modes together; every :class:`RolloutStatus` present, 0 when none."""
    totals = dict.fromkeys(RolloutStatus, 0.0)
    for (status, _), value in outcome_counts(counters).items():
        totals[status] += value
    return {status: int(n) for status, n in totals.items()}


def _llm_gate(connection: redis.Redis, keys: Keys) -> dict[str, Any] | None:
    status = LLMGate(connection, keys).status()
    if not status.paused and not status.workers:
        return None
    return {
        "paused": status.paused,
        "epoch": status.epoch,
        "workers": status.workers,
        "acknowledged": status.acknowledged,
        "in_flight": status.in_flight,
        "waiting": status.waiting,
    }


def _memory_usage(connection: redis.Redis, key: str) -> int | None:
    try:
        return int(connection.memory_usage(key) or 0)  # type: ignore[arg-type]
    except redis.ResponseError:
        return None


def _workers(
    connection: redis.Redis, keys: Keys, in_flight: dict[str, int], now: float, dead_after: float
) -> list[dict[str, Any]]:
    """RQ's workers on this namespace's queue, with rollq's view: in flight, concurrency, alive.

    RQ keeps a SIGKILLed worker's key for its TTL (7 minutes by default), its state as it was (``busy``); a
    worker is shown dead once a reaper has taken its attempts for want of heartbeats (``reaped_at``, a reaper's
    time after the worker's last heartbeat: :meth:`~rollq.store.keys.Keys.reaped_worker`), or once its last
    heartbeat is older than ``dead_after`` seconds.
    """
    # A cluster namespace lists its workers in its own queue's set (RQ's rq:workers is another slot's key).
    listed = (
        ListedWorker.all(queue=Queue(keys.queue_name, connection=connection))
        if keys.clustered
        else ListedWorker.all(connection=connection)
    )
    found = [w for w in listed if keys.queue_name in w.queue_names()]
    pipe = connection.pipeline(transaction=False)
    for w in found:
        pipe.hget(w.key, WORKER_CONCURRENCY_FIELD)
        pipe.get(keys.reaped_worker(w.name))
    replies = pipe.execute() if found else []
    rows = []
    for w, conc, reaped_raw in zip(found, replies[::2], replies[1::2], strict=True):
        beat = w.last_heartbeat.timestamp() if w.last_heartbeat else None
        reaped = _seconds(reaped_raw)
        # A reaper took its attempts for want of heartbeats after its last one: dead, whatever its RQ hash says.
        reaped_at = reaped if reaped is not None and (beat is None or beat <= reaped) else None
        rows.append(
            {
                "name": w.name,
                "state": w.get_state(),
                "current_job": w.get_current_job_id(),
                "in_flight": in_flight.get(w.name, 0),
                "concurrency": int(conc) if conc else None,
                "last_heartbeat": beat,
                "alive": reaped_at is None and beat is not None and now - beat <= dead_after,
                "reaped_at": reaped_at,
            }
        )
    return rows


def _seconds(raw: bytes | None) -> float | None:
    """A time rollq wrote (a reaper's mark); None for none, or for a value not written by rollq."""
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


_GROUP_OUTCOMES = (
    StatsField.GROUPS_DELIVERED,
    StatsField.GROUPS_STALE_DROPPED,
    StatsField.GROUPS_STALE_REQUEUED,
    StatsField.GROUPS_FAILED_DROPPED,
)


def group_outcomes(counters: dict[str, float]) -> dict[str, int]:
    """What ``Producer.batches`` did with the groups it read: ``{"delivered": n, "stale-dropped": n, ...}``."""
    return {field.value.removeprefix("groups:"): int(counters.get(field.value, 0)) for field in _GROUP_OUTCOMES}


def _retained_text(r: RetainedSizes) -> str:
    text = (
        f"task record ~{r.record_bytes / 1000:.1f} kB (ROLLQ_KEEP_SECONDS), RQ's finished job "
        f"~{r.job_bytes / 1000:.1f} kB (ROLLQ_RESULT_TTL), besides its results-stream entry"
    )
    if r.loose_settings:
        text += f"; Redis has {r.loose_now}: set {r.advised} to keep less (docs/scaling.md)"
    return text


def render_text(s: Snapshot) -> str:
    """The human-readable form ``rollq status`` prints."""
    lines = [
        f"namespace {s.namespace}",
        f"  queued            {s.queued}",
        f"  in flight         {s.in_flight}"
        + (
            f"  ({', '.join(f'{w}: {n}' for w, n in sorted(s.in_flight_by_worker.items()))})"
            if s.in_flight_by_worker
            else ""
        ),
        f"  stale attempts    {s.stale_attempts}",
        f"  succeeded         {s.succeeded}" + (f" ({s.reward_missing} with no reward)" if s.reward_missing else ""),
        f"  failed            {s.failed}",
        f"  cancelled         {s.cancelled}",
        f"  dead-letter       {s.dead_letter}",
        f"  superseded        {s.superseded}"
        + (
            f" (and {s.task_missing} result(s) kept on that stream whose task record Redis lost: reason task-missing)"
            if s.task_missing
            else ""
        ),
        f"  requeued          {', '.join(f'{k}: {v}' for k, v in sorted(s.requeued.items())) or 0}",
        f"  results stream    {s.results_stream_length} entries, {_size(s.results_stream_bytes)}"
        + (f", oldest {s.results_oldest_age_seconds:.0f}s old" if s.results_oldest_age_seconds is not None else "")
        + (
            f", {_size(s.results_stream_memory_bytes)} of Redis memory in the stream key"
            " (big rollouts' payload keys beside it count in the size, not here)"
            if s.results_stream_memory_bytes is not None
            else ""
        ),
    ]
    if s.consumer_groups_error:
        lines.append(f"  consumer groups   unreadable: {s.consumer_groups_error}")
    for g in s.consumer_groups:
        lines.append(
            f"    group {g['name']}: lag {g['lag']}, pending {g['pending']}, {g['consumers']} consumer(s)"
            + (
                f", IDLE {g['idle_seconds']:.0f}s (no longer holds back trimming; `rollq groups delete {g['name']}`)"
                if g["idle"] and g["idle_seconds"] is not None
                else ", IDLE (no longer holds back trimming)"
                if g["idle"]
                else ""
            )
            + (f", lost {g['lost']} to trimming from {g['lost_from']}" if g["lost"] else "")
        )
    groups = group_outcomes(s.counters)
    if any(groups.values()):
        lines.append("  training groups   " + ", ".join(f"{name} {n}" for name, n in groups.items()))
    lines.append(f"  resources         {', '.join(s.resource_versions) or 'none'} (latest {s.latest_resources or '-'})")
    if s.memory is not None:
        m = s.memory
        limit = f"{_size(m.used_bytes)} of {_size(m.max_bytes)}" if m.max_bytes else f"{_size(m.used_bytes)}, no limit"
        state = (
            "FULL: refusing writes; workers wait until memory frees"
            if m.full
            else "may EVICT rollq's keys when full: set noeviction"
            if m.policy != "noeviction"
            else "ok"
        )
        lines.append(f"  redis memory      {limit}, policy {m.policy}: {state}")
    if s.retained is not None:
        lines.append("  per rollout kept  " + _retained_text(s.retained))
    refused, released = (int(s.counters.get(f, 0)) for f in (StatsField.GATEWAY_REFUSED, StatsField.GATEWAY_RELEASED))
    if refused or released:
        lines.append(
            f"  gateway           {refused} post(s) refused (no token of their attempt), "
            f"{released} unfinished lease(s) handed back (serve-al, serve-agl)"
        )
    refusals = int(s.counters.get(StatsField.REDIS_REFUSALS, 0))
    if refusals:
        waited = s.counters.get(StatsField.REDIS_REFUSED_SECONDS, 0.0)
        lines.append(f"  redis refusals    {refusals} (workers waited {waited:.0f}s in all)")
    gate = s.llm_gate
    if gate is not None and gate["paused"]:
        lines.append(
            f"  LLM calls         paused (pause {gate['epoch']}): {gate['acknowledged']} of {gate['workers']} "
            f"worker(s) holding, {gate['in_flight']} still running, {gate['waiting']} waiting"
        )
    elif gate is not None:
        lines.append(f"  LLM calls         flowing ({gate['workers']} worker proxies reporting)")
    if s.replication_degraded:
        lines.append(
            f"  replication       DEGRADED: {s.replication_degraded} process(es) not waiting for replicas "
            "(none acknowledged in time; a failover now could undo their work)"
        )
    dead = len(s.workers) - s.workers_alive
    lines.append(f"  workers           {s.workers_alive} alive" + (f", {dead} dead" if dead else ""))
    for w in s.workers:
        state = (
            w["state"]
            if w["alive"]
            else "dead (a reaper took its tasks back)"
            if w.get("reaped_at") is not None
            else "dead (no heartbeat)"
        )
        capacity = f" of {w['concurrency']}" if w["concurrency"] else ""
        lines.append(f"    {w['name']}: {state}, {w['in_flight']} in flight{capacity}")
    return "\n".join(lines)
