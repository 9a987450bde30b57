"""rollq's one settings model: what every command and every worker reads, from CLI flags, then the environment,
then a ``.env`` file in the working directory.

:class:`Settings` holds what every process needs (which Redis, which namespace, logging, the dashboard's token, how
long to wait for Redis at start-up); :class:`rollq.worker.config.WorkerSettings` extends it with how a worker runs
rollouts. Both are pydantic-settings models with the ``ROLLQ_`` prefix and ``.env`` support, so a value in
``.env`` counts the same everywhere (it did not: ``ROLLQ_REDIS_URL`` and ``ROLLQ_NAMESPACE`` in ``.env`` were
ignored by every command while other ``.env`` settings were used), and a ``ROLLQ_*`` name that is none of theirs is
reported with the closest valid one (:func:`rollq.worker.config.warn_unknown`). The ``rollq`` command applies its
flags over these (:mod:`rollq.ops.cli`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from dotenv import dotenv_values
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .keys import DEFAULT_NAMESPACE

ENV_PREFIX = "ROLLQ_"
ENV_FILE = ".env"


class Settings(BaseSettings):
    """What every rollq process reads: ``ROLLQ_<FIELD>`` in the environment, else in ``.env``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_file=ENV_FILE, extra="ignore", frozen=True, validate_default=False
    )

    redis_url: str | None = None
    """Redis URL (redis://, rediss://, unix://, redis+sentinel://, memory://); then ``REDIS_URL``, then
    redis://localhost:6379/0."""
    namespace: str = DEFAULT_NAMESPACE
    """Namespace (and RQ queue name) to work in."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    """Log level of short commands (any case)."""
    log_format: Literal["text", "json"] = "text"
    """``json`` for one JSON object per log line."""
    dashboard_token: str = ""
    """Token ``rollq dashboard`` and ``rollq metrics`` require (basic auth password or bearer)."""
    al_key: str = ""
    """Bearer key ``rollq serve-al`` requires (``Authorization: Bearer`` or ``x-api-key``); without one it serves
    loopback only."""
    redis_wait_seconds: float = Field(default=60.0, ge=0)
    """How long a worker starting up waits for Redis to answer before it gives up (0: not at all)."""
    metrics_versions: int = Field(default=5, ge=1)
    """Resources versions ``/metrics`` labels one by one (the newest, in numeric order); older ones are folded
    into ``resources_id="older"`` so that the series do not grow with every weight update."""

    tasks_per_job: int = Field(default=1, ge=1, le=1000)
    """Tasks one RQ job carries ("packs", issue 24): a producer queues a batch of N tasks as ceil(N/K) RQ jobs, and
    a worker dequeues a job only when this many of its slots (at most its concurrency) are free. 1: one RQ job per
    task, as before packs. Give producers and workers the same value (docs/rq.md, "Packs")."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


def file_environ(path: str | Path = ENV_FILE) -> dict[str, str]:
    """The ``ROLLQ_*`` (and ``REDIS_URL``) entries of a ``.env`` file; empty when there is none."""
    if not Path(path).is_file():
        return {}
    return {
        k: v for k, v in dotenv_values(path).items() if v is not None and (k.startswith(ENV_PREFIX) or k == "REDIS_URL")
    }


def environ(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment as rollq sees it: ``env`` (default the process's) over the ``.env`` file's entries."""
    return {**file_environ(), **(os.environ if env is None else env)}
