"""``RolloutWorker``: an RQ worker that runs rollq tasks, many at once if asked.

Start it like any RQ worker, naming the rollq namespace as the queue::

    ROLLQ_AGENT=myproject.agents:MathAgent rq worker -w rollq.worker.RolloutWorker --url redis://host:6379 rollq

It differs from RQ's ``SimpleWorker`` in these ways:

- up to ``concurrency`` tasks run at once, each holding a slot (:mod:`.slots`); a job carries one task, or a
  pack of several (``tasks_per_job``, :mod:`.packs`).
  The main thread keeps RQ's loop (dequeue, maintenance, signals); each job's
  claim, publication and RQ start and end bookkeeping (started/finished
  registries, status, result) run in batches on two threads
  (:mod:`.rq_lifecycle`), and no thread waits while an agent runs;
- it refuses, without importing anything, any job that is not a rollq job, and
  always uses the JSON serializer; it never calls the job's function;
- attempts heartbeat and a reaper runs beside the loop (:mod:`worker.heartbeat`);
- it claims a task before RQ's start bookkeeping takes the job out of RQ's
  intermediate list, so that a worker dying at any point leaves its task where
  a reaper finds it;
- a job RQ cannot read (malformed hash) is moved to the namespace's quarantine
  list instead of ending the worker, at dequeue and at start-up clean-up;
- when an async agent blocks the event loop past the limit of every attempt on
  it, the worker hands its other rollouts back and exits with status 3
  (:data:`EXIT_LOOP_WEDGED`) for its supervisor to restart it;
- on the first SIGTERM/SIGINT it stops taking jobs, lets running rollouts finish
  for ``grace_seconds``, then hands the rest back to the queue; a second signal
  hands them back at once. Non-daemon threads an agent or a hook left running
  get until the end of that grace period, then the process exits without them
  with status 4 (:data:`EXIT_THREADS_LEFT`), naming them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import redis
from rq import worker_registration
from rq.exceptions import StopRequested
from rq.job import Job
from rq.logutils import setup_loghandlers
from rq.queue import Queue
from rq.registry import clean_registries
from rq.serializers import JSONSerializer
from rq.timeouts import BaseDeathPenalty
from rq.utils import get_version, now, utcformat
from rq.worker import SimpleWorker, WorkerStatus

from rollq.models.contract import Hook
from rollq.models.errors import InvalidTaskError
from rollq.store.connection import REFUSALS, describe_client, name_connections, wait_out_refusals
from rollq.store.eviction import warn_if_evicting
from rollq.store.jobs import (
    RollqJob,
    clean_worker_registry,
    cluster_worker_name,
    fence_worker,
    install_rq_fast_paths,
    read_rollq_jobs,
    rollout_ids_of,
    suspended,
)
from rollq.store.keys import DEFAULT_NAMESPACE, Keys
from rollq.store.llm_gate import GateReporter
from rollq.store.namespaces import namespace_hint
from rollq.store.packing import pack_big_values_uncopied
from rollq.store.resources import ResourceStore
from rollq.store.sizing import project_memory, warn_if_oversized
from rollq.store.stats import StatsField
from rollq.store.transitions import Lifecycle

from . import rq_url
from .al_tracing import connect_agentlightning
from .capture.gate import CallGate
from .capture.on_demand import OnDemandCapture
from .capture.pause import PauseFollower
from .collector import widen_young_generation
from .config import WorkerSettings
from .executor import AgentExecutor
from .faults import crash_point
from .foreign import as_lit_agent
from .heartbeat import Heartbeat
from .hooks import HookSet
from .loader import load_object
from .logs import reformat
from .resource_cache import ResourceCache
from .rq_lifecycle import RqLifecycle
from .runner import AgentRunner
from .slots import Slots
from .tracer import BaseTracer, OtelTracer

log = logging.getLogger(__name__)

# RQ's CLI imports this module (``-w rollq.worker.RolloutWorker``) before it builds its Redis client.
rq_url.lend_rollq_url_to_rq_cli()
rq_url.teach_rq_cli_rollq_urls()
rq_url.wait_for_redis_in_rq_cli()
install_rq_fast_paths()

WORKER_CONCURRENCY_FIELD = "rollq_concurrency"
"""Field rollq adds to RQ's worker hash: how many rollouts this worker runs at once."""

# The most jobs taken in one go; more would hold slots for a long pipeline.
_TAKE_AHEAD = 64
# The other commands a worker's connections may block in (the finish call's durability wait), which a stop must not
# cut short. Any other is the dequeue's pop (fakeredis's CLIENT LIST names no command: "auth" for all).
_KEEP_BLOCKED = frozenset({"wait", "waitaof"})
# How long the pubsub thread (RQ's, for `rq shutdown` and stop-job commands) waits between looks at its stop flag:
# the most an exiting worker waits for it (see subscribe).
PUBSUB_WAKE_SECONDS = 1.0
# The exit status of a worker whose agent event loop is wedged (see _on_loop_wedged): not 0, so that a
# supervisor restarts it.
EXIT_LOOP_WEDGED = 3
EXIT_THREADS_LEFT = 4
"""The exit status of a worker that stopped but had to leave without non-daemon threads an agent or a hook left
running (see _exit_despite_leftover_threads): not 0, so that a supervisor sees a process it had to force out (RQ's
own cold shutdown exits 0), and not 1 or 3, so that it tells this from a failed start or a wedged loop."""
LEFTOVER_THREADS_SECONDS = 1.0
"""At least this long, once the worker is done, for threads it did not start to end before the process exits."""


def _leftover_threads() -> list[threading.Thread]:
    """Non-daemon threads still running besides the main thread and this one: Python waits for each before the
    process exits."""
    main, current = threading.main_thread(), threading.current_thread()
    return [t for t in threading.enumerate() if not t.daemon and t.is_alive() and t is not main and t is not current]


def _exit_despite_leftover_threads(deadline: float, log: logging.Logger) -> None:
    """Once the main thread is done, let non-daemon threads left behind (an agent's or a hook's: a forgotten
    executor, a library's background thread) run until ``deadline`` (``time.monotonic()``; at least
    :data:`LEFTOVER_THREADS_SECONDS`), then exit the process without waiting for them, naming them.

    Python waits for every non-daemon thread before a process exits, and nothing can stop a thread from outside:
    one that never ends kept a stopped worker alive for good. Only called once the worker has stopped (its tasks
    published or handed back, itself unregistered); still, the process did not end as asked (those threads die
    mid-work), so leaving them is an exit with :data:`EXIT_THREADS_LEFT`, logged naming them. Threads that end in
    time leave the exit status to the interpreter (0 for a clean stop)."""

    def watch() -> None:
        threading.main_thread().join()  # returns as the interpreter starts to shut down and join the others
        until = max(deadline, time.monotonic() + LEFTOVER_THREADS_SECONDS)
        for thread in _leftover_threads():
            thread.join(max(0.0, until - time.monotonic()))
        left = _leftover_threads()
        if not left:
            return
        names = ", ".join(t.name for t in left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
        log.error(
            "%d non-daemon thread(s) the agent or a hook left running did not end by the end of the grace period; "
            "exiting with status %d without waiting for them: %s",
            len(left),
            EXIT_THREADS_LEFT,
            names,
        )
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_THREADS_LEFT)

    threading.Thread(target=watch, name="rollq-exit", daemon=True).start()


class _NoDeathPenalty(BaseDeathPenalty):
    """rollq enforces each attempt's time limit itself; RQ's signal- or timer-based kill is off.

    SIGALRM only works on the main thread, and a timer thread per job would
    double the threads at high concurrency.
    """

    def setup_death_penalty(self) -> None:
        pass

    def cancel_death_penalty(self) -> None:
        pass


class RolloutWorker(SimpleWorker):
    """An RQ worker for one rollq namespace (its single queue)."""

    death_penalty_class = _NoDeathPenalty

    def __init__(
        self,
        queues: str | Queue | Sequence[str] | Sequence[Queue],
        *args: Any,
        settings: WorkerSettings | None = None,
        agent: Any = None,
        hooks: Sequence[Hook] | None = None,
        tracer: BaseTracer | None = None,
        honour_rollq_url: bool = True,
        **kwargs: Any,
    ) -> None:
        try:
            self._configure(
                queues,
                *args,
                settings=settings,
                agent=agent,
                hooks=hooks,
                tracer=tracer,
                honour_rollq_url=honour_rollq_url,
                **kwargs,
            )
        except (ValueError, TypeError) as exc:
            if not rq_url.in_rq_cli():
                raise
            # RQ's CLI prints any setup error with a traceback; a configuration mistake is one line.
            logging.getLogger("rq.worker").error("rollq: %s", " ".join(str(exc).split()))
            raise SystemExit(1) from None

    def _configure(
        self,
        queues: str | Queue | Sequence[str] | Sequence[Queue],
        *args: Any,
        settings: WorkerSettings | None,
        agent: Any,
        hooks: Sequence[Hook] | None,
        tracer: BaseTracer | None,
        honour_rollq_url: bool,
        **kwargs: Any,
    ) -> None:
        kwargs["serializer"] = JSONSerializer
        # RQ's registry clean-up, failure handling and dequeue load jobs with this class: it never imports a
        # callback, function or webhook a job hash names (see store.jobs.RollqJob).
        kwargs["job_class"] = RollqJob
        given = kwargs.get("connection")
        if given is not None and honour_rollq_url:
            kwargs["connection"] = rq_url.honour_rollq_url(given)
            if kwargs["connection"] is not given:  # the queues RQ's CLI built are bound to the other client
                listed: list[Any] = [queues] if isinstance(queues, str | Queue) else list(queues)
                queues = [q.name if isinstance(q, Queue) else str(q) for q in listed]
        named: list[Any] = [queues] if isinstance(queues, str | Queue) else list(queues)
        first = named[0].name if named and isinstance(named[0], Queue) else str(named[0]) if named else ""
        if first.startswith("{"):  # a cluster namespace: its worker's keys carry its tag (see store.keys)
            kwargs["name"] = cluster_worker_name(first, kwargs.get("name") or (args[0] if args else None))
            args = args[1:]
        super().__init__(queues, *args, **kwargs)
        # RQ names one connection after the worker (CLIENT SETNAME, to find its address); every other one the
        # worker's threads open gets the same name, so CLIENT LIST counts a worker's connections under the name
        # `rq info` shows (the bound: docs/scaling.md, tests/store/test_connection_bound.py).
        name_connections(self.connection, self.name)
        # Before RQ's start-up writes (register_birth): a worker started into a full Redis waits for memory, as a
        # running one does, instead of dying on the first refused HSET.
        wait_out_refusals(self.connection)
        pack_big_values_uncopied(self.connection)  # the finish call carries the rollout's JSON
        if len(self.queues) != 1:
            raise ValueError("a RolloutWorker serves one rollq namespace: name exactly one queue")
        # `rq worker` builds its Queue objects (and their registries' job class) before the worker.
        for queue in self.queues:
            queue.job_class = RollqJob
        self.keys = Keys(self.queues[0].name)
        if self.keys.clustered:
            fence_worker(self, self.keys.rq_queues(), self.keys.rq_workers)
        if rq_url.in_rq_cli() and self.keys.queue_name == "default" and "default" not in sys.argv[1:]:
            logging.getLogger("rq.worker").warning(
                "rollq: no queue name given, so RQ serves its queue 'default' (rollq namespace 'default'); the "
                "queue name is the rollq namespace: end the command with one, e.g. `... %s` for rollq's default",
                DEFAULT_NAMESPACE,
            )
        self.settings = settings or WorkerSettings.from_env()
        # RQ's CLI has installed its log handlers by now; switch them before the first line is written.
        reformat(self.settings.log_format, "rq.worker", "rollq")
        # rollq jobs carry no result TTL of their own, so this decides for all of them.
        self.default_result_ttl = self.settings.result_ttl
        if agent is None:
            if not self.settings.agent:
                raise ValueError("no agent configured: set ROLLQ_AGENT=package.module:AgentClass or pass --agent")
            agent = load_object(self.settings.agent)
        self.agent = as_lit_agent(agent)
        self.hook_set = HookSet(
            hooks if hooks is not None else [load_object(h) for h in self.settings.hooks],
            budget_seconds=self.settings.hook_budget_seconds,
        )
        self.tracer = tracer
        self.worker_id: int | None = None
        self.runner: AgentRunner | None = None
        self._heartbeat: Heartbeat | None = None
        self._executor = AgentExecutor(on_wedged=self._on_loop_wedged)
        self._capture: OnDemandCapture | None = None
        self._pause: PauseFollower | None = None
        self.slots = Slots(self.settings.concurrency)
        # Slots taken before each dequeue: a job may be a pack of up to tasks_per_job tasks, one slot each (a pack
        # larger than the concurrency takes them all and runs alone; see execute_job and docs/rq.md, "Packs").
        self._per_job = min(self.settings.tasks_per_job, self.settings.concurrency)
        self._held: dict[str, int] = {}  # slots each dequeued job not started yet holds, by job id
        self.rq_lifecycle: RqLifecycle | None = None
        self._dequeuing = False
        self._taken: deque[tuple[Job, Queue]] = deque()  # dequeued with a slot held, not started yet
        self._force_stop = False
        self._loop_wedged = False
        self._next_suspension_check = 0.0
        self._refusals_reported = (REFUSALS.episodes, REFUSALS.refused_seconds)
        self._registered = False  # from RQ's register_birth to its register_death (see _keep_registered)
        self._register_pending = False  # a lost registration noticed, not yet written again

    @property
    def dequeue_timeout(self) -> int:
        # Short blocking pops keep maintenance and heartbeats regular while rollouts run.
        return min(super().dequeue_timeout, 5)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        # RQ installs its SIGTERM/SIGINT handlers only once the start-up is over; until then a signal would kill
        # the process on the spot (Python's default), after it has registered and reported to the LLM gate. Note
        # the request instead: the loop's first check stops the worker, through teardown like any other stop.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._stop_after_start)
        super().bootstrap(*args, **kwargs)
        hint = namespace_hint(self.connection, self.keys)
        if hint:
            self.log.warning("%s (this worker waits for tasks in %r)", hint, self.keys.namespace)
        # The client RQ builds from --url gives up at once when Redis is away, and RQ's
        # loop quits on most such errors; a worker should wait for Redis to come back.
        wait_out_refusals(self.connection)
        # RQ 2.12's work() passes logging_level=None unless --logging_level or --quiet was given: "rollq" then had no
        # level of its own and inherited the root's WARNING, so none of rollq's INFO lines reached a worker's log.
        level = (args[0] if args else kwargs.get("logging_level")) or "INFO"
        for name in ("rollq",):
            setup_loghandlers(level, name=name)
        reformat(self.settings.log_format, "rq.worker", "rollq")
        self.worker_id = int(self.connection.incr(self.keys.worker_seq))
        warn_if_evicting(self.connection, f"worker {self.name}")
        # The rollouts a worker holds outlive Python's default young collections (see .collector).
        widen_young_generation()
        lifecycle = Lifecycle(
            self.connection,
            self.keys,
            results_max_bytes=self.settings.results_max_bytes,
            wait_replicas=self.settings.wait_replicas,
            wait_timeout_ms=self.settings.wait_timeout_ms,
        )
        try:
            warn_if_oversized(
                project_memory(
                    self.connection,
                    self.keys,
                    keep_seconds=self.settings.keep_seconds,
                    result_ttl=self.settings.result_ttl,
                    results_max_bytes=self.settings.results_max_bytes,
                    concurrency=self.settings.concurrency,
                )
            )
        except redis.RedisError as exc:  # a projection is advice: never a reason not to start
            log.info("no memory projection: %s", exc)
        self._executor.start()
        self._capture = None
        if self.settings.capture_llm:
            # The proxy (and aiohttp) starts with the first attempt that has an LLM endpoint: a worker without one
            # never imports it. Its gate follows the weight-sync pauses from here on, before the first job: a
            # worker that starts during a pause honours it, and so does a proxy started later.
            gate = CallGate(self.settings.llm_pause_wait_seconds)
            self._capture = OnDemandCapture(
                gate=gate,
                switch_interval=self.settings.capture_switch_interval_ms / 1000 or None,
                loop=self._executor.loop if self.settings.capture_on_agent_loop else None,
                in_memory=self.settings.capture_in_memory,
                agents_loop=self._executor.loop if self.settings.capture_in_memory_on_agent_loop else None,
                agents_lag=lambda: self._executor.lag,
                agents_busy_lag=self.settings.capture_agent_loop_busy_ms / 1000,
            )
            if self.settings.capture_on_agent_loop:
                self._executor.stall_note = (
                    "; the capturing proxy runs on this loop, so an LLM call made that way waits for its client's"
                    " timeout (ROLLQ_CAPTURE_ON_AGENT_LOOP=0 gives the proxy a thread of its own)"
                )
            # Agents that build their OpenAI client from OPENAI_BASE_URL / OPENAI_API_BASE are captured too: when
            # either is set, the proxy starts now, so the variables point at it before any agent reads them.
            self._capture.serve_environment(self.settings.concurrency)
            reporter = GateReporter(self.connection, self.keys, self.name, self.settings.heartbeat_seconds)
            self._pause = PauseFollower(reporter, gate, listen=self.settings.llm_gate_listen)
            self._pause.start()
        self.runner = AgentRunner(
            lifecycle=lifecycle,
            resources=ResourceCache(ResourceStore(self.connection, self.keys)),
            agent=self.agent,
            hooks=self.hook_set,
            tracer=self.tracer or OtelTracer(),
            executor=self._executor,
            settings=self.settings,
            worker_name=self.name,
            capture=self._capture,
        )
        self.runner.worker_id = self.worker_id
        self.rq_lifecycle = RqLifecycle(self, self.runner, self.slots)
        self.tracer = self.runner.tracer  # an Agent Lightning agent's ``tracer`` is ``trainer.tracer``
        provider = getattr(self.tracer, "provider", None)
        if provider is not None:  # AgentOps' and Agent Lightning's reward APIs write to rollq's tracer
            connect_agentlightning(provider)
        self.agent.set_trainer(self)
        self.agent.set_runner(self.runner)
        # rollq has no parent process over its workers: each worker process is the "main" of
        # ParallelWorkerBase, so init() runs here, right before init_worker(), and teardown() after
        # teardown_worker() when the worker stops. run() has no meaning for a hook and is not called.
        self.hook_set.init()
        self.hook_set.init_worker(self.worker_id)
        self._heartbeat = Heartbeat(
            lifecycle,
            self.runner.heartbeat_members,
            interval=self.settings.heartbeat_seconds,
            results_maxlen=self.settings.results_maxlen,
            on_beat=self._on_beat,
            on_lost=self.runner.abandon,
            piggyback=self._pause.queue if self._pause is not None else None,
        )
        self._heartbeat.start()
        self.log.info("rollq worker %s: Redis at %s", self.name, describe_client(self.connection))
        # Beside RQ's own fields, so monitoring can show in-flight against capacity; gone with the worker key.
        self.connection.hset(self.key, WORKER_CONCURRENCY_FIELD, self.settings.concurrency)
        self.log.info(
            "rollq worker %s (id %d): agent %s, %d hook(s), concurrency %d, namespace %r",
            self.name,
            self.worker_id,
            type(self.agent).__name__,
            len(self.hook_set.hooks),
            self.settings.concurrency,
            self.keys.namespace,
        )

    def _on_beat(self) -> None:
        """Each beat of rollq's heartbeat thread: keep the worker's RQ records alive and listed, report refusals."""
        try:
            self._keep_registered()
        finally:
            self._report_refusals()

    def register_birth(self) -> None:
        super().register_birth()
        self._registered = True

    def register_death(self) -> None:
        self._registered = False  # a beat after this would list a stopped worker again
        super().register_death()

    def _keep_registered(self) -> None:
        """Heartbeat the worker key while rollouts run, and put the worker back in RQ's registry if Redis lost it.

        The main thread heartbeats the worker key only between dequeues; while it waits for a free slot, this keeps
        the worker visible. RQ writes its registry (``rq:workers`` and the queue's worker set, which ``Worker.all``,
        ``rollq status`` and ``/metrics`` read) only at the worker's start: after a Redis restart without
        persistence (or a flush) a running worker was missing from it for good, "0 alive" while it ran tasks. The
        SADDs of an existing member and the HSETNX of an existing ``birth`` write nothing; one that writes says the
        registration was gone, and RQ's birth fields are written again (:meth:`_register_again`)."""
        if not self._registered:
            return
        pipe = self.connection.pipeline(transaction=False)
        recent = self.last_heartbeat is not None and (now() - self.last_heartbeat).total_seconds() < 1.0
        if self.slots.busy and not recent:
            self.heartbeat(pipeline=pipe)
        checks = len(pipe)
        worker_registration.register(self, pipe)
        pipe.hsetnx(self.key, "birth", utcformat(self.birth_date or now()))
        if any(pipe.execute()[checks:]) or self._register_pending:
            # Until it is written: the SADDs and HSETNX that noticed the loss wrote, so the next beat's would not.
            self._register_pending = True
            self._register_again()
            self._register_pending = False

    def _register_again(self) -> None:
        """RQ's ``register_birth`` writes again, with the worker's first birth date (it is the same worker), and
        rollq's concurrency field: a hash the heartbeat's HSETs recreated held only the fields they write."""
        self.last_heartbeat = now()
        self.birth_date = self.birth_date or self.last_heartbeat
        pipe = self.connection.pipeline(transaction=False)
        pipe.hset(
            self.key,
            mapping={**self.serialize(), "state": self._state, WORKER_CONCURRENCY_FIELD: self.settings.concurrency},
        )
        worker_registration.register(self, pipe)
        pipe.expire(self.key, self.worker_ttl + 60)
        pipe.execute()
        self.log.warning(
            "worker %s re-registered with RQ: its registration was gone from Redis (a restart without persistence, "
            "a flush, an eviction); `rollq status` and RQ list it again",
            self.name,
        )

    def _report_refusals(self) -> None:
        """Count the times this process waited out Redis refusing commands (OOM, READONLY...) in the stats hash,
        once Redis accepts writes again, for ``rollq status`` and ``/metrics``."""
        episodes, seconds = REFUSALS.episodes, REFUSALS.refused_seconds
        if episodes > self._refusals_reported[0]:
            pipe = self.connection.pipeline(transaction=False)
            pipe.hincrby(self.keys.stats, StatsField.REDIS_REFUSALS, episodes - self._refusals_reported[0])
            pipe.hincrbyfloat(self.keys.stats, StatsField.REDIS_REFUSED_SECONDS, seconds - self._refusals_reported[1])
            pipe.execute()
            self._refusals_reported = (episodes, seconds)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        # RQ refreshes the worker key up to four times per job, two round trips
        # each; at hundreds of jobs a second, once a second is plenty for a key
        # that lives worker_ttl + 60 seconds.
        recent = self.last_heartbeat is not None and (now() - self.last_heartbeat).total_seconds() < 1.0
        if pipeline is None and timeout is None and recent:
            return
        super().heartbeat(timeout, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        # One EXISTS per dequeue otherwise; `rq suspend` still takes effect within a second.
        if time.monotonic() < self._next_suspension_check:
            return
        self._next_suspension_check = time.monotonic() + 1.0
        if not self.keys.clustered:
            super().check_for_suspension(burst)
            return
        # RQ's own reads rq:suspended in a MULTI with this worker's key: a cluster namespace has a flag of its own.
        before = None
        while not self._stop_requested and suspended(self, self.keys.rq_suspended):
            if burst:
                raise StopRequested
            if before is None:
                self.log.info("Worker %s: suspended (%s is set)", self.name, self.keys.rq_suspended)
                before = self.get_state()
                self.set_state(WorkerStatus.SUSPENDED)
            time.sleep(1)
        if before is not None:
            self.set_state(before)

    def set_current_job_id(self, job_id: str | None = None, pipeline: Any = None) -> None:
        # RQ shows one current job per worker and clears it when a job ends; with
        # others still running, show one of those instead of an idle worker.
        if job_id is None:
            job_id = self.slots.oldest_running()
        super().set_current_job_id(job_id, pipeline)

    def set_state(self, state: str, pipeline: Any = None) -> None:
        # RQ marks the worker idle before every dequeue; with rollouts still running it is not.
        if state == WorkerStatus.IDLE and self.slots.busy:
            state = WorkerStatus.BUSY
        if pipeline is None and state == self._state:
            return  # already so in Redis: saves a round trip per dequeue while rollouts run
        super().set_state(state, pipeline=pipeline)

    def get_state(self) -> str:
        # RQ decides between "stop after the current job" and "stop now" by this.
        return WorkerStatus.BUSY if self.slots.busy else super().get_state()

    def subscribe(self) -> None:
        # RQ's own, with the pubsub thread waking each second instead of each minute. RQ's unsubscribe relies on the
        # UNSUBSCRIBE reply to wake the thread and bounds its join to 1 s; redis-py 8.2's PubSubWorkerThread.stop()
        # joins with no bound, so a thread that read the reply before stop() cleared its flag held the exiting worker
        # for up to 60 s (tests/worker/test_worker_exit.py). A wait of 1 s costs a timed-out poll, no Redis command.
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ types it by its None
            sleep_time=PUBSUB_WAKE_SECONDS, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    def _stop_after_start(self, signum: int, frame: Any) -> None:
        if self._stop_requested:  # a second signal: RQ's cold shutdown, as once started
            self.request_force_stop(signum, frame)
            return
        self.log.info("Worker %s [PID %d]: warm shut down requested while starting", self.name, self.pid)
        self._stop_requested = True

    def request_stop(self, signum: int, frame: Any) -> None:
        # RQ raises StopRequested in whatever the main thread runs when it is not busy; a handler on the way that
        # catches Exception (RQ's registry clean-up is one) would swallow it. The flag is seen at the loop's top.
        self._stop_requested = True
        if not self._dequeuing:
            super().request_stop(signum, frame)
            return
        # The main thread waits for work, most likely inside the blocking pop. Raising there would drop the pop's
        # reply: a job Redis handed over at that instant would sit in RQ's intermediate list until the reaper's
        # stranded-job pass (30 s and more). Let the pop return instead, at once (CLIENT UNBLOCK from another
        # thread): the dequeue gives back a job it brought, and the loop stops at its next check (see
        # should_run_maintenance_tasks).
        with contextlib.suppress(StopRequested):
            super().request_stop(signum, frame)
        threading.Thread(target=self._unblock_dequeue, name="rollq-unblock", daemon=True).start()

    def _unblock_dequeue(self) -> None:
        """End this worker's blocking pop early, as a timeout would (its connections carry the worker's name)."""
        deadline = time.monotonic() + self.dequeue_timeout + 1
        while self._dequeuing and time.monotonic() < deadline:
            try:
                for client in self.connection.client_list():
                    if client.get("name") == self.name and client.get("cmd") not in _KEEP_BLOCKED:
                        self.connection.client_unblock(int(client["id"]))
            except redis.RedisError as exc:  # the pop then ends at its own timeout
                self.log.debug("could not unblock the dequeue: %s", exc)
                return
            time.sleep(0.1)

    @property
    def should_run_maintenance_tasks(self) -> bool:
        # Read at the top of each pass of RQ's dequeue loop, between two blocking pops, where no reply is pending:
        # the safe point to end a dequeue that a stop request let run on (see request_stop).
        if self._stop_requested and self._dequeuing and threading.current_thread() is threading.main_thread():
            raise StopRequested()
        return bool(super().should_run_maintenance_tasks)

    def request_force_stop(self, signum: int, frame: Any) -> None:
        self._force_stop = True
        super().request_force_stop(signum, frame)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        if self._taken:
            return self._taken.popleft()
        # Take the slots before taking a job, so a job never waits inside a busy worker.
        self._dequeuing = True
        try:
            if not self._take_slots(self._per_job):
                return None
            if self._stop_requested:
                self.slots.free(self._per_job)
                return None
            try:
                result = self._dequeue_well_formed(timeout, max_idle_time)
            except BaseException:
                self.slots.free(self._per_job)
                raise
            if result is None:
                self.slots.free(self._per_job)
                return None
            self._held[result[0].id] = self._per_job
            if self._stop_requested:  # brought back by a pop that a stop request let finish: not started here
                self._taken.appendleft(result)
                self._give_back_taken()
                return None
            self._take_ahead(result[1])
            return result
        finally:
            self._dequeuing = False

    def _take_slots(self, count: int) -> bool:
        """Take ``count`` slots, waiting for them; False (holding none) when a stop request came first."""
        held = 0
        while held < count:
            if self.slots.take(timeout=1.0):
                held += 1
            elif self._stop_requested:
                if held:
                    self.slots.free(held)
                return False
        return True

    def _dequeue_well_formed(self, timeout: int | None, max_idle_time: int | None) -> tuple[Job, Queue] | None:
        """RQ's dequeue, moving aside any job RQ cannot read (bad status, created_at, dependency_ids) instead of
        letting it end the worker's loop, which would leave it in the intermediate list for the next worker."""
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except Exception as exc:
                job_id = getattr(exc, "job_id", None)
                if job_id is None:
                    raise
                self._quarantine(job_id, f"RQ cannot read it: {type(exc).__name__}: {exc}")

    def _quarantine(self, job_id: str, reason: str) -> None:
        # Also called from RQ's bootstrap, before this worker's runner exists.
        lifecycle = self.runner.lifecycle if self.runner is not None else Lifecycle(self.connection, self.keys)
        for source in (self.keys.rq_intermediate, self.keys.rq_queue):
            try:
                moved = lifecycle.quarantine(source, job_id)
            except redis.ResponseError as exc:
                # A quarantine list of another type (quarantine.lua names it, nothing moved): the job stays where it
                # is, behind the jobs this worker takes next, and the worker lives on.
                self.log.error("could not move job %s aside (%s): %s", job_id, reason, exc)
                return
            if moved:
                self.log.error("moved job %s to the quarantine list %s: %s", job_id, self.keys.quarantine, reason)
                return

    def clean_registries(self) -> None:
        # RQ's start-up and maintenance clean-up reads every job in the intermediate list with Job.fetch, which
        # raises on a malformed hash: one such entry would make every worker die at start. Move those aside first.
        ids = [j.decode() for j in cast(list[bytes], self.connection.lrange(self.keys.rq_intermediate, 0, -1))]
        for job_id, job in read_rollq_jobs(self.connection, ids).items():
            if isinstance(job, InvalidTaskError):
                self._quarantine(job_id, str(job))
        try:
            if self.keys.clustered:
                self._clean_cluster_registries()
            else:
                super().clean_registries()
        except StopRequested:  # a stop signal arrived meanwhile: RQ's loop ends on it
            raise
        except Exception:
            self.log.exception("RQ's registry clean-up failed; carrying on")

    def run_maintenance_tasks(self) -> None:
        if self._stop_requested:  # stopped while starting: no clean-up pass first (it can take seconds)
            return
        if not self.keys.clustered:
            super().run_maintenance_tasks()
            return
        # RQ 2.12's also cleans job groups, listed in the global rq:groups (another slot's key); rollq makes none.
        if self.last_cleaned_at and self.scheduler:
            if not self.scheduler._process or not self.scheduler._process.is_alive():
                self.scheduler.acquire_locks(auto_start=True)
        self.clean_registries()

    def _clean_cluster_registries(self) -> None:
        """RQ's ``clean_registries`` with the namespace's own set of workers (see store.jobs.clean_worker_registry)."""
        for queue in self.queues:
            if queue.acquire_maintenance_lock():
                clean_registries(queue, self._exc_handlers)
                clean_worker_registry(queue, self.keys.rq_workers)
                queue.intermediate_queue.cleanup(self, queue)
                queue.release_maintenance_lock()
        self.last_cleaned_at = now()  # type: ignore[assignment]

    def _take_ahead(self, queue: Queue) -> None:
        """Take as many more jobs as there are free slots, in two round trips instead of one dequeue each.

        With hundreds of rollouts in flight, one dequeue per job left slots
        empty while tasks waited in the queue. Jobs move to RQ's intermediate
        list as RQ's own dequeue moves them, so a worker killed now leaves them
        where the reaper puts stranded jobs back.
        """
        per_job = self._per_job
        free = 0
        while free < _TAKE_AHEAD * per_job and self.slots.take(blocking=False):
            free += 1
        if free % per_job:  # whole jobs' worth of slots only
            self.slots.free(free % per_job)
            free -= free % per_job
        if not free:
            return
        try:
            pipe = self.connection.pipeline(transaction=False)
            reliable = get_version(self.connection) >= (6, 2, 0)  # the test RQ's dequeue makes
            for _ in range(free // per_job):
                if reliable:
                    pipe.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")
                else:
                    pipe.lpop(queue.key)
            job_ids = [raw.decode() for raw in pipe.execute() if raw]
            read = read_rollq_jobs(self.connection, job_ids) if job_ids else {}
        except Exception as exc:
            self.slots.free(free)
            self.log.warning("could not take jobs ahead (%s); taking them one by one", exc)
            return
        taken = []
        for job_id, job in read.items():
            if isinstance(job, Job):
                taken.append((job, queue))
                self._held[job.id] = per_job
            elif isinstance(job, InvalidTaskError):
                self._quarantine(job_id, str(job))
        self._taken.extend(taken)
        if free > len(taken) * per_job:
            self.slots.free(free - len(taken) * per_job)

    def _give_back_taken(self) -> None:
        """Put jobs taken ahead but not started back at the head of their queue."""
        if not self._taken:
            return
        pipe = self.connection.pipeline(transaction=False)
        for job, queue in reversed(self._taken):
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            pipe.lpush(queue.key, job.id)
        pipe.execute()
        self.log.info("put %d job(s) taken ahead back on the queue", len(self._taken))
        self.slots.free(sum(self._held.pop(job.id, 1) for job, _ in self._taken))
        self._taken.clear()

    def execute_job(self, job: Job, queue: Queue) -> None:
        crash_point("dequeued")
        if self._loop_wedged:
            # Dequeued while this worker hands its rollouts back before exiting: nothing could run it here.
            self._taken.appendleft((job, queue))
            self._give_back_taken()
            return
        try:
            rollout_ids = rollout_ids_of(job)
        except InvalidTaskError as exc:
            self._refuse(job, queue, exc)
            self.slots.free(self._held.pop(job.id, 1))
            return
        # A pack holds one slot per task, at most the whole concurrency (a larger pack runs alone). Usually it
        # holds those already (tasks_per_job the producers'); a shorter one gives the rest back, a longer one (a
        # producer with a larger tasks_per_job) goes back to the queue.
        held, need = self._held.pop(job.id, 1), min(len(rollout_ids), self.slots.capacity)
        if held > need:
            self.slots.free(held - need)
        elif held < need:
            self._put_back_larger_pack(job, queue, held, need)
            return
        assert self.rq_lifecycle is not None
        self.rq_lifecycle.start(job, queue, rollout_ids, need)

    def _put_back_larger_pack(self, job: Job, queue: Queue, held: int, need: int) -> None:
        """A pack that needs more slots than it was dequeued with (a producer's tasks_per_job larger than this
        worker's) goes back to the head of the queue, with the jobs taken ahead behind it, and this worker takes
        ``need`` slots before each dequeue from now on.

        Waiting for the slots instead, with the pack off the queue, left it in RQ's intermediate list for as long as
        rollouts here ran: past the stranded-job grace a reaper pushed it back while this worker was about to start
        it, and RQ recorded the job twice (claims kept the tasks to one run each). Slots that only the jobs taken
        ahead hold would never have come at all. Taken before the next dequeue, they are waited for with no job
        held, and a worker with free slots meanwhile takes the pack."""
        if need > self._per_job:
            self.log.warning(
                "job %s is a pack of %d tasks but this worker took %d slot(s) per job (its tasks_per_job): put it "
                "back on the queue; this worker now takes %d slots before each dequeue (give producers and workers "
                "the same tasks_per_job)",
                job.id,
                need,
                self._per_job,
                need,
            )
            self._per_job = need
        self._held[job.id] = held
        self._taken.appendleft((job, queue))
        self._give_back_taken()

    def _on_loop_wedged(self, blocker: str, stalled_for: float) -> None:
        """The agent event loop has been blocked past the time limit of every attempt it held: no async rollout
        can finish here any more. Hand the others back and exit non-zero, so that a supervisor restarts the
        worker (a thread cannot be stopped from outside; only a new process frees the loop)."""
        self.log.error(
            "the agent event loop has been blocked for %.0fs by rollout %s, past every running attempt's time "
            "limit: handing the other rollouts back and exiting with status %d",
            stalled_for,
            blocker,
            EXIT_LOOP_WEDGED,
        )
        self._loop_wedged = True
        self._stop_requested = True
        runner = self.runner  # the main thread may be tearing down meanwhile
        if runner is not None:
            self.log.warning("handing %d unfinished rollout(s) back to the queue", runner.release_all())
        deadline = time.monotonic() + 15
        while self.slots.busy and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            self.register_death()
        except Exception as exc:
            self.log.warning("could not unregister the worker: %s", exc)
        logging.shutdown()
        os._exit(EXIT_LOOP_WEDGED)

    def _refuse(self, job: Job, queue: Queue, error: InvalidTaskError) -> None:
        self.log.error("refused job %s from queue %s: %s", job.id, queue.name, error)
        with self.connection.pipeline() as pipe:
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            pipe.execute()
        self.handle_job_failure(job, queue, exc_string=f"{type(error).__name__}: {error}")

    def teardown(self) -> None:
        deadline = time.monotonic() + self.settings.grace_seconds
        if self.runner is not None:
            self._give_back_taken()
            self._drain()
            if self._heartbeat is not None:
                self._heartbeat.stop()
            if self.worker_id is not None:
                self.hook_set.teardown_worker(self.worker_id)
                self.hook_set.teardown()
            if self._pause is not None:
                self._pause.stop()
            if self._capture is not None:
                self._capture.stop()  # before the agents' loop stops: a proxy served on it closes on it
            self._executor.stop()
            if self.rq_lifecycle is not None:
                self.rq_lifecycle.shutdown()
                self.rq_lifecycle = None
            self.runner = None
        super().teardown()
        if self._loop_wedged:
            # The main loop saw the stop request before the watchdog thread finished handing back: exit as it
            # would (the agent loop's thread is stuck for good; a clean exit status would hide that).
            logging.shutdown()
            os._exit(EXIT_LOOP_WEDGED)
        if threading.current_thread() is threading.main_thread() and _leftover_threads():
            _exit_despite_leftover_threads(deadline, self.log)

    def _drain(self) -> None:
        """Let running rollouts finish for ``grace_seconds`` (a second signal cuts it short); hand back the rest."""
        assert self.runner is not None
        on_main = threading.current_thread() is threading.main_thread()
        previous: dict[signal.Signals, Any] = {}
        if on_main:

            def force(signum: int, frame: Any) -> None:
                self._force_stop = True

            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, force)
        try:
            if self.slots.busy:
                self.log.info(
                    "waiting up to %.0fs for %d rollout(s) in flight", self.settings.grace_seconds, self.slots.busy
                )
            deadline = time.monotonic() + self.settings.grace_seconds
            while self.slots.busy and not self._force_stop and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.slots.busy:
                released = self.runner.release_all()
                self.log.warning("handing %d unfinished rollout(s) back to the queue", released)
                deadline = time.monotonic() + 30
                while self.slots.busy and time.monotonic() < deadline:
                    time.sleep(0.05)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
