"""The status snapshot as Prometheus metrics, through ``prometheus_client``.

One collector turns a :class:`~rollq.ops.status.Snapshot` into metric
families; ``rollq status --prometheus`` prints them once (``generate_latest``),
``rollq metrics`` and ``rollq dashboard`` serve them on ``/metrics``, reading a
fresh snapshot per scrape. prometheus_client writes exact values and escapes
label values, which a hand-written exposition did not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import redis
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from rollq.models.outcomes import describe
from rollq.store.connection import connect
from rollq.store.settings import Settings
from rollq.store.stats import (
    DURATION_BUCKETS,
    DURATION_PREFIX,
    REWARD_BUCKETS,
    REWARD_SUM,
    StatsField,
    parse_reward_stat,
)
from rollq.store.summaries import sort_versions, version_order

from .access import WSGIApp
from .status import DEAD_AFTER_SECONDS, Snapshot, group_outcomes, outcome_counts

log = logging.getLogger(__name__)

SCRAPE_SOCKET_TIMEOUT_SECONDS = 3.0
"""How long a server answering scrapes and page polls (``rollq metrics``, the dashboard) waits on one Redis reply:
well under Prometheus's default 10 s ``scrape_timeout``, so that a stalled Redis is a failed scrape (a 503 naming
it) rather than a scrape timeout. The default 30 s, retried, hung a scrape for a minute."""

REDIS_UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError)
"""What a read raises when Redis does not answer (stalled, down, unreachable): a 503, not a server error."""


def scrape_connection(url: str) -> redis.Redis:
    """A client for a server that answers while someone waits: replies within :data:`SCRAPE_SOCKET_TIMEOUT_SECONDS`,
    and no retries. redis-py retries a new connection's handshake inside each retry of the command, so one retry
    made a stalled Redis take four timeouts (12 s); a connection Redis closed (a restart) is replaced when it is
    taken from the pool, and the next scrape or poll tries again anyway."""
    return connect(url, retries=0, socket_timeout=SCRAPE_SOCKET_TIMEOUT_SECONDS)


def unavailable(exc: BaseException) -> str:
    """The one line a 503 answers with when Redis did not answer a read."""
    return f"Redis did not answer ({describe(exc)})"


def answer_503_when_redis_is_unavailable(app: WSGIApp) -> WSGIApp:
    """``app`` (prometheus_client's, which reads Redis before it starts its response) answering a 503 with one line,
    and logging it, when Redis does not answer; its own 500 and traceback told Prometheus nothing."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            return app(environ, start_response)
        except REDIS_UNAVAILABLE as exc:
            line = unavailable(exc)
            log.warning("answered 503 to %s: %s", environ.get("PATH_INFO", "?"), line)
            start_response("503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
            return [line.encode() + b"\n"]

    return guarded


def metrics_app(read: Callable[[], Snapshot]) -> WSGIApp:
    """The WSGI app ``rollq metrics`` serves: one fresh snapshot per scrape, a 503 while Redis does not answer."""
    return answer_503_when_redis_is_unavailable(make_wsgi_app(registry(read)))


def _histogram_buckets(counts: dict[str, float], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs from per-bucket counts keyed by ``repr(bound)`` / ``+Inf``."""
    out, cumulative = [], 0.0
    for bound in [repr(b) for b in bounds] + ["+Inf"]:
        cumulative += counts.get(bound, 0.0)
        out.append((bound, cumulative))
    return out


def reward_series(counters: dict[str, float]) -> dict[tuple[str, str], dict[str, float]]:
    """The reward histogram in the stats hash: ``(mode, resources_id) -> {le or 'sum': value}``."""
    series: dict[tuple[str, str], dict[str, float]] = {}
    for key, value in counters.items():
        parsed = parse_reward_stat(key)
        if parsed is not None:
            mode, resources_id, bucket = parsed
            series.setdefault((mode, resources_id), {})[bucket] = value
    return series


OLDER_VERSIONS = "older"
"""The ``resources_id`` label of the versions folded together (all but the newest ``metrics_versions``)."""


def fold_versions(
    series: dict[tuple[str, str], dict[str, float]], keep: int
) -> dict[tuple[str, str], dict[str, float]]:
    """``series`` with only the newest ``keep`` resources versions (numeric order) labelled one by one; the older
    ones summed into :data:`OLDER_VERSIONS` per mode. Bounded cardinality whatever the number of versions."""
    versions = sort_versions({v for _, v in series if v})
    kept = set(versions[-keep:]) | {""}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for (mode, version), counts in series.items():
        key = (mode, version if version in kept else OLDER_VERSIONS)
        into = out.setdefault(key, {})
        for bucket, n in counts.items():
            into[bucket] = into.get(bucket, 0.0) + n
    return out


def families(s: Snapshot, keep_versions: int = 5) -> Iterator[Metric]:
    """Every rollq metric for one snapshot; the reward histogram labels the newest ``keep_versions`` versions."""
    ns = s.namespace

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["namespace"])
        g.add_metric([ns], value)
        return g

    yield gauge("rollq_queue_depth", "Tasks waiting in the queue.", s.queued)
    if s.memory is not None:
        yield gauge(
            "rollq_redis_refusing_writes",
            "1 while Redis refuses writes for lack of memory (maxmemory under noeviction); workers wait.",
            float(s.redis_refusing_writes),
        )
        yield gauge(
            "rollq_redis_may_evict",
            "1 when Redis's maxmemory-policy may evict rollq's keys (anything but noeviction, with a limit).",
            float(s.memory.evicts),
        )
    yield gauge(
        "rollq_redis_refusals",
        "Times workers found Redis refusing commands (OOM, READONLY, BUSY) and waited for it (counter).",
        s.counters.get(StatsField.REDIS_REFUSALS, 0.0),
    )
    yield gauge("rollq_in_flight", "Attempts running now.", s.in_flight)
    by_worker = GaugeMetricFamily(
        "rollq_worker_in_flight", "Attempts running now, by worker.", labels=["namespace", "worker"]
    )
    for worker, n in sorted(s.in_flight_by_worker.items()):
        by_worker.add_metric([ns, worker], n)
    yield by_worker
    yield gauge(
        "rollq_workers_alive",
        f"Workers in RQ's worker registry (rq:workers) serving this namespace whose RQ worker key was heartbeated "
        f"within the last {DEAD_AFTER_SECONDS:g} s.",
        s.workers_alive,
    )
    yield gauge("rollq_stale_attempts", "Running attempts past their heartbeat deadline.", s.stale_attempts)
    yield gauge(
        "rollq_replication_degraded_processes",
        "Processes whose transitions no longer wait for replicas (none acknowledged in time): a failover could "
        "undo their work.",
        s.replication_degraded,
    )
    yield gauge("rollq_dead_letter", "Tasks that failed for good.", s.dead_letter)
    yield gauge("rollq_results_stream_length", "Entries in the results stream.", s.results_stream_length)
    yield gauge(
        "rollq_results_stream_bytes",
        "Payload bytes (rollout JSON and id) in the results stream.",
        s.results_stream_bytes,
    )
    if s.results_stream_memory_bytes is not None:
        yield gauge(
            "rollq_results_stream_memory_bytes",
            "Memory the results stream takes in Redis (MEMORY USAGE).",
            s.results_stream_memory_bytes,
        )
    if s.results_oldest_age_seconds is not None:
        yield gauge(
            "rollq_results_oldest_age_seconds",
            "Age of the oldest entry in the results stream.",
            s.results_oldest_age_seconds,
        )
    if s.llm_gate is not None:
        gate = s.llm_gate
        yield gauge("rollq_llm_paused", "1 while LLM calls are paused for a weight sync.", 1 if gate["paused"] else 0)
        yield gauge("rollq_llm_gate_workers", "Workers whose capturing proxy reports to the LLM gate.", gate["workers"])
        yield gauge("rollq_llm_calls_waiting", "LLM calls waiting at the workers' gates.", gate["waiting"])
        if gate["paused"]:
            yield gauge(
                "rollq_llm_calls_running_paused",
                "LLM calls still running on workers that hold the pause (the drain's progress).",
                gate["in_flight"],
            )
    lost = CounterMetricFamily(
        "rollq_results_lost",
        "Rollouts trimmed before a consumer group got them (the hard byte limit, or while the group was idle).",
        labels=["namespace", "group"],
    )
    for g in s.consumer_groups:
        lost.add_metric([ns, g["name"]], g["lost"])
    yield lost
    lag = GaugeMetricFamily(
        "rollq_consumer_group_lag", "Results not yet delivered to a consumer group.", labels=["namespace", "group"]
    )
    pending = GaugeMetricFamily(
        "rollq_consumer_group_pending",
        "Results delivered to a consumer group but not acknowledged.",
        labels=["namespace", "group"],
    )
    idle = GaugeMetricFamily(
        "rollq_consumer_group_idle_seconds",
        "Since a consumer group's most recently active consumer last talked to Redis (absent without consumers).",
        labels=["namespace", "group"],
    )
    idled = GaugeMetricFamily(
        "rollq_consumer_group_idle",
        "1 when a consumer group is past the idle bound (or has no consumer) and no longer holds back trimming.",
        labels=["namespace", "group"],
    )
    for g in s.consumer_groups:
        if g["lag"] is not None:
            lag.add_metric([ns, g["name"]], g["lag"])
        pending.add_metric([ns, g["name"]], g["pending"])
        if g["idle_seconds"] is not None:
            idle.add_metric([ns, g["name"]], g["idle_seconds"])
        idled.add_metric([ns, g["name"]], 1 if g["idle"] else 0)
    yield lag
    yield pending
    yield idle
    yield idled

    outcomes = CounterMetricFamily(
        "rollq_rollouts", "Final rollouts published, by status and mode.", labels=["namespace", "status", "mode"]
    )
    for (status, mode), value in sorted(outcome_counts(s.counters).items()):
        outcomes.add_metric([ns, status.value, mode or "none"], value)
    yield outcomes
    requeues = CounterMetricFamily(
        "rollq_requeues", "Attempts sent back to the queue, by reason.", labels=["namespace", "reason"]
    )
    for reason, n in sorted(s.requeued.items()):
        requeues.add_metric([ns, reason], n)
    yield requeues
    superseded = CounterMetricFamily(
        "rollq_superseded", "Results from attempts that were no longer current.", labels=["namespace"]
    )
    superseded.add_metric([ns], s.superseded)
    yield superseded
    task_missing = CounterMetricFamily(
        "rollq_task_missing",
        "Results whose task record Redis had lost (a restart without persistence, a flush, an eviction), kept on "
        "the superseded stream with reason task-missing.",
        labels=["namespace"],
    )
    task_missing.add_metric([ns], s.task_missing)
    yield task_missing
    gateway = CounterMetricFamily(
        "rollq_gateway_refusals",
        "serve-al/serve-agl: posts refused for want of their attempt's token (refused), unfinished leases handed "
        "back (released).",
        labels=["namespace", "what"],
    )
    gateway.add_metric([ns, "refused"], s.counters.get(StatsField.GATEWAY_REFUSED, 0.0))
    gateway.add_metric([ns, "released"], s.counters.get(StatsField.GATEWAY_RELEASED, 0.0))
    yield gateway
    rewardless = CounterMetricFamily(
        "rollq_rollouts_without_reward",
        "Succeeded rollouts published with no reward at all (the agent's reward never reached rollq).",
        labels=["namespace"],
    )
    rewardless.add_metric([ns], s.reward_missing)
    yield rewardless
    groups = CounterMetricFamily(
        "rollq_training_groups",
        "Groups read by Producer.batches, by what became of them (delivered, stale-dropped, stale-requeued, "
        "failed-dropped).",
        labels=["namespace", "outcome"],
    )
    for name, n in sorted(group_outcomes(s.counters).items()):
        groups.add_metric([ns, name], n)
    yield groups

    durations = {k.removeprefix(DURATION_PREFIX): v for k, v in s.counters.items() if k.startswith(DURATION_PREFIX)}
    duration = HistogramMetricFamily(
        "rollq_rollout_duration_seconds", "Time from claim to publish of final rollouts.", labels=["namespace"]
    )
    duration.add_metric(
        [ns], _histogram_buckets(durations, DURATION_BUCKETS), s.counters.get(StatsField.DURATION_SUM, 0.0)
    )
    yield duration

    reward = HistogramMetricFamily(
        "rollq_reward",
        "Final reward of published rollouts, by mode and resources version.",
        labels=["namespace", "mode", "resources_id"],
    )
    folded = fold_versions(reward_series(s.counters), keep_versions)
    for (mode, resources_id), counts in sorted(folded.items(), key=lambda kv: (kv[0][0], version_order(kv[0][1]))):
        labels = [ns, mode or "none", resources_id]
        buckets = _histogram_buckets(counts, REWARD_BUCKETS)
        reward.add_metric(labels, buckets, counts.get(REWARD_SUM, 0.0))
        if float(buckets[0][0]) < 0:  # prometheus_client leaves these out when a bound is negative
            names = dict(zip(("namespace", "mode", "resources_id"), labels, strict=True))
            reward.samples.append(Sample("rollq_reward_count", names, buckets[-1][1], None))
            reward.samples.append(Sample("rollq_reward_sum", names, counts.get(REWARD_SUM, 0.0), None))
    yield reward


class SnapshotCollector(Collector):
    """A collector that reads a fresh snapshot at every scrape."""

    def __init__(self, read: Callable[[], Snapshot], keep_versions: int) -> None:
        self.read = read
        self.keep_versions = keep_versions

    def collect(self) -> Iterator[Metric]:
        return families(self.read(), self.keep_versions)


def registry(read: Callable[[], Snapshot], keep_versions: int | None = None) -> CollectorRegistry:
    """A registry holding only rollq's metrics (no process or Python collectors), read through ``read``;
    ``keep_versions`` defaults to the ``ROLLQ_METRICS_VERSIONS`` setting."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(read, keep_versions or Settings().metrics_versions))
    return reg


def render_prometheus(s: Snapshot) -> str:
    """The text exposition of one snapshot (what ``rollq status --prometheus`` prints)."""
    return generate_latest(registry(lambda: s)).decode()
