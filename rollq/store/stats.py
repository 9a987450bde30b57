"""The stats hash of a namespace (:attr:`rollq.store.keys.Keys.stats`): its counter fields and histograms.

The Lua scripts count into it (with the same field names, generated into their header by
:func:`rollq.store.scripts.lua_header`); ``rollq status`` and the Prometheus exporter read it.
"""

from __future__ import annotations

import bisect
from enum import StrEnum


class StatsField(StrEnum):
    """Fixed fields of the stats hash; the others are made by :func:`outcome_stat`, :func:`requeue_stat`,
    :func:`duration_stat`, :func:`reward_stat`."""

    SUPERSEDED = "superseded"
    DURATION_SUM = "duration:sum"
    RESULTS_BYTES = "results:bytes"  # payload bytes (rollout JSON + rollout id) on the results stream
    DROPPED_CANCELLED = "dropped:cancelled"  # results of cancelled attempts that arrived and were dropped
    TASK_MISSING = "task-missing"  # results whose task record Redis had lost: kept on the superseded stream
    REWARD_MISSING = "reward-missing"  # succeeded rollouts published with no reward at all
    GROUPS_DELIVERED = "groups:delivered"  # complete groups handed to a trainer by Producer.batches
    GROUPS_STALE_DROPPED = "groups:stale-dropped"  # groups older than the staleness bound, dropped
    GROUPS_STALE_REQUEUED = "groups:stale-requeued"  # groups older than the staleness bound, queued again
    GROUPS_FAILED_DROPPED = "groups:failed-dropped"  # groups with a failed, cancelled or lost member, dropped
    GATEWAY_REFUSED = "gateway:refused"  # rollouts posted to serve-al without their attempt's token, refused
    GATEWAY_RELEASED = "gateway:released"  # serve-al attempts whose lease ended unposted, handed back
    REDIS_REFUSALS = "redis:refusals"  # times a worker found Redis refusing commands (OOM, READONLY...) and waited
    REDIS_REFUSED_SECONDS = "redis:refused-seconds"  # how long those waits took, summed over workers


REQUEUED_PREFIX = "requeued:"
DURATION_PREFIX = "duration:"
REWARD_PREFIX = "reward:"
REWARD_SUM = "sum"
"""The ``bucket`` of :func:`reward_stat` that holds the sum of rewards rather than a count."""
REWARD_SEPARATOR = "|"


def outcome_stat(status: str, mode: str | None) -> str:
    """The stats field counting outcomes of ``status`` for tasks of ``mode`` (``succeeded:train``)."""
    return f"{status}:{mode or ''}"


def requeue_stat(reason: str) -> str:
    """The stats field counting requeues for ``reason`` (``requeued:unresponsive``)."""
    return REQUEUED_PREFIX + reason


def duration_stat(bucket: str) -> str:
    """The stats field counting rollouts whose duration falls in histogram ``bucket`` (``duration:0.5``)."""
    return DURATION_PREFIX + bucket


def reward_stat(mode: str | None, resources_id: str | None, bucket: str) -> str:
    """The stats field of the reward histogram for ``mode`` and ``resources_id``: ``reward:train|v3|0.5``.

    ``bucket`` is a histogram bound (``le``) or :data:`REWARD_SUM`. Modes and version ids never contain ``|``.
    """
    return f"{REWARD_PREFIX}{mode or ''}{REWARD_SEPARATOR}{resources_id or ''}{REWARD_SEPARATOR}{bucket}"


def parse_reward_stat(field: str) -> tuple[str, str, str] | None:
    """``(mode, resources_id, bucket)`` of a :func:`reward_stat` field; None for any other stats field."""
    if not field.startswith(REWARD_PREFIX):
        return None
    mode, resources_id, bucket = field[len(REWARD_PREFIX) :].split(REWARD_SEPARATOR, 2)
    return mode, resources_id, bucket


DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Upper bounds (seconds) of the rollout duration histogram kept in the stats hash."""


def duration_bucket(seconds: float) -> str:
    """The histogram bucket label (``le``) a rollout of ``seconds`` falls in."""
    i = bisect.bisect_left(DURATION_BUCKETS, seconds)
    return "+Inf" if i == len(DURATION_BUCKETS) else repr(DURATION_BUCKETS[i])


REWARD_BUCKETS = (
    -10.0,
    -5.0,
    -2.0,
    -1.0,
    -0.75,
    -0.5,
    -0.25,
    -0.1,
    0.0,
    0.1,
    0.25,
    0.5,
    0.75,
    0.9,
    1.0,
    2.0,
    5.0,
    10.0,
)
"""Upper bounds of the final-reward histogram kept in the stats hash, by mode and resources version.

Negative rewards have buckets of their own (they all landed in ``le="0.0"`` before); rollq's exposition keeps
``_sum`` and ``_count`` beside them (prometheus_client leaves both out of a histogram with negative bounds, and a
trainer wants the mean most of all). Counts stored under the old bounds stay in the buckets of the same name.
"""


def reward_bucket(reward: float) -> str:
    """The histogram bucket label (``le``) a final reward falls in."""
    i = bisect.bisect_left(REWARD_BUCKETS, reward)
    return "+Inf" if i == len(REWARD_BUCKETS) else repr(REWARD_BUCKETS[i])
