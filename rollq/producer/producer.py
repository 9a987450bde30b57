"""The trainer's handle on rollq: queue tasks, publish resources, collect rollouts."""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, cast, overload

import redis

from rollq.models.coerce import coerce_resources
from rollq.models.contract import ResourcesUpdate, Rollout, Task, TaskInput
from rollq.models.errors import (
    BackpressureTimeoutError,
    EnqueueIncompleteError,
    EnqueueUndoneError,
    InvalidTaskError,
    JobIdTakenError,
    PayloadTooLargeError,
    UnknownResourcesError,
)
from rollq.models.finite import non_finite_at
from rollq.models.groups import Membership, member_rollout_id, new_group_id
from rollq.models.policy import RolloutPolicy, TaskState
from rollq.store.connection import connect, process_client_name, transient_refusal
from rollq.store.control import CancelResult, cancel_call, cancel_script_source, parse_cancel
from rollq.store.eviction import warn_if_evicting
from rollq.store.jobs import MAX_PACK
from rollq.store.keys import DEFAULT_NAMESPACE, Keys
from rollq.store.llm_gate import GateStatus, LLMGate, PauseReport
from rollq.store.queries import AttemptInfo, TaskInfo, TaskPage, query_tasks, read_attempts
from rollq.store.reaper import ReapReport, reap
from rollq.store.records import read_record, read_records, read_records_or_errors
from rollq.store.replies import Enqueued
from rollq.store.resources import ResourceStore
from rollq.store.settings import Settings
from rollq.store.transitions import DEFAULT_RESULTS_MAX_BYTES, Lifecycle

from .batches import TRAINING_MODES, BatchReader
from .groups import GroupPolicy
from .results import QueuedAfter, ResultReader, WaitResult, collect, fetch_rollouts, wait

log = logging.getLogger(__name__)

Mode = str | None

ENQUEUE_CHUNK = 2000
"""Big batches go out in chunks this size (one transaction each): still few round trips, bounded client memory."""


class Producer:
    """Queue tasks and collect rollouts for one namespace.

    >>> producer = Producer.from_url("memory://", namespace="docs")
    >>> task = producer.enqueue({"question": "2+2"}, mode="train")
    >>> producer.get_task(task.rollout_id).num_claims
    0
    """

    def __init__(
        self,
        connection: redis.Redis,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        policy: RolloutPolicy | None = None,
        results_maxlen: int = 100_000,
        results_max_bytes: int = DEFAULT_RESULTS_MAX_BYTES,
        keep_versions: int = 10,
        max_task_bytes: int = 1024 * 1024,
        wait_replicas: int | None = None,
        wait_timeout_ms: int = 1000,
        tasks_per_job: int | None = None,
    ) -> None:
        self.connection = connection
        # None: ROLLQ_TASKS_PER_JOB (1 unless set). Checked here, so that a bad value fails at construction.
        self.tasks_per_job = _checked_pack(Settings().tasks_per_job if tasks_per_job is None else tasks_per_job)
        self.keys = Keys(namespace)
        self.policy = policy or RolloutPolicy()
        self.results_maxlen = results_maxlen
        self.max_task_bytes = max_task_bytes
        # wait_replicas > 0 (None: 1 behind Sentinel, else 0): an enqueue returns once that many replicas hold it
        # (or wait_timeout_ms passed, with a warning), so a failover cannot drop a task the producer was told is
        # queued. See rollq.store.replication.
        self.lifecycle = Lifecycle(
            connection,
            self.keys,
            results_max_bytes=results_max_bytes,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
        )
        self.resources = ResourceStore(connection, self.keys, keep_versions=keep_versions)
        self._cancel = connection.register_script(cancel_script_source())
        self._policy_checked = False  # the eviction-policy warning, at the first enqueue
        self._queued_after = QueuedAfter()  # where the results stream stood as each task was queued (for wait)
        self.first_queued_after: bytes | None = None
        """Where the results stream stood when this producer first queued a task (None until it has): a new
        consumer group of :meth:`batches` starts there, not at earlier runs' rollouts."""
        self._llm_gate = LLMGate(connection, self.keys)
        self._weight_sync: PauseReport | None = None  # the pause of the weight_sync block open, if any

    @classmethod
    def from_url(cls, url: str | None = None, namespace: str = DEFAULT_NAMESPACE, **kwargs: Any) -> Producer:
        """A producer on ``url``; see :func:`models.connection.connect` (None: ``ROLLQ_REDIS_URL``, ``REDIS_URL``)."""
        return cls(connect(url, client_name=process_client_name("producer")), namespace, **kwargs)

    @property
    def namespace(self) -> str:
        return self.keys.namespace

    # -- tasks ---------------------------------------------------------------

    def enqueue(
        self,
        input: TaskInput,
        mode: Mode = None,
        resources_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        rollout_id: str | None = None,
        policy: RolloutPolicy | None = None,
    ) -> Task:
        """Queue one task and return it; a ``rollout_id`` already known is not queued again (its task is returned)."""
        return self.enqueue_many(
            [input],
            mode=mode,
            resources_id=resources_id,
            metadata=metadata,
            rollout_ids=None if rollout_id is None else [rollout_id],
            policy=policy,
        )[0]

    def enqueue_many(
        self,
        inputs: Iterable[TaskInput],
        mode: Mode = None,
        resources_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        rollout_ids: Sequence[str] | None = None,
        policy: RolloutPolicy | None = None,
        on_progress: Callable[[int], None] | None = None,
        group_size: int | None = None,
        max_pending: int | None = None,
        pending_timeout: float | None = None,
        tasks_per_job: int | None = None,
    ) -> list[Task]:
        """Queue a batch of tasks in pipelined round trips (one per 2000 tasks) and return them.

        Each task gets a fresh ``rollout_id`` unless ``rollout_ids`` gives them;
        ids already known are not queued again and their stored task is returned.

        Each chunk of 2,000 tasks (in whole groups: a group larger than that is a chunk of its own) is one
        transaction: Redis queues all of it or none. When Redis refuses a chunk
        (out of memory, say) after earlier ones were queued, those stay queued and
        :class:`~rollq.models.errors.EnqueueIncompleteError` is raised from the refused chunk's error
        (``redis.exceptions.OutOfMemoryError``, ...: its ``__cause__``): its ``tasks`` are the batch's first
        tasks, those queued, and its message says "N of M task(s) queued before Redis refused: <reason>; the
        rest were not queued" and how to queue the rest. With ``rollout_ids`` given, enqueueing the whole batch
        again is safe (known ids are not queued twice); without, a retry of the whole batch queues the first N
        again under new ids. A refusal of the first chunk raises the refusal itself: nothing was queued.

        With ``group_size=G``, each input is queued G times as one group (GRPO): the members share a
        ``group_id`` in their metadata, with their ``group_index`` and the ``group_size``, and
        :meth:`batches` hands the trainer whole groups. ``rollout_ids`` cannot be combined with groups
        (the members' ids are derived from the group id, see :mod:`rollq.models.groups`).

        ``max_pending=N`` is back-pressure for asynchronous RL: tasks are queued only while the namespace has at
        most N tasks queued or running, waiting (up to ``pending_timeout`` seconds, None: forever, then
        :class:`~rollq.models.errors.BackpressureTimeoutError`) for rollouts to finish. Tasks on the latest
        resources version start when claimed, so with N = (k + 1) x the rollouts one training step consumes, no
        task is claimed more than about k versions before the step that trains on it: the bound that keeps a
        ``batches(max_staleness=k)`` trainer from dropping work.

        ``tasks_per_job=K`` (default: the producer's, from ``ROLLQ_TASKS_PER_JOB``, 1 unless set) queues the
        tasks in packs of up to K per RQ job: N tasks make ceil(N/K) RQ jobs (with groups, K = ``group_size``
        makes each group one job). Each task keeps its own record, attempts and outcome; a worker runs a pack's
        tasks side by side, one slot each, and RQ's per-job bookkeeping is paid once per pack (docs/rq.md,
        "Packs"). A task that goes back to the queue (retry, hand-back, reaper) goes as a job of its own.
        """
        if isinstance(inputs, (str, bytes, bytearray, Mapping)):
            raise TypeError(
                f"inputs must be a list of task inputs, not a {type(inputs).__name__} (enqueue() queues one input)"
            )
        policy = policy or self.policy
        ids_given = rollout_ids is not None  # the caller's ids: a retry with them queues none twice
        per_job = self.tasks_per_job if tasks_per_job is None else _checked_pack(tasks_per_job)
        if group_size is not None and (
            isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1
        ):
            raise ValueError(f"group_size must be a whole number of at least 1, not {group_size!r}")
        if max_pending is not None and max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        if max_pending is not None and group_size is not None and max_pending < group_size:
            raise ValueError(
                f"max_pending={max_pending} is less than group_size={group_size}: a group is queued whole, so "
                "none could ever be queued"
            )
        now = time.time()
        inputs = list(inputs)
        per_task: list[dict[str, Any]] | None = None
        if group_size is not None:
            if rollout_ids is not None:
                raise ValueError("rollout_ids cannot be given with group_size: members' ids come from their group")
            group_ids = [new_group_id(group_size) for _ in inputs]
            groups = [Membership(gid, i, group_size) for gid in group_ids for i in range(group_size)]
            inputs = [value for value in inputs for _ in range(group_size)]
            rollout_ids = [member_rollout_id(m.group_id, m.index) for m in groups]
            per_task = [{**(metadata or {}), **m.metadata()} for m in groups]
        if rollout_ids is not None and len(rollout_ids) != len(inputs):
            raise ValueError(f"{len(inputs)} inputs but {len(rollout_ids)} rollout ids")
        if rollout_ids is not None and not all(isinstance(rid, str) and rid for rid in rollout_ids):
            raise ValueError("rollout ids must be non-empty strings")
        # Validate what the batch shares once; each task then only adds its id and input.
        shared = Task(rollout_id="-", input=None, mode=mode, resources_id=resources_id, create_time=now, num_claims=0)  # type: ignore[arg-type]
        fields = shared.model_dump(exclude={"rollout_id", "input", "metadata"})
        tasks = [
            Task.model_construct(
                rollout_id=rollout_ids[i] if rollout_ids is not None else f"rollout-{uuid.uuid4().hex}",
                input=value,
                metadata=per_task[i] if per_task is not None else dict(metadata or {}),
                **fields,
            )
            for i, value in enumerate(inputs)
        ]
        serialized = [(task, _task_json(task)) for task in tasks]
        for task, data in serialized:
            if len(data) > self.max_task_bytes:
                raise PayloadTooLargeError(f"task {task.rollout_id}", len(data), self.max_task_bytes)
        if not self._policy_checked:
            self._policy_checked = True
            warn_if_evicting(self.connection, f"producer of namespace {self.namespace!r}")
        step = _chunk_size(max_pending, group_size or 1, per_job)
        outcomes: list[Enqueued] = []
        for start in range(0, len(serialized), step):
            chunk = serialized[start : start + step]
            if max_pending is not None:
                self._wait_for_room(len(chunk), max_pending, pending_timeout, queued=start)
            try:
                # One transaction per chunk: Redis queues all of it or none (a full Redis refuses it whole).
                chunk_outcomes, position = self.lifecycle.enqueue_many_after(chunk, policy, tasks_per_job=per_job)
                # The enqueue script checks the pinned version atomically and queues none of a batch without it.
                if Enqueued.UNKNOWN_RESOURCES in chunk_outcomes:
                    raise UnknownResourcesError(resources_id, self.namespace)
            except (redis.RedisError, UnknownResourcesError, EnqueueUndoneError) as exc:
                if not outcomes:
                    raise
                # The earlier chunks stay queued (cancelling them made a retry with the same rollout ids return
                # them cancelled, and a full Redis refused the cancel too): the error names them instead.
                raise self._incomplete(exc, tasks, outcomes, ids_given=ids_given, group_size=group_size) from exc
            outcomes += chunk_outcomes
            if position is not None:
                if self.first_queued_after is None:
                    self.first_queued_after = position
                self._queued_after.record(
                    (t.rollout_id for (t, _), got in zip(chunk, chunk_outcomes, strict=True) if got is Enqueued.QUEUED),
                    position,
                )
            if on_progress:
                on_progress(len(chunk))
        taken = [
            task.rollout_id for task, outcome in zip(tasks, outcomes, strict=True) if outcome is Enqueued.JOB_TAKEN
        ]
        if taken:
            # The others of the batch are queued; these would have overwritten a job that is not theirs.
            raise JobIdTakenError(self.keys.job_id(taken[0]), taken[0])
        return self._as_returned(tasks, outcomes)

    def _as_returned(self, tasks: list[Task], outcomes: list[Enqueued]) -> list[Task]:
        """``tasks`` as :meth:`enqueue_many` returns them: a known rollout id as its stored task."""
        known = [task.rollout_id for task, outcome in zip(tasks, outcomes, strict=True) if outcome is Enqueued.KNOWN]
        if known:
            stored = read_records(self.connection, self.keys, known)
            tasks = [stored[t.rollout_id].task if t.rollout_id in stored else t for t in tasks]
        return tasks

    def _incomplete(
        self,
        exc: Exception,
        tasks: list[Task],
        outcomes: list[Enqueued],
        *,
        ids_given: bool,
        group_size: int | None,
    ) -> EnqueueIncompleteError:
        """The error of a batch whose chunk failed with ``exc`` after its first ``len(outcomes)`` tasks were
        queued (or known): it carries those tasks, says how many of how many, and how to queue the rest without
        queueing any twice (a retry of the whole batch queues its fresh rollout ids again)."""
        done = len(outcomes)
        try:
            handled = self._as_returned(tasks[:done], outcomes)
        except redis.RedisError:  # Redis out of reach: the known ones as they were given
            handled = tasks[:done]
        queued = sum(1 for outcome in outcomes if outcome is Enqueued.QUEUED)
        reason, rest = why_not_queued(exc)
        if ids_given:
            retry = "enqueue the batch again with the same rollout_ids: those queued are not queued twice"
        elif group_size is not None and done % group_size == 0:
            retry = (
                f"the groups of the first {done // group_size} input(s) are queued: enqueue the inputs from index "
                f"{done // group_size} on again"
            )
        else:
            retry = f"enqueue the inputs from index {done} on again, or give rollout_ids to make a retry safe"
        return EnqueueIncompleteError(handled, queued, len(tasks), reason=reason, rest=f"{rest} ({retry})")

    def pending(self) -> int:
        """Tasks queued or running in this namespace (one round trip): the queued-task index and the running set.

        A task is in the index from its enqueue (or requeue) until its claim, which moves it to the running set in
        the same script, so it counts once, also while a worker has taken its job off RQ's queue and not claimed
        it yet, and a pack's tasks count one each. RQ's lists are not counted: a cancelled task's job stays on them
        until a worker drops it."""
        pipe = self.connection.pipeline(transaction=False)
        pipe.scard(self.keys.queued_tasks)
        pipe.zcard(self.keys.inflight)
        queued, running = pipe.execute()
        return int(queued) + int(running)

    def _wait_for_room(self, wanted: int, max_pending: int, timeout: float | None, *, queued: int) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay, logged = 0.02, False
        while (pending := self.pending()) + wanted > max_pending:
            if deadline is not None and time.monotonic() >= deadline:
                raise BackpressureTimeoutError(pending, max_pending, timeout or 0.0, queued)
            if not logged:
                log.info("%d queued or running (max_pending=%d): waiting to queue %d", pending, max_pending, wanted)
                logged = True
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def get_task(self, rollout_id: str) -> Task:
        """The task with ``num_claims`` and ``last_claim_time`` as the workers left them."""
        return read_record(self.connection, self.keys, rollout_id).task

    def task_info(self, rollout_id: str) -> TaskInfo:
        """State, attempt counts, worker and times of a task; :class:`UnknownTaskError` if unknown."""
        return TaskInfo.from_record(read_record(self.connection, self.keys, rollout_id))

    def attempts(self, rollout_id: str) -> list[AttemptInfo]:
        """The task's attempts, oldest first (the newest 32 are kept): worker, claim and end times, outcome."""
        read_record(self.connection, self.keys, rollout_id)  # an unknown id raises rather than reading as "none"
        return read_attempts(self.connection, self.keys, rollout_id)

    def query_tasks(
        self,
        state: TaskState | str | None = None,
        mode: str | None = None,
        *,
        limit: int = 100,
        cursor: str | None = None,
    ) -> TaskPage:
        """A page of tasks in ``state`` and/or ``mode``; pass ``page.cursor`` back for the next page.

        Walks the namespace's task records with SCAN: a full walk costs O(keys in the
        database), so use it to inspect, not on every step (see :func:`rollq.store.queries.query_tasks`).
        """
        return query_tasks(self.connection, self.keys, state=state, mode=mode, limit=limit, cursor=cursor)

    def cancel(self, rollout_ids: Sequence[str]) -> list[CancelResult]:
        """Cancel tasks that have not finished, in one pipelined round trip.

        A queued task never runs (a worker that takes its job refuses the claim); a running
        one loses its attempt, and the worker's result, when it comes, is dropped. Each
        cancelled task ends with a rollout whose ``metadata["status"]`` is ``"cancelled"``, so
        ``wait`` and ``rollouts()`` still see exactly one outcome per task. Finished and
        unknown ids are reported, not changed.
        """
        pipe = self.connection.pipeline(transaction=False)
        now = time.time()
        for rid in rollout_ids:
            keys, args = cancel_call(
                self.keys,
                rid,
                results_maxlen=self.results_maxlen,
                now=now,
                results_max_bytes=self.lifecycle.results_max_bytes,
            )
            self._cancel(keys=keys, args=args, client=pipe)
        return [parse_cancel(rid, reply) for rid, reply in zip(rollout_ids, pipe.execute(), strict=True)]

    # -- resources -----------------------------------------------------------

    def update_resources(self, resources: Mapping[str, Any] | Any) -> str:
        """Publish a new immutable resources version, make it the latest, and return its id.

        Values may be rollq's ``LLM``/``PromptTemplate``, Agent Lightning's, or dicts of that
        shape; a ``ResourcesUpdate``-shaped object gives its ``resources``.
        """
        return self.resources.publish(coerce_resources(resources))

    def get_resources(self, resources_id: str | None = None) -> ResourcesUpdate:
        """A resources version by id, or the latest; :class:`UnknownResourcesError` if unknown."""
        return self.resources.get(resources_id)

    # -- weight sync -----------------------------------------------------------

    def pause_llm(self, timeout: float = 60.0, *, lease: float | None = None) -> PauseReport:
        """Pause every worker's LLM calls for a weight sync; returns once none runs on any live worker.

        Workers see the pause within one heartbeat; from then on their capturing proxies start no upstream call
        (calls wait, bounded by the workers' ``llm_pause_wait_seconds``, then get 503 + Retry-After), and calls
        already running finish. Raises :class:`LLMPauseTimeoutError` naming the workers still busy after
        ``timeout`` (the pause stays in place: call :meth:`resume_llm`). ``lease``: the pause lifts itself after
        that many seconds, should this process die before resuming.
        """
        return self._llm_gate.pause(checked_timeout(timeout), lease=lease)

    def resume_llm(self) -> None:
        """Lift the pause; paused workers open at once, stamping new calls with the latest resources version."""
        self._llm_gate.resume()

    def llm_gate_status(self) -> GateStatus:
        """Whether LLM calls are paused, and the workers' reports (live workers, calls running and waiting)."""
        return self._llm_gate.status()

    @contextlib.contextmanager
    def weight_sync(self, timeout: float = 60.0, *, lease: float | None = None) -> Iterator[PauseReport]:
        """``with producer.weight_sync(): load weights; producer.update_resources(...)``: pauses on enter (see
        :meth:`pause_llm`) and resumes on exit, also when the body or the pause itself raises. A ``weight_sync``
        inside another of the same producer changes nothing: the outer block's pause holds until it ends (its
        report is the inner one's too)."""
        if self._weight_sync is not None:
            yield self._weight_sync
            return
        try:
            report = self.pause_llm(timeout, lease=lease)
        except BaseException:
            self.resume_llm()
            raise
        self._weight_sync = report
        try:
            yield report
        finally:
            self._weight_sync = None
            self.resume_llm()

    # -- results -------------------------------------------------------------

    @overload
    def wait(
        self,
        rollout_ids: Sequence[str],
        timeout: float,
        on_progress: Callable[[int], None] | None = None,
        *,
        partial: Literal[False] = False,
    ) -> list[Rollout]: ...

    @overload
    def wait(
        self,
        rollout_ids: Sequence[str],
        timeout: float,
        on_progress: Callable[[int], None] | None = None,
        *,
        partial: Literal[True],
    ) -> WaitResult: ...

    def wait(
        self,
        rollout_ids: Sequence[str],
        timeout: float,
        on_progress: Callable[[int], None] | None = None,
        *,
        partial: bool = False,
    ) -> list[Rollout] | WaitResult:
        """The rollouts of ``rollout_ids``, in that order, once all have finished.

        Non-destructive (anyone may wait on the same ids); blocks on the results
        stream; raises :class:`RolloutTimeoutError` naming the missing ids. With
        ``partial=True`` it returns a :class:`WaitResult` instead: the rollouts that
        finished by the timeout, in order, and the ids still missing.
        """
        checked_ids(rollout_ids)
        checked_timeout(timeout)
        after = self._queued_after.start_for(rollout_ids)
        if partial:
            return collect(
                self.lifecycle,
                rollout_ids,
                timeout,
                results_maxlen=self.results_maxlen,
                on_progress=on_progress,
                after=after,
            )
        return wait(
            self.lifecycle,
            rollout_ids,
            timeout,
            results_maxlen=self.results_maxlen,
            on_progress=on_progress,
            after=after,
        )

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The task's rollout if it has finished (as :meth:`get_rollouts` finds it, even for a record that cannot be
        read), else None, without blocking; :class:`UnknownTaskError` if unknown."""
        found = fetch_rollouts(self.connection, self.keys, [rollout_id]).get(rollout_id)
        if found is None:
            read_record(self.connection, self.keys, rollout_id)  # unknown (or unreadable, unfinished): raises
        return found

    def get_rollouts(self, rollout_ids: Sequence[str]) -> dict[str, Rollout]:
        """The rollouts of those of ``rollout_ids`` that have finished (unknown ids are left out), without blocking."""
        return fetch_rollouts(self.connection, self.keys, list(rollout_ids))

    def rollouts(
        self, group: str = "trainers", consumer: str | None = None, *, idle_timeout: float | None = None, **kwargs: Any
    ) -> ResultReader:
        """Finished rollouts as a consumer group member; see :class:`producer.results.ResultReader`."""
        return ResultReader(self.connection, self.keys, group, consumer, idle_timeout=idle_timeout, **kwargs)

    def batches(
        self,
        batch_size: int,
        *,
        max_staleness: int | None = None,
        timeout: float | None = None,
        policy: GroupPolicy | None = None,
        group: str = "batches",
        consumer: str | None = None,
        rank: int = 0,
        world_size: int = 1,
        start: str | None = None,
        modes: Collection[str | None] | None = TRAINING_MODES,
        claim_timeout: float = 30.0,
    ) -> BatchReader:
        """Training batches of ``batch_size`` complete groups, in the order groups complete.

        ``max_staleness=k``: no group any of whose LLM calls ran against a resources version older than
        ``latest - k`` is handed over; it is dropped or its input queued again as a new group
        (``policy.on_stale``), and counted. ``timeout``: seconds to wait for one batch; past it a batch with
        fewer groups is handed over (``Batch.partial``), or :class:`~rollq.producer.batches.BatchTimeoutError`
        raised when not one group completed. ``policy`` says what to do with failed members and how advantages
        are computed (:class:`~rollq.producer.groups.GroupPolicy`). Several trainer processes share the stream
        with ``rank``/``world_size``; a restart under the same ``consumer`` name gets back the groups it had not
        finished. ``start`` is where a consumer group that does not exist yet starts reading: by default where
        the results stream stood when this producer first queued a task (so a new group, or a new ``world_size``,
        is not handed earlier runs' rollouts), or its beginning for a producer that has queued nothing (logged with
        how many rollouts that is); ``"0"`` the beginning, ``"$"`` what is published from now on, or an entry id.
        ``modes``: the task modes whose rollouts are handed over (default ``"train"`` and no mode; None: all);
        the others (``"val"``, ``"test"``) are acknowledged and left out. ``claim_timeout``: how long to wait
        for another live reader under the same consumer name to end before raising
        :class:`~rollq.producer.batches.ReaderBusyError` (two would be handed the same groups). See
        ``docs/training.md``.
        """
        return BatchReader(
            self,
            batch_size=batch_size,
            max_staleness=max_staleness,
            timeout=timeout,
            policy=policy,
            group=group,
            consumer=consumer,
            rank=rank,
            world_size=world_size,
            start=start,
            modes=modes,
            claim_timeout=claim_timeout,
        )

    # -- operations ----------------------------------------------------------

    def dead_letter(self) -> list[str]:
        """Rollout ids that failed for good, oldest first."""
        return [m.decode() for m in cast(list[bytes], self.connection.zrange(self.keys.dead_letter, 0, -1))]

    def requeue_dead(self, rollout_ids: Sequence[str] | None = None) -> list[str]:
        """Queue dead-lettered tasks again with a fresh attempt budget (None: all); returns those requeued. A task
        whose record is not what rollq wrote cannot be queued again: it is logged and left, the others requeued."""
        ids = list(rollout_ids) if rollout_ids is not None else self.dead_letter()
        records, invalid = read_records_or_errors(self.connection, self.keys, ids)
        for error in invalid.values():
            log.error("not requeued: %s", error)
        return [
            rid
            for rid in ids
            if rid in records
            and self.lifecycle.revive(records[rid].task, records[rid].policy, records[rid].task.num_claims or 0)
        ]

    def reap(self) -> ReapReport:
        """Requeue or fail attempts whose worker stopped heartbeating (workers do this too)."""
        return reap(self.lifecycle, results_maxlen=self.results_maxlen)


def checked_ids(rollout_ids: Sequence[str]) -> Sequence[str]:
    """``rollout_ids``, or TypeError for one id given where a list of them is meant (a str is a sequence of
    one-character ids)."""
    if isinstance(rollout_ids, (str, bytes, bytearray)):
        raise TypeError(f"rollout_ids must be a list of rollout ids, not a {type(rollout_ids).__name__}")
    return rollout_ids


def checked_timeout(timeout: float) -> float:
    """``timeout``, or ValueError when it is NaN, infinite or negative (seconds to wait: use a large number)."""
    if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a finite number of seconds, 0 or more, not {timeout!r}")
    return timeout


def why_not_queued(exc: BaseException) -> tuple[str, str]:
    """What stopped an enqueue partway (``exc``, in one line) and what became of the tasks it had not queued: a
    refusal (OOM, READONLY, ...) ran nothing of its chunk; another failure (Redis out of reach, a failover that
    undid the chunk) may have left some of it queued."""
    line = " ".join(str(exc).split()).rstrip(".")
    if transient_refusal(exc) is not None:
        return f"Redis refused: {line}", "the rest were not queued"
    return f"it failed: {line}", "the rest may not be queued"


def _chunk_size(max_pending: int | None, group_size: int, per_job: int) -> int:
    """How many tasks one enqueue transaction takes: at most 2000 (and ``max_pending``), in whole groups and whole
    packs where it can (a pack is made within one chunk; a group queued in one chunk is never left half queued by
    a back-pressure timeout or a refusal between chunks, and its members start on one resources version). A group
    larger than that goes in a transaction of its own (``max_pending`` is at least ``group_size``): split across
    two, a refusal between them left part of it queued, a group no trainer batch completes."""
    if group_size > ENQUEUE_CHUNK:
        return group_size
    step = ENQUEUE_CHUNK if max_pending is None else min(ENQUEUE_CHUNK, max_pending)
    for unit in (math.lcm(group_size, per_job), group_size, per_job):
        if step >= unit:
            return step - step % unit
    return step


def _checked_pack(tasks_per_job: int) -> int:
    if isinstance(tasks_per_job, bool) or not isinstance(tasks_per_job, int) or not 1 <= tasks_per_job <= MAX_PACK:
        raise ValueError(f"tasks_per_job must be a whole number from 1 to {MAX_PACK}, got {tasks_per_job!r}")
    return tasks_per_job


def _task_json(task: Task) -> str:
    """The task's JSON; :class:`InvalidTaskError` naming the task when its input cannot be stored (nested deeper
    than JSON serialisation allows, about 250 levels, not JSON-serialisable, or holding NaN or +-Infinity in its
    input or metadata): nothing of the batch is queued."""
    try:
        data = task.model_dump_json()
    except (ValueError, TypeError, RecursionError) as exc:  # pydantic's PydanticSerializationError is a ValueError
        raise InvalidTaskError(f"task {task.rollout_id} cannot be queued: its input {str(exc)[:300]}") from None
    # NaN and +-Infinity were written as null: looked for only where a null was written.
    if "null" in data and (where := non_finite_at(task.input, "input") or non_finite_at(task.metadata, "metadata")):
        raise InvalidTaskError(
            f"task {task.rollout_id} cannot be queued: {where} is not a finite number, which JSON cannot carry "
            "(it would be stored as null)"
        )
    return data
