"""A worker's settings: ``ROLLQ_*`` environment variables (or a ``.env`` file), overridable in code or on the CLI.

:class:`WorkerSettings` extends rollq's one settings model (:class:`rollq.store.settings.Settings`: Redis URL,
namespace, logging, ...) with how a worker runs rollouts, so every value is type-checked with an error naming
the variable, ``.env`` counts the same for every setting, and a misspelt ``ROLLQ_*`` variable (in the
environment or in ``.env``) is reported with the closest valid name instead of ignored.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from rollq.store.jobs import DEFAULT_RESULT_TTL, MAX_RESULT_TTL
from rollq.store.settings import ENV_FILE, ENV_PREFIX, Settings, environ
from rollq.store.transitions import DEFAULT_RESULTS_MAX_BYTES

from .capture.gil import SWITCH_INTERVAL_SECONDS
from .executor import BUSY_LAG_SECONDS

log = logging.getLogger(__name__)

# Read by `rollq serve-agl` (its --key) and by the agent event loop (rollq/worker/executor.py), not settings of
# any model.
_OTHER_KNOWN: tuple[str, ...] = ("AGL_KEY", "EVENT_LOOP")
# Tests pass their own knobs to agents under this prefix.
_RESERVED_PREFIX = "ROLLQ_TEST_"
_warned: set[str] = set()
# The results stream's byte budget must hold at least this many of the largest rollouts allowed.
_ROLLOUTS_PER_BUDGET = 16


MAX_REDIS_CONNECTIONS = 8
"""The most Redis connections one worker process holds, whatever its ``concurrency``: one per thread that talks to
Redis (RQ's loop with its blocking dequeue, RQ's command channel, the batched starts, the batched finishes, the
heartbeat with its reaper turn, the LLM-gate listener and its reports: 7 at most, 5-6 measured) and one to spare;
rollout coroutines and agent threads never hold one. Each is named after the worker in ``CLIENT LIST``. Measured
by ``bench/connections.py`` (``bench/results/connections.json``), held by ``tests/store/test_connection_bound.py``;
docs/scaling.md sizes ``maxclients`` with it."""


class InvalidSettingError(ValueError):
    """A ``ROLLQ_*`` value (or override) of the wrong type or range; the message names the variable."""


class WorkerSettings(Settings):
    """How one worker process runs rollouts.

    Every field can be set from the environment as ``ROLLQ_<FIELD>``, e.g.
    ``ROLLQ_AGENT=myproject.agents:MathAgent`` or ``ROLLQ_CONCURRENCY=256``, or
    in a ``.env`` file in the working directory; ``ROLLQ_HOOKS`` takes a
    comma-separated list.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=ENV_FILE,
        extra="ignore",
        frozen=True,
        validate_default=False,
        allow_inf_nan=False,  # every number here is a count or a span of time: inf would never end a wait
    )

    agent: str = ""
    """``package.module:AgentClass`` (a LitAgent subclass), instantiated once per process."""
    hooks: Annotated[tuple[str, ...], NoDecode] = ()
    """``package.module:HookClass`` entries, run in order around each rollout."""
    hook_budget_seconds: float = Field(1.0, gt=0)
    """A hook call longer than this is logged and listed in the rollout's ``hook_overruns`` metadata (the attempt
    is heartbeated from its claim whatever hooks do, but a slow start hook delays the agents claimed after it)."""
    concurrency: int = Field(1, ge=1)
    """Rollouts in flight at once in this process; 1 behaves like plain RQ."""
    grace_seconds: float = Field(30.0, ge=0)
    """On SIGTERM/SIGINT, how long in-flight rollouts may finish before they are handed back."""
    heartbeat_seconds: float = Field(5.0, gt=0)
    """How often in-flight attempts heartbeat and this worker runs the reaper."""
    results_maxlen: int = Field(100_000, ge=1)
    """Entries the results stream is trimmed to, never past what a consumer group still needs."""
    results_max_bytes: int = Field(DEFAULT_RESULTS_MAX_BYTES, ge=1)
    """Hard limit of the results stream's payload bytes; routine trimming keeps it under half of this."""
    max_result_bytes: int = Field(8 * 1024 * 1024, ge=1)
    """A rollout whose JSON is larger is replaced by a failed rollout saying so; at most results_max_bytes / 16."""
    keep_seconds: int = Field(3600, ge=0)
    """How long a succeeded task's record is kept (0 = forever); failed ones stay for the dead-letter list. One hour,
    as RQ's job result TTL: at high rates records dominate memory (7 days at 32,000 rollouts/s was ~21 TB); the
    worker warns at start-up when its namespace's projected records exceed ``maxmemory`` (store/sizing.py)."""
    result_ttl: int = Field(DEFAULT_RESULT_TTL, ge=0, le=MAX_RESULT_TTL)
    """How long RQ keeps a finished job, for rq-dashboard (replaces ``rq worker --results-ttl``); at most a week."""
    wait_replicas: int | None = Field(None, ge=0)
    """Replicas that must hold each claim, finish and requeue (Redis ``WAIT``) before the worker goes on; 0 = off;
    unset: 1 on a ``redis+sentinel://`` URL, else 0. Bounds what a failover can undo (docs/reliability.md);
    a shortfall is logged, not raised, and makes the worker stop waiting until a replica is online again
    (:mod:`rollq.store.replication`)."""
    wait_timeout_ms: int = Field(1000, ge=1)
    """How long one ``WAIT`` may block before the worker goes on with a warning (0 would mean forever)."""
    capture_llm: bool = True
    """Route agents' LLM calls through this process's capturing proxy (``ROLLQ_CAPTURE_LLM=0`` turns it off)."""
    capture_switch_interval_ms: float = Field(SWITCH_INTERVAL_SECONDS * 1000, ge=0)
    """The GIL switch interval this process gets while its capturing proxy's thread serves a call over its socket, if
    the interpreter's is longer; 0 leaves the interpreter's (5 ms unless set). 1 ms keeps the proxy's calls from waiting
    long for the GIL while agents run Python; a CPU-bound worker spent about 9% less CPU per rollout at 5 ms and 8% more
    at 0.25 ms (``bench/switch_interval.py``; docs/workers.md, "The proxy and the GIL")."""
    capture_on_agent_loop: bool = False
    """Serve the capturing proxy on the async agents' event loop instead of a thread and loop of its own: no GIL
    hand-off between the proxy and the agents per call, but an async agent that makes a blocking LLM call (a sync
    client) on that loop waits for its own client's timeout (docs/workers.md, "The proxy on the agents' loop")."""
    capture_in_memory: bool = True
    """Hand agents' calls to the capturing proxy from async ``httpx2`` / ``httpx`` clients (the ``openai`` SDK's) to
    it in memory instead of over its socket: the same handling, without four HTTP writes and parses in one process
    (docs/workers.md, "Calls handed to the proxy in memory"; ``ROLLQ_CAPTURE_IN_MEMORY=0`` sends them over the
    socket)."""
    capture_in_memory_on_agent_loop: bool = True
    """With the proxy on a thread of its own, serve the calls that async agents hand over in memory on the agents'
    loop, where they are awaited, instead of passing each to the proxy's thread and back: no thread woken and no
    GIL handed over per call, and no sync client can block them (docs/workers.md, "Calls handed to the proxy in
    memory"; ``ROLLQ_CAPTURE_IN_MEMORY_ON_AGENT_LOOP=0`` serves them on the proxy's thread)."""
    capture_agent_loop_busy_ms: float = Field(BUSY_LAG_SECONDS * 1000, ge=0)
    """While callbacks on the agents' loop wait this long or longer for their turn (a moving average of its ticks'
    lateness), the calls handed over in memory are served on the proxy's thread instead: each step of a call served
    on a busy loop would wait that long again (a CPU-bound worker; docs/workers.md, "Calls handed to the proxy in
    memory")."""
    llm_pause_wait_seconds: float = Field(60.0, ge=0)
    """How long an LLM call waits at the capturing proxy while calls are paused for a weight sync; past it the agent
    gets HTTP 503 with Retry-After (an upstream error, never a silent drop)."""
    llm_gate_listen: bool = True
    """Follow weight-sync pauses on a Redis pub/sub channel too, so a pause is seen at once rather than at the next
    heartbeat, for one idle Redis connection per worker process (``ROLLQ_LLM_GATE_LISTEN=0``: the heartbeat only)."""
    triplet_agent: str = ""
    """When set, triplets come only from LLM calls made under the agent of this name (``gen_ai.agent.name``)."""
    rollout_trace: Literal["all", "failed", "none"] = "all"
    """Which published rollouts keep their ``trace`` (the OpenTelemetry spans as JSON): ``all``; ``failed`` (a
    succeeded rollout is published with ``trace`` null, a failed one keeps it: its spans say what went wrong);
    ``none``. Triplets, rewards and metadata are the same either way (they are read from the spans first), and
    hooks see the whole rollout. A captured LLM call's span repeats its messages and token ids, so the trace is most
    of a rollout's bytes (docs/workers.md, "Keeping the trace")."""

    @model_validator(mode="after")
    def _budget_holds_the_largest_rollouts(self) -> WorkerSettings:
        if self.max_result_bytes * _ROLLOUTS_PER_BUDGET > self.results_max_bytes:
            # Routine trimming keeps half the budget: it must hold a useful number of the largest rollouts.
            raise ValueError(
                f"max_result_bytes ({self.max_result_bytes}) must be at most results_max_bytes / "
                f"{_ROLLOUTS_PER_BUDGET} ({self.results_max_bytes // _ROLLOUTS_PER_BUDGET}): "
                "lower ROLLQ_MAX_RESULT_BYTES or raise ROLLQ_RESULTS_MAX_BYTES"
            )
        return self

    @field_validator("hooks", mode="before")
    @classmethod
    def _split_hooks(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(h.strip() for h in value.split(",") if h.strip())
        return value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WorkerSettings:
        """Settings from ``ROLLQ_*`` variables (``env``, default the process's and ``.env``), then ``overrides``.

        None overrides are ignored. Raises :class:`InvalidSettingError` naming the variable.
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            if env is None:
                warn_unknown(environ())
                return cls(**given)
            warn_unknown(env)
            raw = {
                name: env[ENV_PREFIX + name.upper()] for name in cls.model_fields if env.get(ENV_PREFIX + name.upper())
            }
            return cls.model_validate({**raw, **given})
        except ValidationError as exc:
            raise InvalidSettingError(_one_line(exc, given)) from exc


def _one_line(exc: ValidationError, overrides: Mapping[str, Any]) -> str:
    problems = []
    for error in exc.errors():
        if not error["loc"]:  # a check across fields
            problems.append(error["msg"].removeprefix("Value error, "))
            continue
        name = str(error["loc"][0])
        where = name if name in overrides else ENV_PREFIX + name.upper()
        problems.append(f"{where}={error.get('input')!r}: {error['msg']}")
    return "invalid setting " + "; ".join(problems)


def known_variables() -> list[str]:
    return [ENV_PREFIX + name.upper() for name in (*WorkerSettings.model_fields, *_OTHER_KNOWN)]


def warn_unknown(env: Mapping[str, str]) -> list[str]:
    """Log a warning for each ``ROLLQ_*`` variable rollq does not know, naming the closest known one."""
    known = known_variables()
    unknown = [
        name
        for name in env
        if name.startswith(ENV_PREFIX) and name not in known and not name.startswith(_RESERVED_PREFIX)
    ]
    for name in unknown:
        if name in _warned:
            continue  # the CLI and the worker settings both check; say it once
        _warned.add(name)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        log.warning("unknown setting %s is ignored%s", name, hint)
    return unknown
