"""What rollq's dashboard pages show, read from Redis into small values the templates render."""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import redis

from rollq.models.contract import Rollout
from rollq.store.keys import Keys, StreamField
from rollq.store.records import TaskRecord, read_records

# Newest entries of the results stream the list and charts read per page view: enough for an hour at a few
# rollouts per second, bounded so a page never reads the whole stream.
RECENT = 2000


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

    @property
    def finished_text(self) -> str:
        return time.strftime("%H:%M:%S", time.gmtime(self.finished))


@dataclass(frozen=True)
class Filters:
    status: str = ""
    mode: str = ""
    resources_id: str = ""

    def keep(self, row: RolloutRow) -> bool:
        return (
            (not self.status or row.status == self.status)
            and (not self.mode or row.mode == self.mode)
            and (not self.resources_id or row.resources_id == self.resources_id)
        )


def _entry_time(entry_id: bytes) -> float:
    return int(entry_id.split(b"-")[0]) / 1000.0


def recent_rollouts(connection: redis.Redis, keys: Keys, count: int = RECENT) -> list[tuple[float, Rollout]]:
    """The newest ``count`` final rollouts (newest first) with the time each was published."""
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], connection.xrevrange(keys.results, count=count))
    return [
        (_entry_time(eid), Rollout.model_validate_json(fields[StreamField.ROLLOUT.encode()])) for eid, fields in entries
    ]


def _row(published: float, rollout: Rollout, record: TaskRecord | None) -> RolloutRow:
    meta = rollout.metadata
    error = meta.get("error") or {}
    task = record.task if record else None
    claimed = task.last_claim_time if task else None
    return RolloutRow(
        rollout_id=rollout.rollout_id,
        status=str(meta.get("status", "?")),
        mode=(task.mode if task else None) or "",
        resources_id=str(meta.get("resources_id") or (task.resources_id if task else "") or ""),
        reward=rollout.final_reward,
        attempt=int(meta.get("attempt") or 0),
        worker=str(meta.get("worker") or ""),
        finished=published,
        duration=published - claimed if claimed and published >= claimed else None,
        error=f"{error.get('type')}: {error.get('message')}" if error else "",
    )


def rollout_rows(connection: redis.Redis, keys: Keys, filters: Filters, limit: int = 200) -> list[RolloutRow]:
    recent = recent_rollouts(connection, keys)
    records = read_records(connection, keys, [r.rollout_id for _, r in recent])
    rows = [_row(t, r, records.get(r.rollout_id)) for t, r in recent]
    return [row for row in rows if filters.keep(row)][:limit]


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


def rollout_page(connection: redis.Redis, keys: Keys, rollout_id: str) -> RolloutPage | None:
    record = read_records(connection, keys, [rollout_id]).get(rollout_id)
    rollout = None
    if record is not None and record.result_id:
        reply = cast(list[Any], connection.xrange(keys.results, min=record.result_id, max=record.result_id))
        if reply:
            rollout = Rollout.model_validate_json(reply[0][1][StreamField.ROLLOUT.encode()])
    if rollout is None:
        if record is None:
            return None
        rollout = Rollout(rollout_id=rollout_id, metadata={"status": record.state.value})
    page = RolloutPage(
        rollout=rollout,
        record=record,
        input_json=json.dumps(record.task.input, indent=2, default=str) if record else "(record expired)",
    )
    page.spans, page.total_ms = waterfall(rollout.trace or [])
    page.triplets = [
        TripletRow(i, _text(t.prompt), _text(t.response), _tokens(t.prompt), _tokens(t.response), t.reward)
        for i, t in enumerate(rollout.triplets or [], 1)
    ]
    return page


@dataclass(frozen=True)
class Series:
    """Points ``(time, value)`` of one line of a chart."""

    label: str
    points: list[tuple[float, float]]


def charts(connection: redis.Redis, keys: Keys, bucket_seconds: int = 60) -> tuple[Series, list[Series]]:
    """Throughput (rollouts per minute) and mean reward per resources version, per time bucket."""
    recent = recent_rollouts(connection, keys)
    counts: dict[float, int] = defaultdict(int)
    rewards: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for published, rollout in recent:
        bucket = math.floor(published / bucket_seconds) * bucket_seconds
        counts[bucket] += 1
        if rollout.final_reward is not None and math.isfinite(rollout.final_reward):
            version = str(rollout.metadata.get("resources_id") or "none")
            rewards[version][bucket].append(rollout.final_reward)
    throughput = Series("rollouts per minute", [(t, counts[t] * 60.0 / bucket_seconds) for t in sorted(counts)])
    by_version = [
        Series(version, [(t, sum(v) / len(v)) for t, v in sorted(points.items())])
        for version, points in sorted(rewards.items())
    ]
    return throughput, by_version
