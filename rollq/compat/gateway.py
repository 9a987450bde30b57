"""rollq's queue and attempts behind Agent Lightning 0.1's worker-facing API, without HTTP.

An AL 0.1 client polls for a task, fetches resources and posts a rollout; it knows
nothing of attempts. The gateway makes each poll a real rollq claim (same Lua
transition a worker uses) and keeps attempts exact:

- the task handed out carries the id ``<rollout_id>#<attempt>#<token>``, so a posted rollout
  names the attempt it belongs to, whichever client posts it and however late. The token is an
  HMAC of the attempt under a secret every gateway of the namespace shares (:mod:`rollq.compat.tokens`): a post
  without the token of the attempt it names (forged, for another attempt, or for an attempt a
  worker runs, which no gateway handed out) is refused with :class:`AttemptTokenError`, counted
  in the stats hash (``gateway:refused``) and never stored;
- the gateway remembers every attempt it handed out and heartbeats it for
  ``lease_seconds`` (at most the task's ``timeout_seconds``). When a lease ends unposted the
  gateway hands the attempt back (``released``: queued again at the front, the attempt not
  charged) up to ``max_releases`` times per task, so a client that polls and never posts
  cannot use up tasks' attempts; past that the reaper requeues the task after
  ``unresponsive_seconds`` (or fails it when no attempts remain), like a dead worker's;
- one client (one address) holds at most ``max_held_per_client`` unposted attempts: past that
  its polls get no task, so it cannot drain the queue;
- a post for an attempt that is no longer current is recorded in the superseded stream
  and never delivered; a post for a cancelled task is dropped; a second post of an attempt to the
  same gateway is refused (and counted) like a forged one.

What a claim refusal, a published rollout and the finish transition's reply mean is spelled once, in
:mod:`rollq.worker.attempt`, shared with the workers: a posted rollout carries the same outcome keys
(generation included) and passes the same size checks as one a worker publishes.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import redis

from rollq.models.coerce import coerce
from rollq.models.contract import ResourcesUpdate, Rollout, Task
from rollq.models.errors import AttemptTokenError, InvalidRewardError, InvalidTaskError, UnknownResourcesError
from rollq.models.policy import RolloutPolicy
from rollq.store.jobs import read_rollq_jobs, rollout_ids_of
from rollq.store.keys import Keys, inflight_member
from rollq.store.records import parse_task
from rollq.store.replies import ClaimRefused, Requeued
from rollq.store.resources import ResourceStore
from rollq.store.stats import StatsField
from rollq.store.transitions import Lifecycle
from rollq.worker.attempt import Attempt, Attempts, PublishLimits, Settled
from rollq.worker.config import WorkerSettings
from rollq.worker.heartbeat import Heartbeat
from rollq.worker.rewards import check_rewards

from .tokens import AttemptTokens

log = logging.getLogger(__name__)

ATTEMPT_SEPARATOR = "#"
"""Between the rollout id and the attempt number in the id an AL client sees."""

# Jobs skipped per poll (stale, cancelled, not rollq's) before answering "no task" for now.
_SKIP_LIMIT = 32
# Attempts whose lease ended are forgotten this long after, bounding the gateway's memory.
_FORGET_AFTER_SECONDS = 3600.0
# Tasks whose hand-backs are remembered (for max_releases), oldest forgotten first.
_RELEASES_REMEMBERED = 100_000


def client_rollout_id(rollout_id: str, attempt: int, token: str) -> str:
    return f"{rollout_id}{ATTEMPT_SEPARATOR}{attempt}{ATTEMPT_SEPARATOR}{token}"


def split_client_rollout_id(value: str) -> tuple[str, int, str]:
    """``(rollout_id, attempt, token)`` from the id a client posts; AttemptTokenError if it is not of the shape
    handed out."""
    rest, sep, token = value.rpartition(ATTEMPT_SEPARATOR)
    rollout_id, sep2, attempt = rest.rpartition(ATTEMPT_SEPARATOR)
    if not sep or not sep2 or not rollout_id or not attempt.isdigit() or not token:
        raise AttemptTokenError(
            f"rollout id {value[:200]!r} was not handed out by this server (expected <rollout_id>#<attempt>#<token>)"
        )
    return rollout_id, int(attempt), token


PostOutcome = Settled
"""What became of a posted rollout: delivered, superseded (recorded, not delivered) or cancelled (dropped)."""


@dataclass
class _Held:
    attempt: Attempt
    task: Task
    policy: RolloutPolicy
    resources_id: str | None  # the version the client was told to run with
    handed_at: float
    lease_until: float
    client: str = ""
    released: bool = False


class Gateway:
    """One namespace's tasks served to Agent Lightning 0.1 clients (thread-safe; blocking Redis calls)."""

    def __init__(
        self,
        connection: redis.Redis,
        namespace: str,
        *,
        lease_seconds: float = 300.0,
        heartbeat_seconds: float = 5.0,
        results_maxlen: int | None = None,
        settings: WorkerSettings | None = None,
        name: str | None = None,
        max_releases: int = 3,
        max_held_per_client: int = 256,
    ) -> None:
        """``settings``: the bounds on what is published (``results_maxlen``, ``max_result_bytes``,
        ``keep_seconds``), the workers' ``ROLLQ_*`` settings by default; ``results_maxlen`` overrides one.
        ``max_releases``: hand-backs of a task whose lease ended unposted before its attempts are charged;
        ``max_held_per_client``: unposted attempts one client may hold."""
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be > 0")
        if max_releases < 0 or max_held_per_client < 1:
            raise ValueError("max_releases must be >= 0 and max_held_per_client >= 1")
        self.max_releases = max_releases
        self.max_held_per_client = max_held_per_client
        self._releases: OrderedDict[str, int] = OrderedDict()
        self._posted: OrderedDict[str, None] = OrderedDict()  # attempts posted here (refused if posted again)
        self.connection = connection
        self.keys = Keys(namespace)
        self.tokens = AttemptTokens(connection, self.keys)
        self.lifecycle = Lifecycle(connection, self.keys)
        self.resources = ResourceStore(connection, self.keys)
        self.lease_seconds = lease_seconds
        limits = PublishLimits.of(settings or WorkerSettings.from_env())
        if results_maxlen is not None:
            limits = PublishLimits(results_maxlen, limits.max_result_bytes, limits.keep_seconds)
        self.attempts = Attempts(self.lifecycle, limits)
        self.results_maxlen = limits.results_maxlen
        self.name = name or f"serve-al-{socket.gethostname()}-{id(self):x}"
        self._held: dict[str, _Held] = {}
        self._warned_packs = False
        self._lock = threading.Lock()
        self._heartbeat = Heartbeat(
            self.lifecycle, self._members, interval=heartbeat_seconds, results_maxlen=limits.results_maxlen
        )

    def start(self) -> None:
        """Start heartbeating held attempts and reaping stale ones (in a background thread)."""
        self._heartbeat.start()

    def stop(self) -> None:
        self._heartbeat.stop()

    def held(self) -> list[tuple[str, int]]:
        """The attempts handed out and not yet posted, as ``(rollout_id, attempt)``."""
        with self._lock:
            return [(h.attempt.rollout_id, h.attempt.number) for h in self._held.values()]

    def _members(self) -> dict[str, float]:
        """The attempts still within their lease (``member`` -> unresponsive_seconds), for the heartbeat;
        first hands back those whose lease ended (see :meth:`release_expired`)."""
        self.release_expired()
        now = time.time()
        with self._lock:
            for member in [m for m, h in self._held.items() if now > h.lease_until + _FORGET_AFTER_SECONDS]:
                del self._held[member]
            return {member: h.policy.unresponsive_seconds for member, h in self._held.items() if now < h.lease_until}

    def release_expired(self) -> int:
        """Hand back attempts whose lease ended unposted: queued again at the front with the attempt given
        back, at most ``max_releases`` times per task (then the lease just lapses and the reaper charges
        the attempt). Returns how many were handed back."""
        now = time.time()
        with self._lock:
            expired = [h for h in self._held.values() if now >= h.lease_until and not h.released]
            for held in expired:
                held.released = True  # one try per lease: a refused release is the reaper's
        released = 0
        for held in expired:
            rollout_id = held.attempt.rollout_id
            with self._lock:
                count = self._releases.get(rollout_id, 0)
                if count >= self.max_releases:
                    continue
                self._releases[rollout_id] = count + 1
                self._releases.move_to_end(rollout_id)
                while len(self._releases) > _RELEASES_REMEMBERED:
                    self._releases.popitem(last=False)
            try:
                reply = self.lifecycle.requeue(held.task, held.attempt.number, held.policy, "released")
            except redis.RedisError as exc:
                log.warning("could not hand back %s attempt %d (%s)", rollout_id, held.attempt.number, exc)
                continue
            if isinstance(reply, Requeued):
                released += 1
                self.connection.hincrby(self.keys.stats, StatsField.GATEWAY_RELEASED, 1)
                log.warning(
                    "lease of %s attempt %d ended unposted (client %s); handed back (%d of %d)",
                    rollout_id,
                    held.attempt.number,
                    held.client,
                    count + 1,
                    self.max_releases,
                )
        return released

    # -- attempt tokens (rollq.compat.tokens, shared with serve-agl) ------------------------

    def token(self, rollout_id: str, attempt: int) -> str:
        """The token of one attempt, as handed out with it and required with its post."""
        return self.tokens.token(rollout_id, attempt)

    def check_token(self, rollout_id: str, attempt: int, token: str) -> None:
        """AttemptTokenError (counted) unless ``token`` is the one handed out with this attempt."""
        self.tokens.check(rollout_id, attempt, token)

    def refused(self) -> None:
        """Count a refused post (``gateway:refused`` in the stats hash)."""
        self.tokens.refused()

    # -- GET /task -----------------------------------------------------------------------

    def next_task(self, client: str = "") -> Task | None:
        """Claim the next queued task for ``client``, or None when there is none right now (or the client
        already holds ``max_held_per_client`` unposted attempts)."""
        k = self.keys
        if client:
            now = time.time()
            with self._lock:
                holding = sum(1 for h in self._held.values() if h.client == client and now < h.lease_until)
            if holding >= self.max_held_per_client:
                log.warning("client %s holds %d unposted attempts; no task for it until it posts", client, holding)
                return None
        for _ in range(_SKIP_LIMIT):
            # Into RQ's intermediate list, as RQ's own dequeue does: if this process dies before the
            # claim, the reaper puts the job back on the queue.
            raw = self.connection.lmove(k.rq_queue, k.rq_intermediate, "LEFT", "RIGHT")
            if raw is None:
                return None
            job_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            task = self._claim(job_id, client)
            if task is not None:
                return task
        return None

    def _claim(self, job_id: str, client: str) -> Task | None:
        k = self.keys
        job = read_rollq_jobs(self.connection, [job_id])[job_id]
        if job is None or isinstance(job, InvalidTaskError):
            # Not a rollq job (or its hash is gone): set aside as a worker would, never run.
            log.error("set job %s of queue %s aside: %s", job_id, k.queue_name, job or "it has no hash")
            self.lifecycle.quarantine(k.rq_intermediate, job_id)
            return None
        ids = rollout_ids_of(job)
        if len(ids) != 1:
            self._split(job_id, ids)
            return None
        (rollout_id,) = ids
        claim = self.lifecycle.claim(rollout_id, job_id, self.name)
        if isinstance(claim, ClaimRefused):
            self.attempts.refused(rollout_id, job_id, claim, self.name)
        # The job never runs in RQ: the claim is what counts from here on.
        pipe = self.connection.pipeline(transaction=False)
        pipe.lrem(k.rq_intermediate, 1, job_id)
        pipe.delete(k.rq_job(job_id))
        pipe.execute()
        if isinstance(claim, ClaimRefused):
            return None
        now = time.time()
        attempt = Attempt.claimed(rollout_id, claim, self.name)
        try:
            task, policy = parse_task(
                rollout_id, claim.task_json, claim.policy_json, claims=claim.attempt, last_claim=claim.claimed_at
            )
        except InvalidTaskError as error:
            log.error("%s", error)
            self.attempts.publish(self.attempts.publication(attempt, attempt.failed(error), failed=True, duration=None))
            return None
        lease = min(self.lease_seconds, policy.timeout_seconds)
        # The version the claim saw as latest, so the client runs with what a worker would have.
        resources_id = task.resources_id or claim.latest_resources_id
        with self._lock:
            self._held[attempt.member] = _Held(attempt, task, policy, resources_id, now, now + lease, client)
        return task.model_copy(
            update={
                "rollout_id": client_rollout_id(rollout_id, claim.attempt, self.token(rollout_id, claim.attempt)),
                "resources_id": resources_id,
                "num_claims": claim.attempt,
                "last_claim_time": claim.claimed_at,
            }
        )

    def _split(self, job_id: str, rollout_ids: list[str]) -> None:
        """A pack (``tasks_per_job`` > 1) is for RolloutWorkers: its tasks go back to the front of the queue as jobs of
        one task each, in one transition (``lua/split.lua``), and the next polls take them. Set aside as before (the
        quarantine list; the reapers' lost-job sweep queues its tasks again) only if its records cannot be read or
        a new job id is taken."""
        k = self.keys
        split = self.lifecycle.split_pack(job_id, rollout_ids)
        if isinstance(split, str):
            log.warning("set pack job %s of queue %s aside: could not split it (%s)", job_id, k.queue_name, split)
            self.lifecycle.quarantine(k.rq_intermediate, job_id)
            return
        if not self._warned_packs:
            self._warned_packs = True
            log.warning(
                "queue %s holds packs (tasks_per_job > 1); this gateway splits each into jobs of one task when it "
                "takes it, which costs more than queueing them one per job: queue with tasks_per_job=1 for serve-al",
                k.queue_name,
            )
        if split == -2:
            log.info("pack job %s of queue %s was put back by a reaper meanwhile; not split here", job_id, k.queue_name)
        else:
            log.info(
                "split pack job %s of queue %s: %d task(s) queued again at the front, one job each",
                job_id,
                k.queue_name,
                split,
            )

    # -- GET /resources ------------------------------------------------------------------

    def get_resources(self, resources_id: str | None) -> ResourcesUpdate | None:
        try:
            return self.resources.get(resources_id)
        except UnknownResourcesError:
            return None

    # -- POST /rollout -------------------------------------------------------------------

    def post_rollout(self, payload: Any, client: str) -> tuple[PostOutcome, str]:
        """Publish a posted rollout for the attempt its id names; ContractShapeError for a bad payload,
        AttemptTokenError (counted) for an id without its attempt's token."""
        posted = coerce(Rollout, payload, "the posted rollout")
        try:
            rollout_id, attempt, token = split_client_rollout_id(posted.rollout_id)
        except AttemptTokenError:
            self.refused()
            raise
        self.check_token(rollout_id, attempt, token)
        member = inflight_member(rollout_id, attempt)
        with self._lock:
            if member in self._posted:
                # A second post of one attempt: junk (each could store up to max_result_bytes as superseded).
                self.refused()
                raise AttemptTokenError(f"attempt {attempt} of {rollout_id} was posted already; this post is refused")
            self._posted[member] = None
            while len(self._posted) > _RELEASES_REMEMBERED:
                self._posted.popitem(last=False)
            held = self._held.pop(member, None)
        # An attempt this gateway did not hand out (another gateway did, or this one restarted) is of the task's
        # current generation if it is still current; if it is not, the finish call supersedes it anyway.
        who = (
            held.attempt
            if held is not None
            else Attempt(rollout_id, attempt, self.attempts.generation_of(rollout_id), client)
        ).run_by(client)
        # A reward JSON cannot carry fails the rollout as a worker fails an agent's (it would be published as null).
        bad_reward = _non_finite_reward(posted)
        kept: dict[str, Any] = {"rollout_id": rollout_id}
        if bad_reward is not None:
            kept.update(
                final_reward=None, triplets=[t.model_copy(update={"reward": None}) for t in posted.triplets or []]
            )
        publication = self.attempts.publication(
            who,
            who.stamp(posted.model_copy(update=kept), bad_reward),
            failed=bad_reward is not None,
            duration=time.time() - held.handed_at if held else None,
            task=held.task if held else None,
            resources_id=held.resources_id if held else None,
        )
        settled = self.attempts.settled(publication, self.attempts.publish(publication))
        if settled == Settled.CANCELLED:
            return settled, f"rollout {rollout_id} was cancelled; this result is dropped"
        if settled == Settled.SUPERSEDED:
            return settled, f"attempt {attempt} of {rollout_id} is no longer current; not delivered"
        if settled == Settled.TASK_MISSING:
            return settled, (
                f"the task record of {rollout_id} is gone (Redis lost it); this result is kept on the superseded "
                "stream, not delivered"
            )
        if bad_reward is not None:
            return settled, f"rollout {rollout_id} (attempt {attempt}) stored as failed: {bad_reward}"
        return settled, f"rollout {rollout_id} (attempt {attempt}) received and stored"


def _non_finite_reward(rollout: Rollout) -> InvalidRewardError | None:
    """The error for a posted rollout whose final reward or a triplet's reward is NaN or infinite (the check a
    worker makes of its agent's), else None."""
    try:
        check_rewards(rollout.final_reward, rollout.triplets)
    except InvalidRewardError as exc:
        return exc
    return None
