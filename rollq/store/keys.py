"""The one place that knows where rollq keeps things in Redis, and the formats inside those keys (but the stats
hash's, which are :mod:`rollq.store.stats`'s).

Every rollq key of a namespace starts with the hash tag ``{namespace}``, so rollq's own keys land in one slot.
RQ's own keys (queue list, job hashes, registries, and the global ``rq:queues``, ``rq:workers``,
``rq:suspended``) keep RQ's names, and the enqueue, requeue, revive, reissue and restore scripts touch them
beside rollq's. For a plain namespace (``rollq``) they are RQ's usual names, in many slots: fine on one server.

A Redis Cluster namespace is written in braces, ``{name}``: its name is its own hash tag. Then RQ's queue is
``{name}`` (``rq:queue:{name}``, ``rq:wip:{name}``...), its job ids and worker names start with ``{name}``
(``rq:job:{name}rollq-...``), and RQ's three global keys become the namespace's own (``rq:{name}:queues``,
``rq:{name}:workers``, ``rq:{name}:suspended``, set on RQ's objects by :mod:`rollq.store.jobs`), so every key the
namespace touches lives in the slot of ``name`` (docs/scaling.md, "Redis Cluster"). This module asks RQ for its
names instead of spelling them again.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from enum import StrEnum

from .jobs import (
    RQ_QUEUES_KEY,
    RQ_SUSPENDED_KEY,
    RQ_WORKERS_KEY,
    rq_intermediate_key,
    rq_job_key,
    rq_queue_key,
    rq_queues_key,
    rq_results_key,
    rq_suspended_key,
    rq_workers_key,
)

DEFAULT_NAMESPACE = "rollq"

RESULTS_KEY, PAYLOAD_KEY = "results", "payload"
"""The names of the results stream and of the payload keys after their namespace's tag (``{ns}:results``,
``{ns}:payload:...``): ``lua/trim_results.lua`` tells a payload key from the stream's name by them."""

REAPED_WORKER_SECONDS = 900
"""How long :meth:`Keys.reaped_worker` is kept: longer than RQ keeps a killed worker's hash (its worker TTL, 420 s
by default, after the last heartbeat)."""

_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}|\{[A-Za-z0-9_.-]{1,64}\}")


@dataclass(frozen=True)
class Keys:
    """Key names for one namespace; the RQ queue of a namespace is named after it."""

    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        if not _NAMESPACE.fullmatch(self.namespace):
            raise ValueError(
                f"namespace {self.namespace!r} must be 1-64 characters of letters, digits, '_', '-' or '.', "
                "or such a name in braces (a Redis Cluster namespace)"
            )

    @property
    def clustered(self) -> bool:
        """Whether this is a Redis Cluster namespace, written in braces (``{name}``): then every key it touches,
        RQ's included, carries its hash tag (see the module)."""
        return self.namespace.startswith("{")

    @property
    def _tag(self) -> str:
        return self.namespace if self.clustered else "{" + self.namespace + "}"

    @property
    def job_prefix(self) -> str:
        """What every RQ job id of this namespace starts with: its tag for a cluster namespace, else nothing."""
        return self.namespace if self.clustered else ""

    def job_id(self, rollout_id: str, after_attempt: int = 0, *, reissue: bool = False) -> str:
        """:func:`job_id` of this namespace: prefixed with the tag for a cluster namespace, so that RQ's keys of
        the job (``rq:job:<id>``, ``rq:results:<id>``, ...) land in the namespace's slot."""
        return self.job_prefix + job_id(self.namespace, rollout_id, after_attempt, reissue=reissue)

    @property
    def queue_name(self) -> str:
        """The RQ queue that holds this namespace's tasks."""
        return self.namespace

    def task(self, rollout_id: str) -> str:
        """Hash with the task as enqueued, its policy, state, claim count and current attempt."""
        return f"{self._tag}:task:{rollout_id}"

    @property
    def inflight(self) -> str:
        """Sorted set of running attempts (``rollout_id|attempt``) scored by heartbeat deadline."""
        return f"{self._tag}:inflight"

    @property
    def results(self) -> str:
        """Stream of final rollouts, one entry per task outcome, bounded by MAXLEN ~."""
        return f"{self._tag}:{RESULTS_KEY}"

    @property
    def summaries(self) -> str:
        """Stream of compact per-rollout summaries (status, reward, version, group, timings, token counts, error
        type), one per results-stream entry, bounded like it: what the dashboard lists and charts read (see
        :mod:`rollq.store.summaries`)."""
        return f"{self._tag}:summaries"

    @property
    def results_trim(self) -> str:
        """Hash of what trimming did to the results stream: ``trimmed-to`` (the first entry id the last trim
        kept), and per consumer group the entries trimmed before it got them: ``count:<group>``,
        ``from:<group>`` (the first lost entry id)."""
        return f"{self._tag}:results-trim"

    def payload(self, rollout_id: str, attempt: int, token: str) -> str:
        """String: one big rollout's JSON, kept out of its results entry, which names this key instead (see
        :mod:`rollq.store.payloads`); ``token`` is the publication's own, so that no other one overwrites it."""
        return f"{self._tag}:{PAYLOAD_KEY}:{rollout_id}{MEMBER_SEPARATOR}{attempt}{MEMBER_SEPARATOR}{token}"

    @property
    def superseded(self) -> str:
        """Stream of results that arrived from an attempt that was no longer current."""
        return f"{self._tag}:superseded"

    @property
    def dead_letter(self) -> str:
        """Sorted set of rollout ids that failed for good, scored by the time they did."""
        return f"{self._tag}:dead"

    @property
    def stats(self) -> str:
        """Hash of counters: outcomes by mode, requeues by reason, duration and reward histograms (see
        :mod:`rollq.store.stats`)."""
        return f"{self._tag}:stats"

    @property
    def gateway_secret(self) -> str:
        """String: the key serve-al gateways sign attempt tokens with (shared, so any gateway checks any token)."""
        return f"{self._tag}:gateway-secret"

    @property
    def worker_seq(self) -> str:
        """Counter handing out worker ids that are distinct across processes and machines."""
        return f"{self._tag}:worker-seq"

    def resources(self, resources_id: str) -> str:
        """One immutable resources version (JSON of a ResourcesUpdate)."""
        return f"{self._tag}:resources:{resources_id}"

    @property
    def resources_latest(self) -> str:
        """The id of the latest resources version."""
        return f"{self._tag}:resources-latest"

    @property
    def resources_versions(self) -> str:
        """Sorted set of kept version ids, scored by version number."""
        return f"{self._tag}:resources-versions"

    @property
    def resources_seq(self) -> str:
        """Counter numbering resources versions."""
        return f"{self._tag}:resources-seq"

    @property
    def resources_refs(self) -> str:
        """Hash: version id -> number of unfinished tasks pinned to it (those are never pruned)."""
        return f"{self._tag}:resources-refs"

    @property
    def rq_queue(self) -> str:
        """RQ's list of queued job ids for this namespace."""
        return rq_queue_key(self.queue_name)

    @property
    def rq_intermediate(self) -> str:
        """RQ's list of job ids a worker has taken off the queue but not yet started."""
        return rq_intermediate_key(self.rq_queue)

    def stranded(self, job_id: str) -> str:
        """When a reaper first saw ``job_id`` left in the intermediate list while its task waited for it."""
        return f"{self._tag}:stranded:{job_id}"

    @property
    def quarantine(self) -> str:
        """List of job ids found on this namespace's RQ lists that are not well-formed rollq jobs, moved aside."""
        return f"{self._tag}:quarantine"

    @property
    def clock(self) -> str:
        """Hash: the Redis time by which the next heartbeat or reap pass is due, and until when reaping waits
        after a stall (see ``lua/beat.lua``)."""
        return f"{self._tag}:clock"

    @property
    def audit_cursor(self) -> str:
        """Where the reapers' sweep over task records (looking for queued tasks whose RQ job vanished) stands."""
        return f"{self._tag}:audit-cursor"

    @property
    def audit_lock(self) -> str:
        """Held for a second by the reaper that sweeps task records, so the namespace is swept once a second."""
        return f"{self._tag}:audit-lock"

    def batch_start(self, group: str) -> str:
        """The results entry id the training-batch consumer group ``group`` was created at: entries up to it were
        never its to read."""
        return f"{self._tag}:batch-start:{group}"

    def batch_reader(self, group: str, consumer: str) -> str:
        """Held (with a lease its reader renews) by the live training-batch reader reading as ``consumer`` of the
        results stream's consumer group ``group``, so a second reader under that name is refused."""
        return f"{self._tag}:batch-reader:{group}:{consumer}"

    @property
    def replication_mark(self) -> str:
        """Pub/sub channel nobody subscribes to: a PUBLISH on it before ``WAIT`` gives any pooled connection a write
        of its own to wait for (see :mod:`rollq.store.replication`)."""
        return f"{self._tag}:replication-mark"

    @property
    def queued_tasks(self) -> str:
        """Set of the record keys of queued tasks, kept by the transitions (enqueue, requeue, revive add; claim,
        cancel, reject remove): the lost-job sweep walks it instead of the whole keyspace (see store/reaper.py)."""
        return f"{self._tag}:queued-tasks"

    @property
    def replication_degraded(self) -> str:
        """Sorted set: processes whose transitions do not wait for replicas because none acknowledged in time,
        scored by when each last said so (see :mod:`rollq.store.replication`)."""
        return f"{self._tag}:replication-degraded"

    @property
    def reap_turn(self) -> str:
        """Held for most of a heartbeat interval by the worker whose turn it is to run the namespace's periodic
        reaper pass, so N workers make one pass per interval, not N."""
        return f"{self._tag}:reap-turn"

    @property
    def llm_pause(self) -> str:
        """Present while the namespace's LLM calls are paused for a weight sync: the pause's epoch (a number), with
        the pause's lease as its expiry when it has one (see ``store/llm_gate.py``)."""
        return f"{self._tag}:llm-pause"

    @property
    def llm_gate(self) -> str:
        """Hash of the LLM gate's history: ``epoch`` (pauses so far), ``paused_at``, ``resumed_at`` (Redis time)."""
        return f"{self._tag}:llm-gate"

    @property
    def llm_workers(self) -> str:
        """Sorted set of the workers whose capturing proxy reports to the LLM gate, scored by the Redis time their
        report expires (a worker that stops reporting drops out)."""
        return f"{self._tag}:llm-workers"

    @property
    def llm_calls(self) -> str:
        """Hash: worker name -> ``ack|in_flight|waiting``: the pause epoch its proxy has closed its gate for (0 for
        none), LLM calls it has running upstream, and calls waiting at its gate."""
        return f"{self._tag}:llm-calls"

    @property
    def llm_gate_channel(self) -> str:
        """Pub/sub channel on which a resume is announced (with the latest resources id) to paused workers."""
        return f"{self._tag}:llm-gate-events"

    @property
    def task_pattern(self) -> str:
        """``SCAN MATCH`` pattern of every task record of the namespace."""
        return f"{self._tag}:task:*"

    def reaped_worker(self, worker: str) -> str:
        """When a reaper last took an attempt from ``worker`` for want of heartbeats (Redis's time; expires after
        :data:`REAPED_WORKER_SECONDS`): ``rollq status`` and the dashboard list that worker dead from then on,
        unless it has heartbeated since."""
        return f"{self._tag}:reaped-worker:{worker}"

    def orphaned(self, job_id: str) -> str:
        """When a reaper first saw that the queued task's ``job_id`` was on none of RQ's lists."""
        return f"{self._tag}:orphaned:{job_id}"

    def rq_queues(self) -> str:
        """RQ's set of known queues (rq-dashboard lists queues from it); a cluster namespace has a set of its own,
        ``rq:{name}:queues``, in its slot."""
        return rq_queues_key(self.namespace) if self.clustered else RQ_QUEUES_KEY

    @property
    def rq_workers(self) -> str:
        """RQ's set of all workers' keys (``rq:workers``); a cluster namespace's own, ``rq:{name}:workers``."""
        return rq_workers_key(self.namespace) if self.clustered else RQ_WORKERS_KEY

    @property
    def rq_suspended(self) -> str:
        """RQ's suspension flag (``rq:suspended``); a cluster namespace's own, ``rq:{name}:suspended``."""
        return rq_suspended_key(self.namespace) if self.clustered else RQ_SUSPENDED_KEY

    @staticmethod
    def rq_job(job_id: str) -> str:
        """RQ's hash for one job."""
        return rq_job_key(job_id)

    @staticmethod
    def rq_results(job_id: str) -> str:
        """RQ's stream of one job's results."""
        return rq_results_key(job_id)


class TaskField(StrEnum):
    """The fields of a task record (the hash at :meth:`Keys.task`)."""

    TASK = "task"  # the Task as enqueued, JSON
    POLICY = "policy"  # its RolloutPolicy, JSON
    UNRESPONSIVE = "unresponsive"  # the policy's unresponsive_seconds, for the claim script's arithmetic
    JOB = "job"  # the id of the RQ job that currently stands for the task
    RESOURCES_ID = "resources_id"  # the pinned resources version, '' when unpinned
    MODE = "mode"
    STATE = "state"  # a TaskState
    CLAIMS = "claims"  # claims so far; the current attempt's number
    ATTEMPT = "attempt"  # the current (or last) attempt
    ATTEMPTS = "attempts"  # attempts used up against max_attempts
    LAST_CLAIM = "last_claim"
    WORKER = "worker"  # the worker of the current (or last) attempt
    RESULT = "result"  # the results-stream entry id of the outcome
    ENDED = "ended"
    GENERATION = "generation"  # 1 for the first run; each dead-letter requeue adds one (absent: 1)


class StreamField(StrEnum):
    """The fields of an entry on the results, superseded and summaries streams."""

    ROLLOUT_ID = "rollout_id"
    ROLLOUT = "rollout"  # the Rollout, JSON
    REF = "ref"  # instead of ROLLOUT, a big rollout's payload key (Keys.payload); summaries stream: the same key
    ATTEMPT = "attempt"  # superseded stream only
    REASON = "reason"  # superseded stream only: TASK_MISSING when the task record was gone, absent otherwise
    SUMMARY = "summary"  # summaries stream: the summary, JSON (rollq.store.summaries)
    MODE = "mode"  # summaries stream: the task's mode, from its record
    RESULT = "result"  # summaries stream: the results-stream entry the summary describes
    SIZE = "size"  # summaries stream: that entry's payload bytes (rollout id + rollout JSON), for trimming


TASK_MISSING = "task-missing"
"""The ``reason`` of a superseded-stream entry kept because its task record was gone (Redis lost it: a restart
without persistence, a flush, an eviction), not because a newer attempt took over (``lua/finish.lua``)."""

TRIMMED_TO = "trimmed-to"
"""The field of :attr:`Keys.results_trim` holding the first entry id the last trim kept."""

SUMMARIES_FROM = "summaries-from"
"""The field of :attr:`Keys.results_trim` holding where the next trim starts reading the summaries stream."""

GROUP_IDLE_SECONDS = 3600
"""The policy for abandoned readers: a consumer group none of whose consumers has talked to Redis for this long
(or has had no consumer for this long) no longer holds back trimming of the results stream; what it then loses is
counted for it (``count:<group>``) and raised to it if it comes back. A namespace may set its own bound (``rollq groups
idle-after``) in :attr:`Keys.results_trim`'s :data:`IDLE_MS_FIELD`."""
IDLE_MS_FIELD = "idle-ms"
"""The field of :attr:`Keys.results_trim` overriding :data:`GROUP_IDLE_SECONDS` (milliseconds)."""

MEMBER_SEPARATOR = "|"
"""Between the parts of an in-flight member and of an attempt-history value."""

FOREIGN_KEY = "the {what} {key} is a {kind}, not a {want}: something other than rollq wrote it"
"""What a key of the namespace that holds another Redis type than rollq writes there is called, in Python
(:func:`foreign_key`) and in every Lua script (``foreign_key`` of the header :func:`rollq.store.scripts.lua_header`
generates from this one spelling)."""


def foreign_key(what: str, key: str, kind: str, want: str) -> str:
    """:data:`FOREIGN_KEY` for ``key`` (``what`` it should be) holding Redis type ``kind`` instead of ``want``."""
    return FOREIGN_KEY.format(what=what, key=key, kind=kind, want=want)


def inflight_member(rollout_id: str, attempt: int) -> str:
    """The member of :attr:`Keys.inflight` for one running attempt: ``rollout_id|attempt``."""
    return f"{rollout_id}{MEMBER_SEPARATOR}{attempt}"


def parse_inflight_member(member: str | bytes) -> tuple[str, int]:
    """``(rollout_id, attempt)`` of an in-flight member; a rollout id may itself contain the separator."""
    text = member.decode() if isinstance(member, bytes) else member
    rollout_id, _, attempt = text.rpartition(MEMBER_SEPARATOR)
    return rollout_id, int(attempt)


HISTORY_LIMIT = 32
"""Attempts whose history a task record keeps (the newest)."""
HISTORY_MATCH = "[ae]:*"
"""HSCAN ``MATCH`` pattern of a task record's attempt-history fields."""


def claim_field(attempt: int) -> str:
    """The task record field holding ``worker|claim time`` of ``attempt``."""
    return f"a:{attempt}"


def end_field(attempt: int) -> str:
    """The task record field holding ``outcome|end time`` of ``attempt``."""
    return f"e:{attempt}"


def parse_history(name: bytes, value: bytes) -> tuple[str, int, str, float]:
    """``(kind, attempt, head, time)`` of one history field: kind ``a`` (head = worker) or ``e`` (head = outcome)."""
    kind, _, attempt = name.decode().partition(":")
    head, _, when = value.decode().rpartition(MEMBER_SEPARATOR)
    return kind, int(attempt), head, float(when)


def rollout_id_of_task_key(keys: Keys, key: str | bytes) -> str:
    """The rollout id in a task hash's key (the inverse of :meth:`Keys.task`)."""
    text = key.decode() if isinstance(key, bytes) else key
    return text[len(keys.task("")) :]


_JOB_PREFIX = "rollq-"
_PACK_PREFIX = f"{_JOB_PREFIX}pack-"


def pack_job_id() -> str:
    """``rollq-pack-<32 random hex>``: the RQ job id of a pack of tasks (``tasks_per_job`` > 1), random so that a
    pack never meets another job's id; a namespace prefixes it with :attr:`Keys.job_prefix`, as :meth:`Keys.job_id`.
    A task that goes back to the queue gets :func:`job_id`'s own."""
    return f"{_PACK_PREFIX}{uuid.uuid4().hex}"


def is_pack_job(keys: Keys, job_id: str) -> bool:
    """Whether ``job_id`` is one of the packs (:func:`pack_job_id`) of ``keys``' namespace, by its id alone."""
    return job_id.startswith(keys.job_prefix + _PACK_PREFIX)


def job_id(namespace: str, rollout_id: str, after_attempt: int = 0, *, reissue: bool = False) -> str:
    """The RQ job id that queues ``rollout_id`` of ``namespace``; each requeue gets a job of its own.

    ``rollq-<sha256 of the namespace, a newline and the rollout id, 40 hex>-<n>``, where ``n`` is the attempt the
    job follows (0 for the first job), prefixed ``q`` for a job the reaper issued again after the previous one
    vanished. RQ's job hashes (``rq:job:<id>``) are per Redis database, not per namespace, so the namespace is in
    the digest: the same rollout id queued in two namespaces of one database gets two jobs (with the rollout id's
    alone, the second enqueue rewrote the first's job hash, its ``origin`` queue included, and one job sat on both
    queues). A namespace cannot hold a newline (:class:`Keys` refuses it), so no two (namespace, rollout id) pairs
    hash the same text. No rollout id appears in a job id, so no rollout id can produce another task's job id
    (short of a SHA-256 collision); the rollout id is in the job's description for rq-dashboard.

    Upgrading from a rollq whose job ids hashed the rollout id alone needs no migration: a task queued before keeps
    the job id its record holds (``TaskField.JOB``, which the claim compares), so a new worker still claims it, and
    every id computed here is for a new job (enqueue, requeue, revive, a pack's split, a reissue). Only
    :func:`rollq.store.sizing.retained_sizes` looks a finished job up by this id, to sample its memory; a rollout
    published before the upgrade samples no job there.
    """
    if "\n" in namespace:
        raise ValueError(f"namespace {namespace!r} cannot hold a newline: it ends the namespace in a job id's digest")
    digest = hashlib.sha256(f"{namespace}\n{rollout_id}".encode()).hexdigest()[:40]
    return f"{_JOB_PREFIX}{digest}-{'q' if reissue else ''}{after_attempt}"
