"""Compact per-rollout summaries: what a dashboard lists, filters and charts without reading rollouts.

A final rollout can be megabytes (token ids, traces); listing a page of them from the results stream read
hundreds of MB per view. So each publication (``lua/finish.lua``, ``reject.lua``, ``cancel.lua``) also adds one
small entry to :attr:`~rollq.store.keys.Keys.summaries`: the rollout id, the task's mode, the results-stream entry
it describes and a JSON summary built here (:func:`summary_json`) of at most a few hundred bytes (every string is
cut to a bound). The stream is bounded by the same entry count as the results stream (``MAXLEN ~``); as its
entries are small it outlives the results it describes, which is what a long run's history wants.

Reading is paged newest first (:func:`summary_page`) with the filters applied inside Redis while scanning
(``lua/summary_page.lua``), so only matching summaries travel: a page costs ``limit`` x ~300 bytes of network
reads whatever the stream holds. A scan stops after ``scan_limit`` entries (a few tens of ms of Redis time); a
filter that matches rarely answers with what it found and a cursor to go on from. Charts count summaries per
time bucket inside Redis too (:func:`counts_by_time`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import redis

from rollq.models.contract import Rollout
from rollq.models.groups import membership

from .keys import Keys, StreamField
from .scripts import load_script

STRING_LIMIT = 120
"""Longest string a summary keeps (worker name, version, group id, error type)."""
MESSAGE_LIMIT = 200
"""Longest error message a summary keeps (the rollout itself has the whole message and the traceback)."""
SCAN_LIMIT = 20_000
"""Most summaries one :func:`summary_page` scans inside Redis (a few tens of ms of its time)."""


def _cut(value: Any, limit: int = STRING_LIMIT) -> str | None:
    if value is None or value == "":
        return None
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _token_count(side: Any) -> int:
    if isinstance(side, dict) and isinstance(side.get("token_ids"), list):
        return len(side["token_ids"])
    return 0


def summary_json(rollout: Rollout, *, status: str, duration: float | None = None) -> str:
    """The summary of ``rollout`` (as stamped for publication) that finishes with ``status``, as JSON.

    Keys are left out when they have no value. Token counts add up the triplets' ``token_ids``.
    """
    meta = rollout.metadata
    error = meta.get("error") if isinstance(meta.get("error"), dict) else None
    group = membership(rollout.rollout_id, meta)
    reward = rollout.final_reward
    triplets = rollout.triplets or []
    values: dict[str, Any] = {
        "status": status,
        "reward": reward if reward is not None and math.isfinite(reward) else None,
        "version": _cut(meta.get("resources_id")),
        "group": _cut(group.group_id) if group else None,
        "group_index": group.index if group else None,
        "attempt": meta.get("attempt") if isinstance(meta.get("attempt"), int) else None,
        "generation": meta.get("generation") if isinstance(meta.get("generation"), int) else None,
        "worker": _cut(meta.get("worker")),
        "duration": round(duration, 4) if duration is not None and math.isfinite(duration) else None,
        "triplets": len(triplets) or None,
        "prompt_tokens": sum(_token_count(t.prompt) for t in triplets) or None,
        "response_tokens": sum(_token_count(t.response) for t in triplets) or None,
        "error": _cut(error.get("type")) if error else None,
        "error_message": _cut(error.get("message"), MESSAGE_LIMIT) if error else None,
    }
    return json.dumps({k: v for k, v in values.items() if v is not None}, separators=(",", ":"))


def minimal_summary_json(
    *, status: str, attempt: int, reward: float | None, resources_id: str | None, duration: float | None
) -> str:
    """A summary from what a finish call knows without the rollout (for publishers that do not build one)."""
    values: dict[str, Any] = {
        "status": status,
        "reward": reward if reward is not None and math.isfinite(reward) else None,
        "version": _cut(resources_id),
        "attempt": attempt,
        "duration": round(duration, 4) if duration is not None and math.isfinite(duration) else None,
    }
    return json.dumps({k: v for k, v in values.items() if v is not None}, separators=(",", ":"))


@dataclass(frozen=True)
class Summary:
    """One finished rollout as a summary says it; ``finished`` is the time of its summary entry."""

    rollout_id: str
    entry_id: str
    finished: float
    mode: str
    status: str
    reward: float | None = None
    resources_id: str | None = None
    group_id: str | None = None
    group_index: int | None = None
    attempt: int | None = None
    generation: int | None = None
    worker: str | None = None
    duration: float | None = None
    triplets: int | None = None
    prompt_tokens: int | None = None
    response_tokens: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    result_id: str | None = None

    @classmethod
    def parse(cls, entry_id: bytes | str, fields: dict[bytes, bytes]) -> Summary:
        """A summaries-stream entry; a summary that is not JSON of an object leaves only the id and time."""
        eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        get = lambda f: (fields.get(f.encode()) or b"").decode(errors="replace")  # noqa: E731
        try:
            data = json.loads(get(StreamField.SUMMARY) or "{}")
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}

        def num(key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        def integer(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) else None

        return cls(
            rollout_id=get(StreamField.ROLLOUT_ID),
            entry_id=eid,
            finished=int(eid.split("-")[0]) / 1000.0,
            mode=get(StreamField.MODE),
            status=text("status") or "?",
            reward=num("reward"),
            resources_id=text("version"),
            group_id=text("group"),
            group_index=integer("group_index"),
            attempt=integer("attempt"),
            generation=integer("generation"),
            worker=text("worker"),
            duration=num("duration"),
            triplets=integer("triplets"),
            prompt_tokens=integer("prompt_tokens"),
            response_tokens=integer("response_tokens"),
            error_type=text("error"),
            error_message=text("error_message"),
            result_id=get(StreamField.RESULT) or None,
        )


@dataclass(frozen=True)
class SummaryFilter:
    """Which summaries a page keeps; an empty field keeps all."""

    status: str = ""
    mode: str = ""
    resources_id: str = ""
    group: str = ""

    @property
    def active(self) -> bool:
        return bool(self.status or self.mode or self.resources_id or self.group)

    def keep(self, s: Summary) -> bool:
        return (
            (not self.status or s.status == self.status)
            and (not self.mode or s.mode == self.mode)
            and (not self.resources_id or s.resources_id == self.resources_id)
            and (not self.group or s.group_id == self.group)
        )


@dataclass(frozen=True)
class SummaryPage:
    """Summaries newest first; ``before`` is the cursor of the next (older) page, None at the oldest entry.

    ``scanned`` entries were read to fill it; when a rare filter stops the scan at its limit, ``rows`` may be
    short (even empty) while ``before`` is not None.
    """

    rows: list[Summary]
    before: str | None
    scanned: int


def summary_page(
    connection: redis.Redis,
    keys: Keys,
    filters: SummaryFilter = SummaryFilter(),  # noqa: B008  # frozen, so one shared default is safe
    *,
    before: str | None = None,
    limit: int = 50,
    scan_limit: int = SCAN_LIMIT,
) -> SummaryPage:
    """Up to ``limit`` summaries older than entry ``before`` (newest first) that ``filters`` keeps, scanning at
    most ``scan_limit`` entries inside Redis (``lua/summary_page.lua``): only the matches are sent."""
    script = load_script(connection, "summary_page")
    reply = cast(
        list[Any],
        script(
            keys=[keys.summaries],
            args=[
                f"({before}" if before else "+",
                limit,
                scan_limit,
                filters.status,
                filters.mode,
                filters.resources_id,
                filters.group,
            ],
        ),
    )
    entries, last, scanned, exhausted = reply
    rows = [Summary.parse(eid, dict(zip(fields[::2], fields[1::2], strict=True))) for eid, fields in entries]
    last_id = last.decode() if isinstance(last, bytes) else str(last)
    if exhausted or not last_id:
        return SummaryPage(rows, None, int(scanned))
    if not connection.xrevrange(keys.summaries, max=f"({last_id}", count=1):  # nothing older: no next page
        return SummaryPage(rows, None, int(scanned))
    return SummaryPage(rows, last_id, int(scanned))


def counts_by_time(connection: redis.Redis, keys: Keys, *, count: int, bucket_seconds: int) -> dict[float, int]:
    """How many of the newest ``count`` summaries finished in each ``bucket_seconds`` bucket (keyed by its start,
    epoch seconds), counted inside Redis (``lua/summary_counts.lua``)."""
    script = load_script(connection, "summary_counts")
    flat = cast(list[int], script(keys=[keys.summaries], args=[count, bucket_seconds * 1000]))
    return {int(flat[i]) / 1000.0: int(flat[i + 1]) for i in range(0, len(flat), 2)}


def recent_summaries(connection: redis.Redis, keys: Keys, count: int = SCAN_LIMIT) -> list[Summary]:
    """The newest ``count`` summaries, newest first."""
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], connection.xrevrange(keys.summaries, count=count))
    return [Summary.parse(eid, fields) for eid, fields in entries]


_DIGITS = re.compile(r"(\d+)")


def version_order(version: str) -> tuple[Any, ...]:
    """Sort key of a resources version id in numeric order (``v2`` before ``v10``), text as a tie-break."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(version))


def sort_versions(versions: Iterable[str]) -> list[str]:
    """``versions`` in numeric order."""
    return sorted(versions, key=version_order)
