"""A worker's settings: from ``ROLLQ_*`` environment variables, overridable in code or on the CLI."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from rollq.store.jobs import DEFAULT_RESULT_TTL
from rollq.store.transitions import DEFAULT_RESULTS_MAX_BYTES

# The results stream's byte budget must hold at least this many of the largest rollouts allowed.
_ROLLOUTS_PER_BUDGET = 16


@dataclass(frozen=True)
class WorkerSettings:
    """How one worker process runs rollouts.

    Every field can be set from the environment as ``ROLLQ_<FIELD>``, e.g.
    ``ROLLQ_AGENT=myproject.agents:MathAgent`` or ``ROLLQ_CONCURRENCY=256``;
    ``ROLLQ_HOOKS`` takes a comma-separated list.
    """

    agent: str = ""
    """``package.module:AgentClass`` (a LitAgent subclass), instantiated once per process."""
    hooks: tuple[str, ...] = field(default_factory=tuple)
    """``package.module:HookClass`` entries, run in order around each rollout."""
    concurrency: int = 1
    """Rollouts in flight at once in this process; 1 behaves like plain RQ."""
    grace_seconds: float = 30.0
    """On SIGTERM/SIGINT, how long in-flight rollouts may finish before they are handed back."""
    heartbeat_seconds: float = 5.0
    """How often in-flight attempts heartbeat and this worker runs the reaper."""
    results_maxlen: int = 100_000
    """Entries the results stream is trimmed to, never past what a consumer group still needs."""
    results_max_bytes: int = DEFAULT_RESULTS_MAX_BYTES
    """Hard limit of the results stream's payload bytes; routine trimming keeps it under half of this."""
    max_result_bytes: int = 8 * 1024 * 1024
    """A rollout whose JSON is larger is replaced by a failed rollout saying so; at most results_max_bytes / 16."""
    keep_seconds: int = 7 * 24 * 3600
    """How long a succeeded task's record is kept (0 = forever); failed ones stay for the dead-letter list."""
    result_ttl: int = DEFAULT_RESULT_TTL
    """How long RQ keeps a finished job, for rq-dashboard (replaces ``rq worker --results-ttl``)."""
    capture_llm: bool = True
    """Route agents' LLM calls through this process's capturing proxy (``ROLLQ_CAPTURE_LLM=0`` turns it off)."""
    triplet_agent: str = ""
    """When set, triplets come only from LLM calls made under the agent of this name (``gen_ai.agent.name``)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.heartbeat_seconds <= 0 or self.grace_seconds < 0:
            raise ValueError("heartbeat_seconds must be > 0 and grace_seconds >= 0")
        if self.max_result_bytes * _ROLLOUTS_PER_BUDGET > self.results_max_bytes:
            # Routine trimming keeps half the budget: it must hold a useful number of the largest rollouts.
            raise ValueError(
                f"max_result_bytes ({self.max_result_bytes}) must be at most results_max_bytes / "
                f"{_ROLLOUTS_PER_BUDGET} ({self.results_max_bytes // _ROLLOUTS_PER_BUDGET}): "
                "lower ROLLQ_MAX_RESULT_BYTES or raise ROLLQ_RESULTS_MAX_BYTES"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WorkerSettings:
        """Settings from ``ROLLQ_*`` variables, then ``overrides`` (None values are ignored)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"ROLLQ_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            if f.name == "hooks":
                values[f.name] = tuple(h.strip() for h in raw.split(",") if h.strip())
            elif f.name in ("agent", "triplet_agent"):
                values[f.name] = raw
            elif f.name == "capture_llm":
                values[f.name] = _flag(f.name, raw)
            else:
                kind = float if f.name.endswith("_seconds") and f.name != "keep_seconds" else int
                try:
                    values[f.name] = kind(raw)
                except ValueError as exc:
                    raise ValueError(f"ROLLQ_{f.name.upper()}={raw!r} is not a valid {kind.__name__}") from exc
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)


def _flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"ROLLQ_{name.upper()}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")
