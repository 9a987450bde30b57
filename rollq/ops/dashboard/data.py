"""What rollq's dashboard pages show, read from Redis into small values the templates (and the JSON the pages
poll) render.

Lists and charts read the summaries stream (:mod:`rollq.store.summaries`, filtered and counted inside Redis) and
the stats hash, never the results stream: a page view reads one page of ~300-byte summaries. Only a rollout's own
page reads its rollout (one results-stream entry).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import redis

from rollq.models.contract import Rollout
from rollq.models.wire import parse_rollout
from rollq.store.keys import Keys, StreamField
from rollq.store.payloads import load_payloads, missing_payload
from rollq.store.queries import AttemptInfo, read_attempts
from rollq.store.records import TaskRecord, read_records
from rollq.store.stats import REWARD_SUM, parse_reward_stat
from rollq.store.summaries import (
    Summary,
    SummaryFilter,
    SummaryPage,
    counts_by_time,
    sort_versions,
    summary_page,
)

CHART_SUMMARIES = 20_000
"""Newest summaries the throughput chart counts (inside Redis): hours at a few rollouts per second."""
PAGE_SIZE = 50


@dataclass(frozen=True)
class RolloutRow:
    """One finished rollout as the list shows it."""

    rollout_id: str
    status: str
    mode: str
    resources_id: str
    reward: float | None
    attempt: int
    worker: str
    finished: float
    duration: float | None
    error: str
    tokens: int | None = None

    @property
    def finished_text(self) -> str:
        return time.strftime("%H:%M:%S", time.gmtime(self.finished))

    @classmethod
    def of(cls, s: Summary) -> RolloutRow:
        tokens = (s.prompt_tokens or 0) + (s.response_tokens or 0)
        return cls(
            rollout_id=s.rollout_id,
            status=s.status,
            mode=s.mode,
            resources_id=s.resources_id or "",
            reward=s.reward,
            attempt=s.attempt or 0,
            worker=s.worker or "",
            finished=s.finished,
            duration=s.duration,
            error=f"{s.error_type}: {s.error_message or ''}".rstrip(": ") if s.error_type else "",
            tokens=tokens or None,
        )

    def to_json(self) -> dict[str, Any]:
        """The row as the rollouts page's script renders it (same columns as the template)."""
        return {
            "rollout_id": self.rollout_id,
            "status": self.status,
            "mode": self.mode,
            "resources_id": self.resources_id,
            "reward": None if self.reward is None else f"{self.reward:.3f}",
            "attempt": self.attempt,
            "tokens": self.tokens,
            "duration": None if self.duration is None else f"{self.duration:.2f}s",
            "finished": self.finished_text,
            "error": self.error,
        }


Filters = SummaryFilter


@dataclass(frozen=True)
class RolloutList:
    rows: list[RolloutRow]
    before: str | None
    scanned: int


def rollout_rows(
    connection: redis.Redis, keys: Keys, filters: Filters, *, before: str | None = None, limit: int = PAGE_SIZE
) -> RolloutList:
    """One page of finished rollouts, newest first, from the summaries stream."""
    page: SummaryPage = summary_page(connection, keys, filters, before=before or None, limit=limit)
    return RolloutList([RolloutRow.of(s) for s in page.rows], page.before, page.scanned)


@dataclass(frozen=True)
class Span:
    name: str
    offset_ms: float
    duration_ms: float
    depth: int
    error: bool
    attributes: dict[str, Any]


@dataclass(frozen=True)
class TripletRow:
    index: int
    prompt: str
    response: str
    prompt_tokens: int | None
    response_tokens: int | None
    reward: float | None


@dataclass
class RolloutPage:
    rollout: Rollout
    record: TaskRecord | None
    input_json: str
    spans: list[Span] = field(default_factory=list)
    total_ms: float = 0.0
    triplets: list[TripletRow] = field(default_factory=list)
    attempts: list[AttemptInfo] = field(default_factory=list)
    traceback: str = ""
    result_trimmed: bool = False


def _iso(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def waterfall(trace: list[dict[str, Any]]) -> tuple[list[Span], float]:
    """Spans ordered by start, each with its offset from the first start and its depth in the parent tree."""
    timed = [(s, _iso(s.get("start_time")), _iso(s.get("end_time"))) for s in trace]
    starts = [t for _, t, _ in timed if t is not None]
    if not starts:
        return [], 0.0
    origin = min(starts)
    ids = {(s.get("context") or {}).get("span_id"): s for s in trace}

    def depth(span: dict[str, Any]) -> int:
        d, parent = 0, span.get("parent_id")
        while parent in ids and d < 50:
            d, parent = d + 1, ids[parent].get("parent_id")
        return d

    spans = [
        Span(
            name=str(s.get("name")),
            offset_ms=(start - origin) * 1000,
            duration_ms=max(0.0, ((end or start) - start) * 1000),
            depth=depth(s),
            error=(s.get("status") or {}).get("status_code") == "ERROR",
            attributes=s.get("attributes") or {},
        )
        for s, start, end in sorted(((s, a, b) for s, a, b in timed if a is not None), key=lambda x: x[1] or 0)
    ]
    total = max((sp.offset_ms + sp.duration_ms for sp in spans), default=0.0)
    return spans, total


def _text(value: Any) -> str:
    if isinstance(value, dict) and "text" in value:
        value = value["text"]
    return value if isinstance(value, str) else json.dumps(value, default=str)[:2000]


def _tokens(value: Any) -> int | None:
    if isinstance(value, dict) and isinstance(value.get("token_ids"), list):
        return len(value["token_ids"])
    return None


def traceback_of(rollout: Rollout) -> str:
    """The failure's traceback: the one rollq recorded in ``metadata.error``, else an exception event of a span."""
    error = rollout.metadata.get("error")
    if isinstance(error, dict) and isinstance(error.get("traceback"), str):
        return error["traceback"]
    for span in rollout.trace or []:
        for event in span.get("events") or []:
            stack = (event.get("attributes") or {}).get("exception.stacktrace") if isinstance(event, dict) else None
            if isinstance(stack, str) and stack:
                return stack
    return ""


def rollout_page(connection: redis.Redis, keys: Keys, rollout_id: str) -> RolloutPage | None:
    record = read_records(connection, keys, [rollout_id]).get(rollout_id)
    rollout = None
    if record is not None and record.result_id:
        reply = cast(list[Any], connection.xrange(keys.results, min=record.result_id, max=record.result_id))
        if reply:
            load_payloads(connection, [reply[0][1]])
        if reply and missing_payload(reply[0][1]) is None:
            rollout = parse_rollout(reply[0][1][StreamField.ROLLOUT.encode()])
    trimmed = rollout is None and record is not None and record.result_id is not None
    if rollout is None:
        if record is None:
            return None
        rollout = Rollout(rollout_id=rollout_id, metadata={"status": record.state.value})
    page = RolloutPage(
        rollout=rollout,
        record=record,
        input_json=json.dumps(record.task.input, indent=2, default=str) if record else "(record expired)",
        attempts=read_attempts(connection, keys, rollout_id) if record else [],
        traceback=traceback_of(rollout),
        result_trimmed=trimmed,
    )
    page.spans, page.total_ms = waterfall(rollout.trace or [])
    page.triplets = [
        TripletRow(i, _text(t.prompt), _text(t.response), _tokens(t.prompt), _tokens(t.response), t.reward)
        for i, t in enumerate(rollout.triplets or [], 1)
    ]
    return page


@dataclass(frozen=True)
class Series:
    """Points ``(x, value)`` of one line of a chart."""

    label: str
    points: list[tuple[float, float]]


def throughput(connection: redis.Redis, keys: Keys, bucket_seconds: int = 60) -> Series:
    """Finished rollouts per minute, per time bucket, over the newest :data:`CHART_SUMMARIES` summaries (counted
    inside Redis: only the counts are read)."""
    counts = counts_by_time(connection, keys, count=CHART_SUMMARIES, bucket_seconds=bucket_seconds)
    return Series("rollouts per minute", [(t, counts[t] * 60.0 / bucket_seconds) for t in sorted(counts)])


@dataclass(frozen=True)
class RewardByVersion:
    """Mean final reward per resources version (numeric order: training progress), one line per mode."""

    versions: list[str]
    series: list[Series]  # x = index into versions
    counts: dict[str, int]  # rollouts with a reward, per version


def reward_by_version(stats: dict[str, float]) -> RewardByVersion:
    """From the stats hash's reward histograms (every rollout ever counted, not a recent window)."""
    sums: dict[tuple[str, str], float] = defaultdict(float)
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for name, value in stats.items():
        parsed = parse_reward_stat(name)
        if parsed is None:
            continue
        mode, version, bucket = parsed
        if bucket == REWARD_SUM:
            sums[(mode, version or "none")] += value
        else:
            counts[(mode, version or "none")] += int(value)
    versions = sort_versions({v for _, v in counts})
    index = {v: i for i, v in enumerate(versions)}
    ordered = sorted(counts.items(), key=lambda kv: index[kv[0][1]])
    series = [
        Series(
            mode or "(no mode)",
            [(index[v], sums[(m, v)] / n) for (m, v), n in ordered if m == mode and n],
        )
        for mode in sorted({m for m, _ in counts})
    ]
    per_version: dict[str, int] = defaultdict(int)
    for (_, v), n in counts.items():
        per_version[v] += n
    return RewardByVersion(versions, series, dict(per_version))


def read_stats(connection: redis.Redis, keys: Keys) -> dict[str, float]:
    """The stats hash as numbers (a corrupt counter reads as 0)."""
    out: dict[str, float] = {}
    for k, v in cast(dict[bytes, bytes], connection.hgetall(keys.stats)).items():
        try:
            out[k.decode()] = float(v)
        except ValueError:
            out[k.decode()] = 0.0
    return out
