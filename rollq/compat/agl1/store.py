"""The AL 1.0 API's operations on rollq's store (blocking Redis calls; the HTTP layer runs them on threads).

Rollouts are rollq tasks queued through a :class:`~rollq.producer.Producer`, so they are durable,
retried with attempts, bounded in time, and run by rollq workers on any number of hosts; any number
of servers may serve one namespace (nothing here lives in a server process). What AL keeps that rollq
does not (events posted to the server, models, the terminal log, the pause switch) is in the keys of
:mod:`.keys`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any, cast

import redis

from rollq.models.contract import LLM, Triplet
from rollq.models.contract import Rollout as RollqRollout
from rollq.models.errors import InvalidTaskError, RolloutTrimmedError, UnknownTaskError
from rollq.models.outcomes import stamp
from rollq.models.policy import RolloutStatus, TaskState
from rollq.models.wire import rollout_json
from rollq.producer.producer import Producer
from rollq.producer.results import fetch_rollouts
from rollq.store.jobs import read_rollq_jobs, rollout_ids_of
from rollq.store.keys import StreamField, TaskField, is_pack_job
from rollq.store.queries import read_attempts
from rollq.store.records import TaskRecord, read_record, read_records
from rollq.store.replies import ClaimRefused, Published
from rollq.store.summaries import summary_json
from rollq.store.transitions import Finish

from . import events as event_views
from .keys import Agl1Keys
from .mapping import EVENTS_METADATA_KEY, ROLLQ_STATES, data_id_of, envelope, mode_of, policy_for, view
from .runners import RUNNER_NAME, LeaseSettings, RunnerAttempts, bare, split
from .schemas import (
    DEFAULT_ATTEMPT_ID,
    TERMINAL_STATES,
    VALID_TRANSITIONS,
    Event,
    EventCreate,
    Model,
    PauseRequest,
    PauseStateResponse,
    Rollout,
    RolloutCreate,
    RolloutPatch,
    RolloutState,
    TerminalRolloutItem,
    TerminalRolloutsPage,
)
from .upstream import ProxySettings

log = logging.getLogger(__name__)

RESOURCE_PREFIX = "agl1-"
"""Resources ``agl1-0``, ``agl1-1``...: the served model's endpoints, sorted, as rollq ``LLM`` resources."""
PROXY_SETTINGS_KEY = "agl1_proxy"
"""``LLM.sampling_parameters`` key carrying the server's :class:`ProxySettings` to worker adapters."""
_PATCHABLE = ("error_message", "k8s_job_name", "last_attempt_id")
INFLIGHT_LEASE_SECONDS = 330.0
"""A proxied call not ended after this long (its process died) stops counting as in flight."""
_TERMINAL_BATCH = 1000


class RunnerFailure(Exception):
    """The failure an external runner reported for a rollout (its ``error_message``)."""


def triplets_of(events: list[Event]) -> list[Triplet]:
    """Training triplets from an attempt's triplet-format events, as AL's rollout manager builds them."""
    triplets = []
    for event in events:
        data = event.data
        if event.event_type != "model_request" or data.get("status") == "error":
            continue
        status = data.get("http_status")
        if (isinstance(status, int) and status >= 400) or not data.get("response_token_ids"):
            continue
        triplets.append(
            Triplet(
                prompt={"token_ids": data.get("prompt_token_ids", [])},
                response={"token_ids": data["response_token_ids"], "log_probs": data.get("response_log_probs")},
                metadata={"server": data.get("server", {})},
            )
        )
    reward = reward_of(events)
    if triplets and reward is not None:
        triplets[-1].reward = reward
    return triplets


def reward_of(events: list[Event]) -> float | None:
    """The last ``reward`` event's value (AL's final reward), when it is a number."""
    rewards = [e for e in events if e.event_type == "reward"]
    value = rewards[-1].data.get("value") if rewards else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class InvalidTransition(Exception):
    """A PATCH asks for a state move AL 1.0 forbids, or one that only rollq's workers make (409)."""


class Agl1Store:
    """One namespace seen through AL 1.0's server API."""

    def __init__(
        self, producer: Producer, proxy: ProxySettings | None = None, leases: LeaseSettings | None = None
    ) -> None:
        self.producer = producer
        self.connection: redis.Redis = producer.connection
        self.keys = producer.keys
        self.agl = Agl1Keys(producer.keys)
        self.proxy = proxy or ProxySettings()
        self.runners = RunnerAttempts(self.connection, self.agl, producer.lifecycle, leases)

    # -- rollouts ----------------------------------------------------------------------------------

    def create(self, requests: list[RolloutCreate]) -> list[Rollout]:
        """Queue ``requests`` (a known ``rollout_id`` is returned as it stands) and return them, in order."""
        ids = [r.rollout_id or uuid.uuid4().hex for r in requests]
        groups: dict[tuple[str, str], list[int]] = {}
        for index, request in enumerate(requests):
            policy = policy_for(request, self.producer.policy)
            groups.setdefault((mode_of(request.is_train), policy.model_dump_json()), []).append(index)
        for (mode, _), indexes in groups.items():
            policy = policy_for(requests[indexes[0]], self.producer.policy)
            self.producer.enqueue_many(
                [envelope(requests[i]) for i in indexes],
                mode=mode,
                rollout_ids=[ids[i] for i in indexes],
                policy=policy,
            )
        records = read_records(self.connection, self.keys, list(dict.fromkeys(ids)))
        return [view(records[rid]) for rid in ids]

    def _record(self, rollout_id: str) -> TaskRecord:
        return read_record(self.connection, self.keys, rollout_id)

    def _record_or_none(self, rollout_id: str) -> TaskRecord | None:
        try:
            return self._record(rollout_id)
        except UnknownTaskError:
            return None

    def _named(self, rollout_id: str) -> str:
        """The rollout an id read by a client names: itself if it is a rollout's, else without its token."""
        return bare(rollout_id) if self._record_or_none(rollout_id) is None else rollout_id

    def runner_attempt(self, listed_id: str, what: str) -> TaskRecord:
        """The record of the running attempt ``listed_id`` names with its token (its lease renewed);
        :class:`UnknownTaskError` if there is no such rollout, ``AttemptTokenError`` (counted) if the id does
        not carry the token of a current attempt handed out to a runner."""
        tokened = split(listed_id)
        record = self._record(tokened.rollout_id if tokened else listed_id)
        self.runners.check_current(record, tokened.token if tokened else None, what)
        self.runners.extend(record)
        return record

    def release_expired(self) -> int:
        """Hand back runners' attempts whose lease ended (see :mod:`.runners`)."""
        return self.runners.release_expired(self._record_or_none)

    def _result(self, record: TaskRecord) -> RollqRollout | None:
        if record.state not in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED):
            return None
        try:
            return fetch_rollouts(self.connection, self.keys, [record.task.rollout_id]).get(record.task.rollout_id)
        except RolloutTrimmedError:
            return None

    def _overrides(self, rollout_id: str) -> dict[str, str]:
        raw = cast(dict[bytes, bytes], self.connection.hgetall(self.agl.status(rollout_id)))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def get(self, rollout_id: str) -> tuple[Rollout, list[str]]:
        """The rollout and its attempt ids (``rollout_id`` bare or as listed); :class:`UnknownTaskError` if there
        is none."""
        rollout_id = self._named(rollout_id)
        record = self._record(rollout_id)
        rollout = view(record, self._result(record), self._overrides(rollout_id))
        attempts = [str(a.attempt) for a in read_attempts(self.connection, self.keys, rollout_id)]
        return rollout, attempts

    def in_states(self, states: Iterable[RolloutState], limit: int, client: str = "") -> list[Rollout]:
        """Up to ``limit`` rollouts in ``states`` (a SCAN over the namespace's tasks: for controllers and tools),
        each under the id ``client`` may take or report it with (see :mod:`.runners`)."""
        found: list[Rollout] = []
        for state in dict.fromkeys(states):
            for rollq_state in ROLLQ_STATES[state]:
                cursor: str | None = None
                while len(found) < limit:
                    page = self.producer.query_tasks(rollq_state, limit=limit - len(found), cursor=cursor)
                    records = read_records(self.connection, self.keys, [t.rollout_id for t in page.tasks])
                    found += [
                        self._listed(records[t.rollout_id], client) for t in page.tasks if t.rollout_id in records
                    ]
                    cursor = page.cursor
                    if cursor is None:
                        break
        return found[:limit]

    def _listed(self, record: TaskRecord, client: str) -> Rollout:
        shown = view(record)
        listed = self.runners.listed_id(record, client)
        return shown if listed == shown.rollout_id else shown.model_copy(update={"rollout_id": listed})

    def patch(self, listed_id: str, patch: RolloutPatch, client: str = "") -> Rollout:
        """Apply a client's PATCH, as an external runner (AL's ``agl-controller``) sends them.

        ``queuing -> running`` claims the task for that runner (a rollq attempt, taken off the queue so no
        worker runs it; 409 if a worker already has it); ``running -> succeeded`` publishes the attempt with
        triplets read from its events; ``running -> failed`` fails the attempt for good (a runner that
        reports a failure has already given up; AL's controller never runs a rollout twice);
        ``queuing -> failed`` cancels. Anything AL forbids is 409.

        ``listed_id`` must be the id the rollout was listed with (its token): for a queued rollout the token of
        the attempt the claim makes, else that of the runner attempt that is current; otherwise
        ``AttemptTokenError`` (counted) and nothing changes. ``client`` claims (its share of leases bounded).
        """
        tokened = split(listed_id)
        record = self._record(tokened.rollout_id if tokened else listed_id)
        rollout_id = record.task.rollout_id
        current = view(record)
        attempt: int | None = None
        if tokened is not None and record.state == "queued":
            attempt = self.runners.check_next(record, tokened.token)
        else:
            self.runners.check_current(record, tokened.token if tokened else None, "a PATCH")
            self.runners.extend(record)
        updates = patch.status.model_dump(exclude_unset=True) if patch.status is not None else {}
        state = updates.pop("state", None)
        if state is not None and state != current.status.state and state not in VALID_TRANSITIONS[current.status.state]:
            raise InvalidTransition(f"Rollout {rollout_id}: cannot transition {current.status.state} -> {state}")
        kept = [k for k, v in updates.items() if k in _PATCHABLE and v is not None]
        if kept:
            self.connection.hset(self.agl.status(rollout_id), mapping={k: str(updates[k]) for k in kept})
        if state is not None and state != current.status.state:
            if state == RolloutState.RUNNING and attempt is not None:
                self.runners.hold(record, client)
                self._claim_for_runner(record, attempt, client)
            elif current.status.state == RolloutState.QUEUING:
                self.producer.cancel([rollout_id])
            else:
                self._finish_for_runner(self._record(rollout_id), state, updates.get("error_message"))
        return self.get(rollout_id)[0]

    def _claim_for_runner(self, record: TaskRecord, expected: int, client: str) -> None:
        rid = record.task.rollout_id
        job = cast(bytes | None, self.connection.hget(self.keys.task(rid), TaskField.JOB))
        if job is None:
            raise InvalidTransition(f"Rollout {rid}: it has no queued job to claim")
        job_id = job.decode()
        if is_pack_job(self.keys, job_id):
            # A pack (tasks_per_job > 1): its tasks first each on a job of their own, so that taking this task's job
            # off the queue leaves the others queued (a worker that took the pack meanwhile runs them all).
            pack = read_rollq_jobs(self.connection, [job_id])[job_id]
            if pack is None or isinstance(pack, InvalidTaskError):
                raise InvalidTransition(f"Rollout {rid}: its pack {job_id} cannot be read ({pack or 'no job hash'})")
            split = self.producer.lifecycle.split_pack(job_id, rollout_ids_of(pack), taken_from=self.keys.rq_queue)
            if isinstance(split, str):
                raise InvalidTransition(f"Rollout {rid}: its pack {job_id} cannot be split ({split})")
            if split == -2:
                raise InvalidTransition(f"Rollout {rid}: a rollq worker took its pack {job_id} meanwhile")
            job_id = self.keys.job_id(rid)
        # Off RQ's queue first, so no worker takes it; the claim script then decides (a worker may have won).
        pipe = self.connection.pipeline(transaction=False)
        pipe.lrem(self.keys.rq_queue, 1, job_id)
        pipe.delete(self.keys.rq_job(job_id))
        pipe.execute()
        claim = self.producer.lifecycle.claim(rid, job_id, RUNNER_NAME)
        if isinstance(claim, ClaimRefused):
            raise InvalidTransition(f"Rollout {rid}: cannot transition queuing -> running: it is {claim.state}")
        if claim.attempt != expected:  # claimed and handed back by others since it was listed: not this token's
            self.producer.lifecycle.requeue(record.task, claim.attempt, record.policy, "released")
            raise InvalidTransition(f"Rollout {rid}: attempt {expected} was taken meanwhile; list it again")
        # Posted events of earlier attempts (AL's runners all say attempt "0") are not this attempt's.
        self.connection.delete(self.agl.events(rid))
        self.runners.leased(rid, claim.attempt, record.policy.timeout_seconds, client)

    def _finish_for_runner(self, record: TaskRecord, state: RolloutState, message: str | None) -> None:
        rid, attempt = record.task.rollout_id, record.attempt
        succeeded = state == RolloutState.SUCCEEDED
        if succeeded and not (record.worker or "").startswith(RUNNER_NAME):
            raise InvalidTransition(
                f"Rollout {rid}: cannot transition running -> succeeded: a rollq worker runs it and will publish it"
            )
        events = event_views.query(self.events(rid), event_type=None, triplet=True, include_routed_experts=False)
        triplets = triplets_of(events)
        rollout = stamp(
            RollqRollout(
                rollout_id=rid,
                triplets=triplets or None,
                final_reward=reward_of(events),
                metadata={"agl1_runner": record.worker},
            ),
            status=RolloutStatus.SUCCEEDED if succeeded else RolloutStatus.FAILED,
            attempt=attempt,
            worker=record.worker or RUNNER_NAME,
            error=None if succeeded else RunnerFailure(message or "the runner reported the rollout failed"),
            generation=record.generation,
        )
        reply = self.producer.lifecycle.finish(
            Finish(
                rollout_id=rid,
                attempt=attempt,
                rollout_json=rollout_json(rollout),
                status=RolloutStatus.SUCCEEDED if succeeded else RolloutStatus.FAILED,
                results_maxlen=self.producer.results_maxlen,
                dead_letter=not succeeded,
                now=time.time(),
                reward=rollout.final_reward,
                summary=summary_json(rollout, status=RolloutStatus.SUCCEEDED if succeeded else RolloutStatus.FAILED),
            )
        )
        self.runners.ended(rid, attempt)
        if not isinstance(reply, Published):
            raise InvalidTransition(f"Rollout {rid}: attempt {attempt} is no longer current ({type(reply).__name__})")

    def delete(self, rollout_id: str) -> None:
        """Forget a rollout (cancelling it first if it has not ended); a missing id is a no-op."""
        try:
            record = self._record(rollout_id)
        except UnknownTaskError:
            record = None
        if record is not None and record.state in (TaskState.QUEUED, TaskState.RUNNING):
            self.producer.cancel([rollout_id])
        pipe = self.connection.pipeline(transaction=False)
        pipe.delete(self.keys.task(rollout_id), self.agl.events(rollout_id), self.agl.status(rollout_id))
        pipe.zrem(self.keys.dead_letter, rollout_id)
        pipe.execute()

    # -- the terminal log --------------------------------------------------------------------------

    def _catch_up(self) -> None:
        """Append to the terminal log the rollouts that ended since the last call (any server may do it)."""
        while True:
            with self.connection.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.agl.terminal_read)
                    last = pipe.get(self.agl.terminal_read)
                    start = "(" + cast(bytes, last).decode() if last else "-"
                    entries = cast(
                        list[tuple[bytes, dict[bytes, bytes]]],
                        pipe.xrange(self.keys.results, min=start, max="+", count=_TERMINAL_BATCH),
                    )
                    if not entries:
                        return
                    ids = [fields.get(StreamField.ROLLOUT_ID.encode(), b"").decode() for _, fields in entries]
                    pipe.multi()
                    pipe.rpush(self.agl.terminal, *[rid for rid in ids if rid] or [""])
                    pipe.set(self.agl.terminal_read, entries[-1][0])
                    pipe.execute()
                except redis.WatchError:
                    continue
            if len(entries) < _TERMINAL_BATCH:
                return

    def terminal(self, after: int, limit: int) -> TerminalRolloutsPage:
        """The rollouts that ended, in that order, from index ``after``; pass ``next_after`` back."""
        after, limit = max(after, 0), max(limit, 1)
        self._catch_up()
        pipe = self.connection.pipeline(transaction=False)
        pipe.llen(self.agl.terminal)
        pipe.lrange(self.agl.terminal, after, after + limit - 1)
        total, raw = pipe.execute()
        ids = [r.decode() for r in raw]
        records = read_records(self.connection, self.keys, [rid for rid in dict.fromkeys(ids) if rid])
        items = []
        for rid in ids:
            if rid not in records:  # deleted, expired, or a blank
                continue
            rollout = view(records[rid])
            if rollout.status.state in TERMINAL_STATES:
                items.append(
                    TerminalRolloutItem(
                        rollout_id=rid,
                        state=rollout.status.state,
                        data_id=data_id_of(rollout),
                        is_train=rollout.is_train,
                    )
                )
        return TerminalRolloutsPage(items=items, next_after=after + len(ids), total_terminal=int(total))

    # -- events ------------------------------------------------------------------------------------

    def _posted(self, rollout_id: str) -> list[Event]:
        raw = cast(list[bytes], self.connection.lrange(self.agl.events(rollout_id), 0, -1))
        found = []
        for item in raw:
            try:
                found.append(Event.model_validate_json(item))
            except ValueError as exc:  # written by something else: left out, said once per read
                log.warning("an event of rollout %s is not an AL Event and is left out: %s", rollout_id, exc)
        return found

    def record_event(self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any]) -> Event:
        """Append one event to an attempt of an existing rollout; :class:`UnknownTaskError` if there is none."""
        self._record(rollout_id)
        event = Event(
            event_type=event_type, rollout_id=rollout_id, attempt_id=attempt_id, timestamp=time.time(), data=data
        )
        pipe = self.connection.pipeline(transaction=False)
        if event_type == "model_request" and data.get("routed_experts") is not None:
            posted = self._posted(rollout_id)
            same_attempt = [(i, e) for i, e in enumerate(posted) if e.attempt_id == attempt_id]
            for index in event_views.drop_superseded_routes([e for _, e in same_attempt], event_type, data):
                position, earlier = same_attempt[index]
                pipe.lset(
                    self.agl.events(rollout_id), position, event_views.without_routed_experts(earlier).model_dump_json()
                )
        pipe.rpush(self.agl.events(rollout_id), event.model_dump_json())
        pipe.execute()
        return event

    def post_event(self, listed_id: str, attempt_id: str, body: EventCreate) -> Event:
        """Append a runner's event to its attempt; ``listed_id`` must carry the attempt's token (see
        :meth:`runner_attempt`)."""
        record = self.runner_attempt(listed_id, "an event")
        return self.record_event(record.task.rollout_id, attempt_id, body.event_type, body.data)

    def events(self, rollout_id: str) -> list[Event]:
        """The events of the rollout's last attempt: those its worker published and those posted here, by time.

        The last attempt is the one a runner reported (``last_attempt_id``: AL's controller always says "0"),
        else rollq's current attempt.
        """
        rollout_id = self._named(rollout_id)
        record = self._record(rollout_id)
        reported = self.connection.hget(self.agl.status(rollout_id), "last_attempt_id")
        attempt = (
            cast(bytes, reported).decode()
            if reported
            else str(record.attempt)
            if record.attempt > 0
            else DEFAULT_ATTEMPT_ID
        )
        # Posted events count only for an attempt a runner took through serve-agl (a worker's come with its result).
        found = [e for e in self._posted(rollout_id) if e.attempt_id == attempt] if record.worker == RUNNER_NAME else []
        result = self._result(record)
        if result is not None:
            published_attempt = str(result.metadata.get("attempt", attempt))
            for item in result.metadata.get(EVENTS_METADATA_KEY) or []:
                if isinstance(item, dict):
                    found.append(
                        Event.model_validate({**item, "rollout_id": rollout_id, "attempt_id": published_attempt})
                    )
        return sorted(found, key=lambda e: e.timestamp)

    # -- models ------------------------------------------------------------------------------------

    def models(self) -> list[Model]:
        raw = cast(dict[bytes, bytes], self.connection.hgetall(self.agl.models))
        return [Model.model_validate_json(v) for v in raw.values()]

    def register(self, models: list[Model]) -> list[Model]:
        """Upsert by (model, endpoint); the served model's endpoints become the latest rollq resources."""
        if models:
            self.connection.hset(
                self.agl.models, mapping={json.dumps([m.model, m.endpoint]): m.model_dump_json() for m in models}
            )
        if models and not any(m.model == self.proxy.model_name for m in models):
            log.warning(
                "registered %s, but this server serves %r (--model-name): its proxy answers 503 until that model has "
                "an endpoint",
                sorted({m.model for m in models}),
                self.proxy.model_name,
            )
        self._publish_resources()
        return models

    def delete_models(self) -> None:
        """Remove every model. Rollouts already claimed keep the endpoints they started with (see the docs)."""
        self.connection.delete(self.agl.models)

    def served(self) -> list[Model]:
        """The served model's endpoints, sorted by endpoint (AL's sticky routing order)."""
        return sorted((m for m in self.models() if m.model == self.proxy.model_name), key=lambda m: m.endpoint)

    def _publish_resources(self) -> None:
        served = self.served()
        if not served:
            return
        resources = {
            f"{RESOURCE_PREFIX}{i}": LLM(
                endpoint=m.endpoint,
                model=m.model,
                sampling_parameters={
                    PROXY_SETTINGS_KEY: {**self.proxy.to_json(), "version": m.version, "endpoint": m.endpoint}
                },
            )
            for i, m in enumerate(served)
        }
        self.producer.update_resources(resources)

    # -- pause and in-flight calls -----------------------------------------------------------------

    def pause_state(self) -> PauseStateResponse:
        pipe = self.connection.pipeline(transaction=False)
        pipe.hgetall(self.agl.pause)
        now = time.time()
        pipe.zremrangebyscore(self.agl.inflight, "-inf", now)
        pipe.zcard(self.agl.inflight)
        raw, _, inflight = pipe.execute()
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        return PauseStateResponse(
            paused=fields.get("paused") == "1",
            retry_after_seconds=int(fields.get("retry_after", "5")),
            reason=fields.get("reason") or None,
            inflight=int(inflight),
        )

    def pause(self, request: PauseRequest) -> PauseStateResponse:
        self.connection.hset(
            self.agl.pause,
            mapping={"paused": "1", "retry_after": str(request.retry_after_seconds), "reason": request.reason or ""},
        )
        return self.pause_state()

    def resume(self) -> PauseStateResponse:
        self.connection.hset(self.agl.pause, mapping={"paused": "0", "reason": ""})
        return self.pause_state()

    def begin_call(self) -> str:
        token = uuid.uuid4().hex
        self.connection.zadd(self.agl.inflight, {token: time.time() + INFLIGHT_LEASE_SECONDS})
        return token

    def end_call(self, token: str) -> None:
        self.connection.zrem(self.agl.inflight, token)
