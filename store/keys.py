"""The one place that knows where rollq keeps things in Redis.

Every rollq key of a namespace starts with the hash tag ``{namespace}``, so all
keys one Lua script or transaction touches land in one slot; the layout stays
valid on Redis Cluster even though RQ itself does not run there. RQ's own keys
(queue list, job hashes, registries) keep RQ's names; this module asks RQ for
them instead of spelling them again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.queue import Queue

DEFAULT_NAMESPACE = "rollq"

_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_RQ_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")


@dataclass(frozen=True)
class Keys:
    """Key names for one namespace; the RQ queue of a namespace is named after it."""

    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        if not _NAMESPACE.fullmatch(self.namespace):
            raise ValueError(
                f"namespace {self.namespace!r} must be 1-64 characters of letters, digits, '_', '-' or '.'"
            )

    @property
    def _tag(self) -> str:
        return "{" + self.namespace + "}"

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
        return f"{self._tag}:results"

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
        """Hash of counters: outcomes by mode, requeues by reason, duration buckets."""
        return f"{self._tag}:stats"

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
        return Queue.redis_queue_namespace_prefix + self.queue_name

    @property
    def rq_intermediate(self) -> str:
        """RQ's list of job ids a worker has taken off the queue but not yet started."""
        return IntermediateQueue.get_intermediate_queue_key(self.rq_queue)

    def stranded(self, job_id: str) -> str:
        """When a reaper first saw ``job_id`` left in the intermediate list while its task waited for it."""
        return f"{self._tag}:stranded:{job_id}"

    @staticmethod
    def rq_queues() -> str:
        """RQ's set of known queues (rq-dashboard lists queues from it)."""
        return Queue.redis_queues_keys

    @staticmethod
    def rq_job(job_id: str) -> str:
        """RQ's hash for one job."""
        return Job.redis_job_namespace_prefix + job_id


def job_id(rollout_id: str, after_attempt: int = 0) -> str:
    """The RQ job id that queues ``rollout_id``; each requeue gets a job of its own.

    RQ accepts only ``[A-Za-z0-9_-]`` in job ids, so other rollout ids are hashed.
    """
    base = (
        rollout_id if _RQ_JOB_ID.fullmatch(rollout_id) else "h" + hashlib.sha256(rollout_id.encode()).hexdigest()[:40]
    )
    return base if after_attempt == 0 else f"{base}-r{after_attempt}"
