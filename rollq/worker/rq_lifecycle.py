"""Each rollq job's start and end in RQ's terms, for many jobs at once (RQ 2.12's per-job bookkeeping, batched).

RQ's ``perform_job`` holds a thread for the whole job, and its bookkeeping costs three to four round trips
per job. rollq splits a job in two halves, each run in batches on one thread (:class:`~.bookkeeping.Batcher`):
the claims and RQ's start bookkeeping of every job started since the last batch go in one pipeline, the agents
run on the executor, and as their futures settle the publications go in one pipeline and RQ's end bookkeeping
of the batch in another. So two threads serve any number of rollouts, and round trips per rollout fall as the
load rises.

What RQ would write is written, mostly with RQ's own calls (pinned in ``tests/worker/test_rq_contract.py``; that
the Redis state matches a stock RQ worker's is ``tests/worker/test_rq_state_diff.py``), less the commands that
write nothing new (a second HSET of the same fields, an EXPIRE of a key a rollq job never has; issue 24):

- start (:meth:`RqLifecycle._rq_start`): RQ 2.12's ``prepare_execution`` + ``prepare_job_execution``:
  ``Execution.create`` (started registry), ``Job.prepare_for_execution``, and the job leaves RQ's intermediate
  list; the worker-wide writes (current job, working time, heartbeat, state) once per batch;
- end (:meth:`RqLifecycle._rq_end`): RQ 2.12's ``handle_job_success`` / ``handle_job_failure``: the body of
  ``Job._handle_success`` (saved hash, result, finished registry) or the failed status + ``Job._handle_failure``
  (failed registry), ``Execution.delete``; the worker's counters and working time once per batch.

Every task ends here exactly once and frees its slot then (see :mod:`.slots`); a job's RQ end is written
when its last task ended (:mod:`.packs`).
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import Any

import redis
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.results import Result
from rq.utils import now, utcformat
from rq.worker import BaseWorker, WorkerStatus

from rollq.store.jobs import JobRegistries, RollqJob
from rollq.store.replies import Claim, FinishReply
from rollq.store.scripts import replied

from .attempt import Publication
from .bookkeeping import Batcher
from .faults import armed, crash_point
from .packs import Pack, TaskEnd, failure_text, logged_failure, pack_outcome
from .runner import AgentRunner, AttemptResult, AttemptStatus, Pending
from .slots import Slots

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """A dequeued job waiting for its tasks' claims and RQ's start bookkeeping."""

    pack: Pack


@dataclass(frozen=True)
class Done:
    """A task whose agent has settled: its attempt waits to be published."""

    pack: Pack
    pending: Pending


@dataclass(frozen=True)
class Ended:
    """A task whose attempt is over: its pack records ``result``, or ``error`` (a rollq fault)."""

    pack: Pack
    rollout_id: str
    result: AttemptResult | None = None
    error: str | None = None


class RqLifecycle:
    """Starts and ends ``worker``'s jobs in batches: claims and publications via ``runner``, RQ's bookkeeping
    with the worker's own RQ methods, a slot of ``slots`` freed as each task ends.

    A job carries one task or a pack of several (:mod:`.packs`): each task is claimed, run and published on its
    own; RQ's start bookkeeping is written once per job, its end once its last task ended."""

    def __init__(self, worker: BaseWorker, runner: AgentRunner, slots: Slots) -> None:
        self.worker = worker
        self.runner = runner
        self.slots = slots
        self._starts: Batcher[Start] = Batcher("rollq-start", self._start_batch)
        self._finishes: Batcher[Done] = Batcher("rollq-finish", self._finish_batch)
        self._registries: dict[str, JobRegistries] = {}  # by queue name

    def start(self, job: Job, queue: Queue, rollout_ids: list[str], slots: int = 1) -> None:
        """Start ``job``'s tasks (``rollout_ids``; the job holding ``slots`` slots) in the next start batch; each
        ends, and frees its slot, in a later one."""
        self.slots.started(job.id, len(rollout_ids))
        self._starts.put(Start(Pack(job, queue, rollout_ids, slots)))

    def shutdown(self) -> None:
        """Let both batch threads handle what is queued, then end."""
        self._starts.shutdown()
        self._finishes.shutdown()

    def _start_batch(self, starts: list[Start]) -> None:
        """Claim each job's tasks and do RQ's start bookkeeping of each job, in one pipeline; then launch the agents.

        The claims come first in the pipeline: each moves its task from ``queued`` (its job still in RQ's
        intermediate list, where reapers look) to ``running`` with a heartbeat deadline (where reapers look
        too); RQ's start bookkeeping after them takes the job out of the intermediate list. Redis runs a
        pipeline's commands in order, and the claims of a batch are one script call, so a worker dying at any
        point leaves each task where a reaper finds it (a pack's tasks all queued, or all running).
        """
        runner, worker = self.runner, self.worker
        tasks = [(start.pack, rollout_id) for start in starts for rollout_id in start.pack.rollout_ids]
        try:
            # One claim call for the whole batch (one EVALSHA, TIME and GET of the latest resources: issue 24).
            calls = [runner.lifecycle.claim_many_call([(rid, pack.job.id) for pack, rid in tasks], worker.name)]
            if armed("claimed"):  # test-only: the state of a pipeline cut short after its claims
                runner.lifecycle.run_pipelined(calls)
                crash_point("claimed")
            pipe = worker.connection.pipeline(transaction=False)
            for call in calls:
                call.queue(pipe)
            for start in starts:
                start.pack.execution = self._rq_start(start.pack.job, start.pack.queue, pipe)
            self._worker_busy(starts[0].pack.job, pipe)
            waits = runner.lifecycle.queue_wait(pipe)  # the claims reach the replicas before any agent starts
            replies = pipe.execute(raise_on_error=False)
            (settled,) = runner.lifecycle.settle_all(
                calls, replies[: len(calls)], acknowledged=replies[-1] if waits else None
            )
            claimed: list[Any]
            try:
                claimed = list(runner.lifecycle.read_claims(replied(settled)))
                if len(claimed) != len(tasks):
                    raise ValueError(f"claim.lua answered {len(claimed)} replies for {len(tasks)} claims")
            except Exception as exc:  # the call failed as a whole: every claim of it did
                claimed = [exc] * len(tasks)
        except BaseException:
            error = traceback.format_exc()
            self._end_tasks([Ended(pack, rid, error=error) for pack, rid in tasks])
            return
        crash_point("rq-started")
        ended: list[Ended] = []
        # Every claim is heartbeated from here (runner.claimed), before any start hook runs: the hooks of a
        # batch run one after another, and a slow one must not make the claims behind it look unresponsive.
        answers: list[Claim | AttemptResult | str] = []
        for (pack, rollout_id), reply in zip(tasks, claimed, strict=True):
            if isinstance(reply, redis.ResponseError):
                # Redis refused the claim (claim.lua names a damaged key, nothing written: the task stays queued):
                # its words are the job's failure; a traceback of redis-py's reply parsing, per job, said nothing more.
                answers.append(f"{type(reply).__name__}: {reply}\n")
                continue
            try:
                answers.append(runner.claimed(rollout_id, pack.job.id, replied(reply)))
            except BaseException:
                answers.append(traceback.format_exc())
        for (pack, rollout_id), claim in zip(tasks, answers, strict=True):
            try:
                if isinstance(claim, str):
                    ended.append(Ended(pack, rollout_id, error=claim))
                    continue
                outcome = claim if isinstance(claim, AttemptResult) else runner.launch(rollout_id, claim, pack.job.id)
            except BaseException:
                ended.append(Ended(pack, rollout_id, error=traceback.format_exc()))
                continue
            if isinstance(outcome, AttemptResult):
                ended.append(Ended(pack, rollout_id, result=outcome))
                continue
            crash_point("agent-started")
            self._finish_when_settled(Done(pack, outcome))
        if ended:
            self._end_tasks(ended)

    def _finish_when_settled(self, done: Done) -> None:
        finishes = self._finishes
        done.pending.future.add_done_callback(lambda _: finishes.put(done))

    def _worker_busy(self, job: Job, pipe: Any) -> None:
        """RQ 2.12's worker-wide start writes, once per batch: ``set_current_job_id``,
        ``set_current_job_working_time(0)``, ``heartbeat`` and ``set_state(BUSY)``, whose four HSETs of the worker
        hash go as one (issue 24); the worker's own attributes are set as those methods set them."""
        worker = self.worker
        worker.current_job_working_time = 0
        worker.last_heartbeat = now()
        worker._state = WorkerStatus.BUSY
        pipe.hset(
            worker.key,
            mapping={
                "current_job": job.id,
                "current_job_working_time": 0,
                "last_heartbeat": utcformat(worker.last_heartbeat),
                "state": WorkerStatus.BUSY,
            },
        )
        pipe.expire(worker.key, worker.get_heartbeat_ttl(job))

    def _rq_start(self, job: Job, queue: Queue, pipe: Any) -> Execution:
        """RQ's start-of-job bookkeeping (``prepare_execution`` and ``prepare_job_execution`` of RQ 2.12, minus
        the worker-wide writes done once per batch), queued on ``pipe``; returns the job's RQ Execution."""
        worker = self.worker
        self._share_registries(job)
        ttl = worker.get_heartbeat_ttl(job)
        execution = Execution.create(job, ttl, pipeline=pipe, worker_name=worker.name)
        # RQ calls Job.heartbeat here too, an HSET of last_heartbeat that prepare_for_execution's HSET writes again
        # in the same breath: one command a job less (issue 24).
        job.prepare_for_execution(worker.name, pipeline=pipe)
        pipe.lrem(queue.intermediate_queue_key, 1, job.id)
        return execution

    def _share_registries(self, job: Job) -> None:
        """Give ``job`` its queue's registries built once (:class:`~rollq.store.jobs.JobRegistries`) for RQ's
        bookkeeping calls to use, instead of three new ones per job."""
        if not isinstance(job, RollqJob):
            return
        shared = self._registries.get(job.origin)
        if shared is None or not shared.serve(job):
            shared = self._registries[job.origin] = JobRegistries.of(job)
        job.shared_registries = shared

    def _finish_batch(self, done: list[Done]) -> None:
        """Publish the rollouts of attempts that have settled, in one pipeline, then end their jobs."""
        runner = self.runner
        ended: list[Ended] = []
        publishing: list[tuple[Done, Publication]] = []
        for item in done:
            rollout_id = item.pending.task.rollout_id
            try:
                outcome = runner.conclude(item.pending)
            except BaseException:
                ended.append(Ended(item.pack, rollout_id, error=traceback.format_exc()))
                continue
            if isinstance(outcome, AttemptResult):
                ended.append(Ended(item.pack, rollout_id, result=outcome))
            else:
                publishing.append((item, outcome))
        if publishing:
            # One finish call for the whole batch (one EVALSHA, the results stream's trim and each stats counter
            # once: issue 24); a part of it that failed answers with its own error, the others stand.
            lifecycle = runner.lifecycle
            replies: list[FinishReply | BaseException]
            try:
                (raw,) = lifecycle.run_pipelined([lifecycle.finish_many_call([p.finish for _, p in publishing])])
                replies = list(lifecycle.read_finishes(replied(raw)))
                if len(replies) != len(publishing):
                    raise ValueError(f"finish.lua answered {len(replies)} replies for {len(publishing)} rollouts")
            except BaseException as exc:
                replies = [exc] * len(publishing)
            for (item, publication), reply in zip(publishing, replies, strict=True):
                rollout_id = item.pending.task.rollout_id
                try:
                    ended.append(Ended(item.pack, rollout_id, result=runner.settle(publication, reply)))
                except BaseException:
                    ended.append(Ended(item.pack, rollout_id, error=traceback.format_exc()))
        self._end_tasks(ended)

    def _end_tasks(self, ended: list[Ended]) -> None:
        """Record the end of each task of ``ended`` with its pack, then RQ's end-of-job bookkeeping (status,
        finished/failed registry, result, worker stats) of each job whose last task that was, in one pipeline;
        then free the tasks' slots.

        RQ's own ``handle_job_success`` costs two round trips more per job (a WATCH on the job's dependents
        and a SMEMBERS of them): rollq jobs never have dependents, so neither is needed here.
        """
        worker = self.worker
        freed = 0
        over: list[Pack] = []
        for item in ended:
            slots, last = item.pack.task_ended(TaskEnd(item.rollout_id, item.result, item.error))
            freed += slots
            if last:
                over.append(item.pack)
        try:
            if over:
                finished_at = now()
                still_running = self.slots.leaving([pack.job.id for pack in over])
                pipe = worker.connection.pipeline(transaction=False)
                tally = _Tally()
                for pack in over:
                    pack.job.ended_at = finished_at
                    self._rq_end(pack, pipe, tally)
                tally.queue(worker.key, pipe)
                worker.set_current_job_id(still_running, pipeline=pipe)
                pipe.execute()
        except Exception:
            worker.log.exception("RQ bookkeeping of %d job(s) failed", len(over))
        finally:
            if self.slots.ended(len(ended), freed):
                try:
                    worker.set_state(WorkerStatus.IDLE)
                except Exception as exc:
                    worker.log.debug("could not mark the worker idle: %s", exc)

    def _rq_end(self, pack: Pack, pipe: Any, tally: _Tally) -> None:
        """One job's part of RQ's end bookkeeping (``handle_job_success``/``handle_job_failure`` of RQ 2.12), less
        the commands that write nothing new for a rollq job (issue 24):

        - ``Job._handle_success`` sets the status with an HSET of its own, then saves the whole hash, status
          included, with another: the save's is enough; a failed job's status and meta go in one HSET;
        - ``Job.cleanup`` also EXPIREs the job's dependents and dependencies sets, which a rollq job never has
          (rollq drops RQ's dependents handling already, see :meth:`_end_tasks`);
        - the worker's counters and working time are added once per batch (``tally``), not once per job.

        A job of one task records that task's outcome; a pack's reads as :func:`~.packs.pack_outcome` says.
        """
        worker = self.worker
        job, execution = pack.job, pack.execution
        value: Any
        if pack.single:
            (end,) = pack.ends
            result, error = end.result, end.error
            meta = record_outcome(job, result, error)
            if error is None and result is not None and result.status == AttemptStatus.FAILED:
                # A failed rollout is a failed job for RQ too: its failed registry, `rq info`
                # and rq-dashboard count it, and the job page shows the error.
                error = failure_text(result)
            value = result.to_json() if result is not None else None
        else:
            value, error, meta = pack_outcome(job, pack.ends)
        started = job.started_at or job.ended_at
        execution_id = execution.id if execution is not None else None
        execution_started_at = execution.created_at if execution is not None else None
        if error is None:
            job._result = value
            job._status = JobStatus.FINISHED
            tally.succeeded += 1
            result_ttl = job.get_result_ttl(worker.default_result_ttl)
            if result_ttl != 0:
                # Job._handle_success of RQ 2.12 without its set_status: the save's HSET carries the status.
                job.save(pipeline=pipe, include_meta=False, include_result=False)
                Result.create(
                    job,
                    Result.Type.SUCCESSFUL,
                    return_value=job._result,
                    ttl=result_ttl,
                    worker_name=worker.name,
                    pipeline=pipe,
                    execution_id=execution_id,
                    execution_started_at=execution_started_at,
                    execution_ended_at=job.ended_at,
                )
                job.finished_job_registry.add(job, result_ttl, pipe)
            if result_ttl == 0:
                job.cleanup(result_ttl, pipeline=pipe, remove_from_queue=False)
            elif result_ttl is not None and result_ttl > 0:
                pipe.expire(job.key, result_ttl)  # Job.cleanup's, without the sets a rollq job has none of
            worker.log.info("job %s: %s", job.id, job.description)
        else:
            # A failed rollout's traceback was logged when its attempt failed (with the rollout id and this job's):
            # the job's failure in one line here, the traceback only in RQ's record of it (rq-dashboard's job page).
            worker.log.error("job %s failed: %s", job.id, logged_failure(pack.ends))
            job._status = JobStatus.FAILED
            # Job.set_status and Job.save_meta of RQ 2.12 in one HSET.
            pipe.hset(job.key, mapping={"status": JobStatus.FAILED, **({"meta": meta} if meta is not None else {})})
            job._handle_failure(
                error,
                pipeline=pipe,
                worker_name=worker.name,
                execution_id=execution_id,
                execution_started_at=execution_started_at,
                execution_ended_at=job.ended_at,
            )
            tally.failed += 1
        if started is not None and job.ended_at is not None:
            tally.working_seconds += (job.ended_at - started).total_seconds()
        if execution is not None:
            execution.delete(job=job, pipeline=pipe)


@dataclass
class _Tally:
    """A batch's additions to the RQ worker hash's counters (RQ 2.12's ``increment_successful_job_count``,
    ``increment_failed_job_count`` and ``increment_total_working_time`` add per job)."""

    succeeded: int = 0
    failed: int = 0
    working_seconds: float = 0.0

    def queue(self, worker_key: str, pipe: Any) -> None:
        if self.succeeded:
            pipe.hincrby(worker_key, "successful_job_count", self.succeeded)
        if self.failed:
            pipe.hincrby(worker_key, "failed_job_count", self.failed)
        if self.succeeded or self.failed:
            pipe.hincrbyfloat(worker_key, "total_working_time", self.working_seconds)


def record_outcome(job: Job, result: AttemptResult | None, error: str | None) -> bytes | str | None:
    """Show the rollout's outcome on the job's page: in its description always, in its meta when it failed.

    The description is saved with the job by RQ's own bookkeeping (no extra command) and job lists show it;
    a finished job's result already holds the whole outcome, so only a failed job, whose result RQ replaces
    by the error, keeps it (status, attempt, error, input) in its meta. Returns the serialised meta to write
    (with the failed status, see :meth:`RqLifecycle._rq_end`), or None.
    """
    if result is not None:
        job.description = (
            f"{job.description or 'rollout ' + result.rollout_id}: {result.status.value}"
            + (f", attempt {result.attempt}" if result.attempt else "")
            + (f", reward {result.reward:g}" if result.reward is not None else "")
        )
        if result.status != AttemptStatus.FAILED:
            return None
        job.meta["rollout"] = {k: v for k, v in result.to_json().items() if k != "rollout_id"}
    elif error is not None:
        job.meta["rollout"] = {"status": "error", "error": error.strip().splitlines()[-1] if error.strip() else ""}
    else:
        return None
    return job.serializer.dumps(job.meta)  # what Job.save_meta() of RQ 2.12 writes
