"""``AsyncProducer``: the producer's verbs for asyncio trainers, on ``redis.asyncio``.

Reads and waits are native: any number of ``wait`` calls (``asyncio.gather`` of
thousands) share one task that follows the results stream, so they cost one
blocking connection, not one each. Writes that build RQ jobs (``enqueue``,
``update_resources``, dead-letter requeues) are one pipelined round trip each and
reuse the blocking :class:`Producer` on a thread (``asyncio.to_thread``), so there
is one implementation of the enqueue protocol. Close with ``await producer.aclose()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from rollq.models.contract import ResourcesUpdate, Rollout, Task
from rollq.models.errors import InvalidTaskError, RolloutTimeoutError, RolloutTrimmedError, UnknownTaskError
from rollq.models.policy import TaskState
from rollq.store.connection import connect, connect_async, process_client_name
from rollq.store.control import CancelResult, cancel_call, cancel_script_source, parse_cancel
from rollq.store.keys import DEFAULT_NAMESPACE, TaskField
from rollq.store.llm_gate import AsyncLLMGate, GateStatus, PauseReport
from rollq.store.payloads import aload_payloads, aloaded_one_by_one, missing_payload
from rollq.store.queries import (
    ATTEMPT_FIELDS,
    FILTER_FIELDS,
    SCAN_COUNT,
    AttemptInfo,
    TaskInfo,
    TaskPage,
    TaskPager,
    parse_attempts,
)
from rollq.store.records import RECORD_FIELDS, TaskRecord, parse_records_or_errors

from .batches import Batch, BatchReader
from .producer import Producer, checked_ids, checked_timeout
from .results import (
    REAP_EVERY_SECONDS,
    Delivered,
    HelpingReaper,
    WaitResult,
    default_consumer_name,
    entry_rollout_id,
    foreign_rollouts,
    parse_entry,
    result_ids_or_foreign,
)

log = logging.getLogger(__name__)


class _Follower:
    """One task reading the results stream and settling the futures of every waiting rollout id."""

    def __init__(self, producer: AsyncProducer) -> None:
        self.producer = producer
        self.waiters: dict[str, list[asyncio.Future[Rollout]]] = {}
        self.ready = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.stopping = False

    def ensure_running(self) -> None:
        if self.task is None or self.task.done():
            self.ready = asyncio.Event()
            self.stopping = False
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """End the task: it stops after its current read (a second at most). Cancelling alone is not enough:
        redis-py's asyncio client can take a cancel that lands in a blocking read for its read timeout and retry
        the command (the task then read on for ever)."""
        task = self.task
        if task is None or task.done():
            return
        self.stopping = True
        done, _ = await asyncio.wait({task}, timeout=3.0)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=3.0)
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("following the results stream ended with %r", task.exception())

    def add(self, rollout_id: str) -> asyncio.Future[Rollout]:
        future: asyncio.Future[Rollout] = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(rollout_id, []).append(future)
        return future

    def remove(self, rollout_id: str, future: asyncio.Future[Rollout]) -> None:
        futures = self.waiters.get(rollout_id, [])
        if future in futures:
            futures.remove(future)
        if not futures:
            self.waiters.pop(rollout_id, None)

    def settle(self, rollout_id: str, rollout: Rollout) -> None:
        for future in self.waiters.pop(rollout_id, []):
            if not future.done():
                future.set_result(rollout)

    async def _run(self) -> None:
        p = self.producer
        last = await p.connection.xrevrange(p.keys.results, count=1)
        cursor = last[0][0] if last else b"0-0"
        # Whatever is published from here on is read below; waiters read what came before from the records.
        self.ready.set()
        next_reap = time.monotonic() + REAP_EVERY_SECONDS
        helper = HelpingReaper(p.sync.lifecycle, p.sync.results_maxlen, "async wait", within=0)
        lost_track = False
        while not self.stopping:
            try:
                if lost_track:
                    # After an outage (a failover) the cursor may name an entry the new primary never had, and
                    # what it publishes can sort before it: start again from its newest entry, and settle the
                    # waiters whose rollouts were published meanwhile from their records.
                    last = await p.connection.xrevrange(p.keys.results, count=1)
                    cursor = last[0][0] if last else b"0-0"
                    lost_track = False
                    if self.waiters:
                        try:
                            found = await p.get_rollouts(list(self.waiters))
                        except RolloutTrimmedError:  # the waits' own record look-up reports it
                            found = {}
                        for rid, rollout in found.items():
                            self.settle(rid, rollout)
                reply: Any = await p.connection.xread({p.keys.results: cursor}, count=1000, block=1000)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a Redis outage: the client retried already; keep following
                log.warning("following the results stream failed (%s); retrying", exc)
                lost_track = True
                await asyncio.sleep(1.0)
                continue
            for _, entries in reply or []:
                ids = [entry_rollout_id(entry_id, fields) for entry_id, fields in entries]  # None: not rollq's
                wanted = [f for i, (_, f) in zip(ids, entries, strict=True) if i in self.waiters]
                try:
                    await aload_payloads(p.connection, wanted)
                except Exception as exc:  # as an outage above: the waits' record look-up finds them
                    log.warning("reading big rollouts failed (%s); retrying", exc)
                    lost_track = True
                    continue
                for rollout_id, (entry_id, fields) in zip(ids, entries, strict=True):
                    cursor = entry_id
                    if rollout_id is not None and rollout_id in self.waiters:
                        if missing_payload(fields) is not None:  # trimmed meanwhile: the records say how it ended
                            lost_track = True
                        else:
                            self.settle(rollout_id, parse_entry(fields))
            if self.waiters and time.monotonic() >= next_reap:
                # As the blocking wait does: a run with every worker gone still ends. Skipped while Redis refuses
                # writes; no failure of it may end this task (a refused reap did, and every wait then timed out).
                try:
                    await asyncio.to_thread(helper.reap)
                except Exception as exc:  # a Redis outage: the client retried already; reap at the next turn
                    log.warning("reaping failed (%s); reading on", exc)
                next_reap = time.monotonic() + REAP_EVERY_SECONDS


P = ParamSpec("P")
R = TypeVar("R")


def _on_a_thread(
    method: Callable[Concatenate[Producer, P], R],
) -> Callable[Concatenate[AsyncProducer, P], Coroutine[Any, Any, R]]:
    """``method`` of :class:`Producer` as a coroutine method of :class:`AsyncProducer`, with the same parameters:
    it runs on a worker thread (``asyncio.to_thread``), one round trip each."""

    @functools.wraps(method)
    async def on_a_thread(self: AsyncProducer, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(method, self.sync, *args, **kwargs)

    on_a_thread.__doc__ = f"See :meth:`Producer.{method.__name__}` (run on a worker thread)."
    return on_a_thread


def _batches_on_a_thread(
    method: Callable[Concatenate[Producer, P], BatchReader],
) -> Callable[Concatenate[AsyncProducer, P], AsyncIterator[Batch]]:
    """``Producer.batches`` as ``async for batch in producer.batches(16, max_staleness=1)``, with its parameters:
    the groups are assembled by the blocking reader on a worker thread (``asyncio.to_thread``), one batch at a
    time, so the event loop never waits on Redis."""

    @functools.wraps(method)
    async def batches(self: AsyncProducer, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Batch]:
        reader = method(self.sync, *args, **kwargs)
        try:
            while True:
                yield await asyncio.to_thread(reader.next_batch)
        finally:
            await asyncio.to_thread(reader.close)

    batches.__doc__ = _batches_on_a_thread.__doc__
    return batches


class AsyncProducer:
    """The :class:`Producer` verbs as coroutines, for one namespace.

    >>> async def main():
    ...     producer = AsyncProducer.from_url("redis://localhost:6379/0", namespace="runs")
    ...     tasks = await producer.enqueue_many([{"q": "2+2"}], mode="train")
    ...     result = await producer.wait([t.rollout_id for t in tasks], timeout=60, partial=True)
    ...     async for rollout in producer.rollouts(group="trainers", idle_timeout=5): ...
    ...     await producer.aclose()
    """

    def __init__(self, connection: Any, sync: Producer) -> None:
        self.connection = connection
        self.sync = sync
        self.keys = sync.keys
        self._cancel = connection.register_script(cancel_script_source())
        self._llm_gate = AsyncLLMGate(connection, sync.keys)
        self._follower: _Follower | None = None

    @classmethod
    def from_url(cls, url: str | None = None, namespace: str = DEFAULT_NAMESPACE, **kwargs: Any) -> AsyncProducer:
        """An async producer on ``url`` (same forms as :func:`rollq.store.connection.connect`, ``redis+sentinel://``
        and ``redis+cluster://`` included); ``kwargs`` go to :class:`Producer` (``policy``, ``wait_replicas``,
        ``wait_timeout_ms``, ...)."""
        name = process_client_name("async-producer")
        return cls(connect_async(url, client_name=name), Producer(connect(url, client_name=name), namespace, **kwargs))

    @property
    def namespace(self) -> str:
        return self.keys.namespace

    async def aclose(self) -> None:
        """Stop following the results stream and close the connections."""
        if self._follower is not None:
            await self._follower.stop()
        await self.connection.aclose()
        self.sync.connection.close()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- writes (one round trip each, on a thread) -------------------------------------

    # Producer's own signatures, one place for each parameter list: a misspelt keyword is a type error.
    enqueue = _on_a_thread(Producer.enqueue)
    enqueue_many = _on_a_thread(Producer.enqueue_many)

    async def update_resources(self, resources: Any) -> str:
        """See :meth:`Producer.update_resources`."""
        return await asyncio.to_thread(self.sync.update_resources, resources)

    async def pause_llm(self, timeout: float = 60.0, *, lease: float | None = None) -> PauseReport:
        """See :meth:`Producer.pause_llm`."""
        return await self._llm_gate.pause(checked_timeout(timeout), lease=lease)

    async def resume_llm(self) -> None:
        """See :meth:`Producer.resume_llm`."""
        await self._llm_gate.resume()

    async def llm_gate_status(self) -> GateStatus:
        """See :meth:`Producer.llm_gate_status`."""
        return await self._llm_gate.status()

    @contextlib.asynccontextmanager
    async def weight_sync(self, timeout: float = 60.0, *, lease: float | None = None) -> AsyncIterator[PauseReport]:
        """``async with producer.weight_sync(): ...``: see :meth:`Producer.weight_sync` (nested blocks included)."""
        if self.sync._weight_sync is not None:
            yield self.sync._weight_sync
            return
        try:
            report = await self.pause_llm(timeout, lease=lease)
        except BaseException:
            await self.resume_llm()
            raise
        self.sync._weight_sync = report
        try:
            yield report
        finally:
            self.sync._weight_sync = None
            await self.resume_llm()

    async def get_resources(self, resources_id: str | None = None) -> ResourcesUpdate:
        """See :meth:`Producer.get_resources`."""
        return await asyncio.to_thread(self.sync.get_resources, resources_id)

    async def requeue_dead(self, rollout_ids: Sequence[str] | None = None) -> list[str]:
        """See :meth:`Producer.requeue_dead`."""
        return await asyncio.to_thread(self.sync.requeue_dead, rollout_ids)

    # -- reads ---------------------------------------------------------------------------

    async def _records(self, rollout_ids: Sequence[str]) -> dict[str, TaskRecord]:
        pipe = self.connection.pipeline(transaction=False)
        for rid in rollout_ids:
            pipe.hmget(self.keys.task(rid), RECORD_FIELDS)
        values = await pipe.execute()
        return {rid: TaskRecord.parse(rid, v) for rid, v in zip(rollout_ids, values, strict=True) if v[0] is not None}

    async def _records_or_errors(
        self, rollout_ids: Sequence[str]
    ) -> tuple[dict[str, TaskRecord], dict[str, InvalidTaskError]]:
        """:func:`rollq.store.records.read_records_or_errors`, on asyncio."""
        pipe = self.connection.pipeline(transaction=False)
        for rid in rollout_ids:
            pipe.hmget(self.keys.task(rid), RECORD_FIELDS)
        return parse_records_or_errors(self.keys, rollout_ids, await pipe.execute(raise_on_error=False))

    async def _record(self, rollout_id: str) -> TaskRecord:
        records = await self._records([rollout_id])
        if rollout_id not in records:
            raise UnknownTaskError(rollout_id, self.namespace)
        return records[rollout_id]

    async def get_task(self, rollout_id: str) -> Task:
        """See :meth:`Producer.get_task`."""
        return (await self._record(rollout_id)).task

    async def task_info(self, rollout_id: str) -> TaskInfo:
        """See :meth:`Producer.task_info`."""
        return TaskInfo.from_record(await self._record(rollout_id))

    async def attempts(self, rollout_id: str) -> list[AttemptInfo]:
        """See :meth:`Producer.attempts`."""
        await self._record(rollout_id)
        fields = {k: v async for k, v in self.connection.hscan_iter(self.keys.task(rollout_id), match=ATTEMPT_FIELDS)}
        return parse_attempts(fields)

    async def get_rollouts(self, rollout_ids: Sequence[str]) -> dict[str, Rollout]:
        """See :meth:`Producer.get_rollouts`."""
        ids = list(rollout_ids)
        pipe = self.connection.pipeline(transaction=False)
        for rid in ids:
            pipe.hget(self.keys.task(rid), TaskField.RESULT)
        entry_ids, foreign = result_ids_or_foreign(ids, await pipe.execute(raise_on_error=False))
        found: dict[str, Rollout] = {}
        if foreign:  # task keys holding no hash: failed rollouts naming them (see foreign_rollout)
            pipe = self.connection.pipeline(transaction=False)
            for rid in foreign:
                pipe.type(self.keys.task(rid))
            found.update(foreign_rollouts(self.keys, foreign, await pipe.execute()))
        pipe = self.connection.pipeline(transaction=False)
        for eid in entry_ids.values():
            pipe.xrange(self.keys.results, min=eid, max=eid)
        replies = await pipe.execute()
        await aload_payloads(self.connection, [entries[0][1] for entries in replies if entries])
        for rid, entries in zip(entry_ids, replies, strict=True):
            if not entries or missing_payload(entries[0][1]) is not None:
                raise RolloutTrimmedError(rid)
            found[rid] = parse_entry(entries[0][1])
        return found

    async def get_rollout(self, rollout_id: str) -> Rollout | None:
        """See :meth:`Producer.get_rollout`."""
        found = (await self.get_rollouts([rollout_id])).get(rollout_id)
        if found is None:
            await self._record(rollout_id)
        return found

    async def query_tasks(
        self,
        state: TaskState | str | None = None,
        mode: str | None = None,
        *,
        limit: int = 100,
        cursor: str | None = None,
    ) -> TaskPage:
        """See :meth:`Producer.query_tasks` (same paging and the same SCAN cost)."""
        pager = TaskPager(self.keys, state, mode, limit, cursor)
        while not pager.done:
            after, raw_keys = await self.connection.scan(pager.scan, match=self.keys.task_pattern, count=SCAN_COUNT)
            rids = pager.ids(raw_keys)
            pipe = self.connection.pipeline(transaction=False)
            for rid in rids:
                pipe.hmget(self.keys.task(rid), FILTER_FIELDS)
            pager.add(after, rids, await pipe.execute(raise_on_error=False))
        return pager.page(*await self._records_or_errors(pager.found))

    async def cancel(self, rollout_ids: Sequence[str]) -> list[CancelResult]:
        """See :meth:`Producer.cancel`."""
        ids = list(rollout_ids)
        pipe = self.connection.pipeline(transaction=False)
        now = time.time()
        for rid in ids:
            keys, args = cancel_call(self.keys, rid, results_maxlen=self.sync.results_maxlen, now=now)
            await self._cancel(keys=keys, args=args, client=pipe)
        return [parse_cancel(rid, reply) for rid, reply in zip(ids, await pipe.execute(), strict=True)]

    # -- waiting -------------------------------------------------------------------------

    @overload
    async def wait(
        self, rollout_ids: Sequence[str], timeout: float, *, partial: Literal[False] = False
    ) -> list[Rollout]: ...

    @overload
    async def wait(self, rollout_ids: Sequence[str], timeout: float, *, partial: Literal[True]) -> WaitResult: ...

    async def wait(
        self, rollout_ids: Sequence[str], timeout: float, *, partial: bool = False
    ) -> list[Rollout] | WaitResult:
        """See :meth:`Producer.wait`; many concurrent waits share one reader of the results stream."""
        wanted = list(dict.fromkeys(checked_ids(rollout_ids)))
        checked_timeout(timeout)
        if self._follower is None:
            self._follower = _Follower(self)
        follower = self._follower
        follower.ensure_running()
        futures = {rid: follower.add(rid) for rid in wanted}
        try:
            await follower.ready.wait()
            for rid, rollout in (await self.get_rollouts(wanted)).items():
                follower.settle(rid, rollout)
            pending = [f for f in futures.values() if not f.done()]
            if pending:
                await asyncio.wait(pending, timeout=timeout)
        finally:
            for rid, future in futures.items():
                follower.remove(rid, future)
        finished = [futures[rid].result() for rid in wanted if futures[rid].done() and not futures[rid].cancelled()]
        missing = [rid for rid in wanted if not futures[rid].done()]
        if partial:
            return WaitResult(finished, missing)
        if missing:
            raise RolloutTimeoutError(missing, timeout)
        return finished

    # Producer.batches's own signature (see _batches_on_a_thread).
    batches = _batches_on_a_thread(Producer.batches)

    def rollouts(
        self,
        group: str = "trainers",
        consumer: str | None = None,
        *,
        idle_timeout: float | None = None,
        claim_idle_seconds: float = 60.0,
        batch: int = 100,
        start: str = "0",
        limit: int | None = None,
    ) -> AsyncIterator[Rollout]:
        """``async for rollout in producer.rollouts()``: see :meth:`Producer.rollouts` (same consumer-group rules,
        ``limit`` included)."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1 (None: no limit), not {limit}")
        return self._read_group(
            group,
            consumer or default_consumer_name(),
            idle_timeout,
            int(claim_idle_seconds * 1000),
            batch,
            start,
            limit,
        )

    async def _read_group(
        self,
        group: str,
        consumer: str,
        idle_timeout: float | None,
        claim_idle_ms: int,
        batch: int,
        start: str,
        limit: int | None,
    ) -> AsyncIterator[Rollout]:
        conn, stream = self.connection, self.keys.results
        handed = 0
        try:
            await conn.xgroup_create(stream, group, id=start, mkstream=True)
        except Exception as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        unacked: list[bytes] = []
        delivered = Delivered()  # a second copy of a run is acknowledged, not handed over (see Delivered)
        idle_since = time.monotonic()
        next_claim = 0.0
        try:
            while limit is None or handed < limit:
                if unacked:
                    await conn.xack(stream, group, *unacked)
                    unacked = []
                # With a limit, no read takes more than is left to hand over (see ResultReader).
                count = batch if limit is None else max(1, min(batch, limit - handed))
                mine: Any = await conn.xreadgroup(group, consumer, {stream: "0"}, count=count)
                entries = [e for _, es in mine or [] for e in es if e[1]]
                idle = idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout
                if not entries and (time.monotonic() >= next_claim or idle):
                    next_claim = time.monotonic() + claim_idle_ms / 4000
                    claimed: Any = await conn.xautoclaim(stream, group, consumer, claim_idle_ms, count=count)
                    entries = [e for e in claimed[1] if e[1]]
                if not entries and not idle:
                    block_s = 1.0 if idle_timeout is None else max(0.001, min(1.0, idle_timeout))
                    new: Any = await conn.xreadgroup(
                        group, consumer, {stream: ">"}, count=count, block=int(block_s * 1000)
                    )
                    entries = [e for _, es in new or [] for e in es]
                if not entries:
                    if idle:
                        return
                    continue
                idle_since = time.monotonic()
                # Big rollouts' payloads are read as the batch is handed over, a few at a time (rollq.store.payloads).
                loading = aloaded_one_by_one(conn, [fields for _, fields in entries])
                try:
                    for entry_id, _ in entries:
                        fields = await anext(loading)
                        unacked.append(entry_id)
                        if missing_payload(fields) is not None:
                            continue  # trimmed since it was delivered: counted for the group (see ResultReader)
                        rollout = parse_entry(fields)
                        if delivered.first(rollout):
                            handed += 1
                            yield rollout
                finally:
                    await loading.aclose()  # cancels a chunk still being read
        finally:
            if unacked:
                await conn.xack(stream, group, *unacked)
