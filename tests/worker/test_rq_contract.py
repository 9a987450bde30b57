"""Pins every RQ name rollq overrides, calls or reads beyond RQ's documented API.

rollq's RQ contact is fenced in two modules: ``store/jobs.py`` (the job hash format and RQ's key names, used by
producers and reapers) and ``worker/rq_worker.py`` (the RolloutWorker subclass). An RQ upgrade that changes one of
these signatures or attributes fails here, at install time, instead of in a running worker. Parameters are
compared by name, kind and default (annotations may change spelling between releases without harm).

When an RQ upgrade changes one: read the new RQ code path, adapt the fenced module, then update the entry here.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import fakeredis
import pytest
import rq
import rq.worker_registration
from rq.queue import Queue
from rq.worker import SimpleWorker

from rollq.store.jobs import RollqJob

# name -> parameters as "name=default", "*args", "**kwargs", "*" before keyword-only ones.
PINNED: dict[str, str] = {
    "rq.worker.Worker.__init__": (
        "self, queues, name=None, default_result_ttl=500, connection=None, exception_handlers=None,"
        " maintenance_interval=600, default_worker_ttl=None, worker_ttl=None, job_class=None, queue_class=None,"
        " log_job_description=True, job_monitoring_interval=30, disable_default_exception_handler=False,"
        " prepare_for_work=True, serializer=None, work_horse_killed_handler=None"
    ),
    "rq.worker.Worker.bootstrap": (
        "self, logging_level='INFO', date_format='%H:%M:%S', log_format='%(asctime)s %(message)s'"
    ),
    "rq.worker.Worker.heartbeat": "self, timeout=None, pipeline=None",
    "rq.worker.Worker.check_for_suspension": "self, burst",
    "rq.worker.Worker.set_current_job_id": "self, job_id=None, pipeline=None",
    "rq.worker.Worker.set_state": "self, state, pipeline=None",
    "rq.worker.Worker.get_state": "self",
    "rq.worker.Worker.request_stop": "self, signum, frame",
    "rq.worker.Worker.request_force_stop": "self, signum, frame",
    "rq.worker.Worker.dequeue_job_and_maintain_ttl": "self, timeout, max_idle_time=None",
    "rq.worker.SimpleWorker.execute_job": "self, job, queue",
    "rq.worker.Worker.teardown": "self",
    # RolloutWorker.subscribe is RQ's with a shorter wait: it sets these, and RQ's unsubscribe reads them.
    "rq.worker.Worker.subscribe": "self",
    "rq.worker.Worker.unsubscribe": "self",
    "rq.worker.Worker.handle_payload": "self, message",
    "rq.worker.Worker._pubsub_exception_handler": "self, exc, pubsub, pubsub_thread",
    "rq.worker.Worker.clean_registries": "self",
    "rq.worker.Worker.register_death": "self",
    "rq.worker.Worker.handle_job_failure": "self, job, queue, started_job_registry=None, exc_string=''",
    # RolloutWorker does RQ's start and end bookkeeping of many jobs in one pipeline with these (it replaces
    # prepare_execution, prepare_job_execution and handle_job_success/failure, whose bodies it follows).
    "rq.executions.Execution.create": "job, ttl, pipeline, worker_name=''",
    "rq.executions.Execution.delete": "self, job, pipeline",
    "rq.job.Job.prepare_for_execution": "self, worker_name, pipeline",
    # Not called (prepare_for_execution's HSET writes the same last_heartbeat), and _handle_success's body is
    # followed, not called (issue 24): pinned so that a change in either is read before rq_lifecycle goes on
    # skipping or following it.
    "rq.job.Job.heartbeat": "self, timestamp, ttl, pipeline=None, xx=False",
    "rq.job.Job._handle_success": (
        "self, result_ttl, pipeline, worker_name='', execution_id=None, execution_started_at=None,"
        " execution_ended_at=None"
    ),
    "rq.job.Job._handle_failure": (
        "self, exc_string, pipeline, worker_name='', execution_id=None, execution_started_at=None,"
        " execution_ended_at=None"
    ),
    "rq.job.Job.cleanup": "self, ttl=None, pipeline=None, remove_from_queue=True",
    "rq.job.Job.get_result_ttl": "self, default_ttl",
    # The body of Job._handle_success, less its set_status (the save's HSET carries the status; issue 24).
    "rq.job.Job.save": "self, pipeline=None, include_meta=True, include_result=True",
    "rq.results.Result.create": (
        "job, type, ttl, return_value=None, exc_string=None, worker_name='', pipeline=None, execution_id=None,"
        " execution_started_at=None, execution_ended_at=None"
    ),
    "rq.registry.FinishedJobRegistry.add": "self, job, ttl=0, pipeline=None, xx=False",
    "rq.worker.Worker.set_current_job_working_time": "self, current_job_working_time, pipeline=None",
    "rq.worker.Worker.get_heartbeat_ttl": "self, job",
    "rq.worker.Worker.work": (
        "self, burst=False, logging_level=None, date_format='%H:%M:%S', log_format='%(asctime)s %(message)s',"
        " max_jobs=None, max_idle_time=None, with_scheduler=False,"
        " dequeue_strategy=<DequeueStrategy.DEFAULT: 'default'>"
    ),
    "rq.timeouts.BaseDeathPenalty.setup_death_penalty": "self",
    "rq.timeouts.BaseDeathPenalty.cancel_death_penalty": "self",
    "rq.job.Job.create": (
        "func, args=None, kwargs=None, connection=None, result_ttl=None, ttl=None, status=None, description=None,"
        " depends_on=None, timeout=None, retry=None, id=None, origin='', meta=None, failure_ttl=None, serializer=None,"
        " group_id=None, *, on_success=None, on_failure=None, on_stopped=None, webhooks=None"
    ),
    "rq.job.Job.to_dict": "self, include_meta=True, include_result=True",
    "rq.job.Job.fetch_many": "job_ids, connection, serializer=None",
    "rq.job.Job.__init__": "self, id=None, connection=None, serializer=None",
    "rq.job.Job.key_for": "job_id",
    "rq.job.Job.restore": "self, raw_data",
    "rq.job.Job.get_status": "self, refresh=True",
    "rq.intermediate_queue.IntermediateQueue.get_intermediate_queue_key": "queue_key",
    "rq.utils.get_version": "connection",
    # rq_url wraps CliConfig.connection so that RQ's CLI takes redis+sentinel:// URLs (see docs/rq.md).
    "rq.cli.helpers.CliConfig.__init__": (
        "self, url=None, config=None, worker_class='rq.Worker', job_class='rq.job.Job',"
        " death_penalty_class='rq.timeouts.UnixSignalDeathPenalty', queue_class='rq.Queue',"
        " connection_class='redis.Redis', path=None, *args, **kwargs"
    ),
    "rq.cli.helpers.read_config_file": "module",
    # The Redis Cluster fence (store/jobs.py, worker/rq_worker.py, worker/rq_url.py; docs/scaling.md): RQ's
    # maintenance and registry clean-up redone with a namespace's own set of workers, the CLI's suspension check.
    "rq.worker.Worker.run_maintenance_tasks": "self",
    "rq.registry.clean_registries": "queue, exception_handlers=None",
    "rq.worker_registration.clean_worker_registry": "queue",
    "rq.cli.workers.is_suspended": "connection, worker=None",
    "rq.queue.Queue.acquire_maintenance_lock": "self",
    "rq.queue.Queue.release_maintenance_lock": "self",
    "rq.intermediate_queue.IntermediateQueue.cleanup": "self, worker, queue",
    # rollq.store.rq_workers.ListedWorker: a listed worker leaves its connection's socket timeout alone.
    "rq.worker.Worker._set_connection": "self, connection",
    "rq.logutils.setup_loghandlers": (
        "level=None, date_format='%H:%M:%S', log_format='%(asctime)s %(message)s', name='rq.worker'"
    ),
}

# Attributes rollq reads or sets: on classes, and on a worker instance (set by RQ's __init__).
CLASS_ATTRIBUTES = [
    (Queue, "redis_queue_namespace_prefix"),
    (Queue, "redis_queues_keys"),
    (Queue, "job_class"),
    (rq.job.Job, "redis_job_namespace_prefix"),
    (SimpleWorker, "dequeue_timeout"),
    (rq.job.Job, "dependency_ids"),
    (rq.worker.Worker, "redis_workers_keys"),
    # A property RQ's dequeue loop reads between two blocking pops: RolloutWorker stops there after a stop request
    # that let a pop finish (test_faults.py, the SIGTERM tests).
    (rq.worker.Worker, "should_run_maintenance_tasks"),
    (rq.worker_registration, "WORKERS_BY_QUEUE_KEY"),
]
# RollqJob replaces these properties (RQ imports the names they read); they must still be what RQ calls.
JOB_PROPERTIES = [
    "func",
    "success_callback",
    "failure_callback",
    "stopped_callback",
    "started_job_registry",
    "finished_job_registry",
    "failed_job_registry",
]
# ... and reads these, set by RQ's Job constructor and restore().
JOB_ATTRIBUTES = ["_success_callback_name", "_failure_callback_name", "_stopped_callback_name", "webhooks"]
WORKER_ATTRIBUTES = [
    "pubsub_channel_name",
    "pubsub",
    "pubsub_thread",
    "execution",
    "_stop_requested",
    "_state",
    "last_heartbeat",
    "current_job_working_time",
    "default_result_ttl",
    "queues",
    "log",
    "job_class",
]


def _resolve(name: str) -> Any:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    for attribute in parts[i:]:
        obj = getattr(obj, attribute)
    return obj


def render(fn: Any) -> str:
    """A signature as parameter names, kinds and defaults only."""
    out: list[str] = []
    star_done = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append(f"*{p.name}")
            star_done = True
        elif p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}")
        else:
            if p.kind is p.KEYWORD_ONLY and not star_done:
                out.append("*")
                star_done = True
            out.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return ", ".join(out)


def test_rq_is_the_major_version_rollq_was_built_against() -> None:
    assert rq.__version__.split(".")[0] == "2", "RQ 3 changed perform_job/handle_job_* signatures: see docs/rq.md"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_rq_signature_rollq_relies_on_is_unchanged(name: str) -> None:
    assert render(_resolve(name)) == PINNED[name]


@pytest.mark.parametrize(("cls", "attribute"), CLASS_ATTRIBUTES, ids=lambda v: getattr(v, "__name__", v))
def test_rq_class_attribute_rollq_reads_exists(cls: type, attribute: str) -> None:
    assert hasattr(cls, attribute)


def test_rq_worker_attributes_rollq_reads_are_set_by_its_constructor() -> None:
    worker = SimpleWorker(["q"], connection=fakeredis.FakeRedis())
    missing = [a for a in WORKER_ATTRIBUTES if not hasattr(worker, a)]
    assert not missing


def test_rq_worker_start_writes_exactly_the_fields_rollq_sends_in_one_hset() -> None:
    # RqLifecycle._worker_busy writes these four worker hash fields in one HSET (issue 24), where RQ's
    # set_current_job_id, set_current_job_working_time, heartbeat and set_state send one HSET each.
    connection = fakeredis.FakeRedis()
    worker = SimpleWorker(["q"], connection=connection)
    worker.set_current_job_id("j")
    worker.set_current_job_working_time(0)
    worker.heartbeat(90)
    worker.set_state("busy")
    assert set(connection.hkeys(worker.key)) == {
        b"current_job",
        b"current_job_working_time",
        b"last_heartbeat",
        b"state",
    }


def test_rq_cli_config_connection_is_a_property_reading_what_rq_url_reads() -> None:
    from rq.cli.helpers import CliConfig

    assert isinstance(inspect.getattr_static(CliConfig, "connection"), property)
    config = CliConfig(url="redis://h:1/0", config=None)
    assert (config.url, config.config, config._connection, config.connection_class.__name__) == (
        "redis://h:1/0",
        None,
        None,
        "Redis",
    )


@pytest.mark.parametrize("name", JOB_PROPERTIES)
def test_rq_job_property_rollq_closes_is_still_a_property(name: str) -> None:
    assert isinstance(rq.job.Job.__dict__.get(name), property)


def test_rq_job_attributes_rollq_reads_are_set_by_its_constructor() -> None:
    job = rq.job.Job(connection=fakeredis.FakeRedis())
    assert [a for a in JOB_ATTRIBUTES if not hasattr(job, a)] == []


def test_render_notices_a_changed_default() -> None:
    def before(self: Any, job: Any, remove_from_intermediate_queue: bool = False) -> None: ...
    def after(self: Any, job: Any, remove_from_intermediate_queue: bool = True) -> None: ...

    assert render(before) != render(after)


def test_rq_refuses_a_cluster_namespaces_job_id_that_rollq_job_keeps() -> None:
    # RollqJob sets RQ's private _id itself for ids that start with a hash tag: if RQ starts accepting them, or
    # stops storing the id in _id, the fence is no longer needed or no longer works.
    with pytest.raises(ValueError):
        rq.job.Job(id="{ns}abc", connection=fakeredis.FakeRedis())
    job = RollqJob(id="{ns}abc", connection=fakeredis.FakeRedis())
    assert (job.id, job._id, job.key) == ("{ns}abc", "{ns}abc", "rq:job:{ns}abc")


def test_rq_job_and_result_call_the_helpers_rollq_gives_fast_paths_by_their_module_names() -> None:
    # rollq.worker.rq_worker replaces rq.job's resolve_serializer, str_to_date and utcformat and rq.results's
    # resolve_serializer (store.jobs.install_rq_fast_paths): RQ must still look them up there at call time.
    import rq.results

    import rollq.worker.rq_worker  # noqa: F401  (installs the fast paths)

    for module, caller, name in (
        (rq.job, rq.job.Job.__init__, "resolve_serializer"),
        (rq.results, rq.results.Result.__init__, "resolve_serializer"),
        (rq.job, rq.job.Job.restore, "str_to_date"),
        (rq.job, rq.job.Job.to_dict, "utcformat"),
        (rq.job, rq.job.Job.prepare_for_execution, "utcformat"),
    ):
        assert getattr(getattr(module, name), "rollq_fast_path", False), (module, name)
        assert name in caller.__code__.co_names, (caller, name)


def test_the_json_serializer_resolves_to_itself_and_any_other_as_rq_resolves_it() -> None:
    import rq.serializers

    import rollq.worker.rq_worker  # noqa: F401  (installs the fast paths)

    connection = fakeredis.FakeRedis()
    assert rq.serializers.resolve_serializer(rq.serializers.JSONSerializer) is rq.serializers.JSONSerializer
    assert RollqJob(connection=connection, serializer=rq.serializers.JSONSerializer).serializer is (
        rq.serializers.JSONSerializer
    )
    assert rq.job.Job(connection=connection).serializer is rq.serializers.DefaultSerializer
    assert rq.job.Job(connection=connection, serializer="json").serializer is rq.serializers.JSONSerializer
    with pytest.raises(NotImplementedError):
        rq.job.Job(connection=connection, serializer=object())


_TIMESTAMPS = [
    "2026-12-02T03:39:37.123456Z",
    "2026-01-01T00:00:00.000000Z",
    "1999-12-31T23:59:59.999999Z",
    "2024-02-29T12:00:00.500000Z",
    "2026-12-02T03:39:37Z",  # RQ's older form, without microseconds
    "2026-12-02T03:39:37.1234Z",  # fewer digits: strptime's %f takes them
]


@pytest.mark.parametrize("text", _TIMESTAMPS)
def test_a_job_timestamp_is_read_as_rqs_own_parser_reads_it(text: str) -> None:
    import rq.utils

    import rollq.worker.rq_worker  # noqa: F401  (installs the fast paths)

    for raw in (text.encode(), text):
        read = rq.job.str_to_date(raw)
        assert read == rq.utils.str_to_date(raw) and read.tzinfo == rq.utils.str_to_date(raw).tzinfo


@pytest.mark.parametrize("text", ["2026-13-02T03:39:37.123456Z", "2026-02-30T03:39:37.123456Z", "", "nonsense"])
def test_a_timestamp_rq_cannot_read_raises_as_rqs_parser_raises(text: str) -> None:
    import rq.utils

    import rollq.worker.rq_worker  # noqa: F401  (installs the fast paths)

    with pytest.raises(ValueError) as rqs:
        rq.utils.str_to_date(text.encode())
    with pytest.raises(ValueError) as ours:
        rq.job.str_to_date(text.encode())
    assert str(ours.value) == str(rqs.value)


def test_a_job_timestamp_is_written_character_for_character_as_rq_writes_it() -> None:
    import datetime as dt

    import rq.utils

    import rollq.worker.rq_worker  # noqa: F401  (installs the fast paths)

    utc = dt.UTC
    moments = [
        dt.datetime(2026, 12, 2, 3, 39, 37, 123456, tzinfo=utc),
        dt.datetime(2026, 1, 1),
        dt.datetime(1000, 1, 1, 0, 0, 0, 1, tzinfo=utc),
        dt.datetime(999, 5, 6, 7, 8, 9, 10),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        rq.utils.now(),
    ]
    for moment in moments:
        assert rq.job.utcformat(moment) == rq.utils.utcformat(moment)


def test_a_saved_job_keeps_the_data_bytes_it_was_read_with_which_are_what_rq_would_compress() -> None:
    import zlib

    import rollq.worker.rq_worker  # noqa: F401  (installs the fast paths)
    from rollq.store.jobs import JobTemplate

    assert {"zlib"} <= set(rq.job.Job.to_dict.__code__.co_names) & set(rq.job.Job.restore.__code__.co_names)
    connection = fakeredis.FakeRedis()
    stored = JobTemplate.payload("rollout-1")  # as a producer writes it
    job = rq.job.Job.create("rollq.worker.jobs.run_rollout", args=("rollout-1",), connection=connection)
    raw = {k.encode(): v.encode() if isinstance(v, str) else v for k, v in job.to_dict().items()}
    raw[b"data"] = stored
    read = RollqJob("j1", connection=connection)
    read.restore(raw)
    assert read.to_dict()["data"] == stored == zlib.compress(read.data)
    # Data never read back is compressed as RQ compresses it; data RQ stored uncompressed is read as before.
    other = b'["rollq.worker.jobs.run_rollout", null, ["rollout-2"], {}]'
    assert rq.job.zlib.compress(other) == zlib.compress(other)
    raw[b"data"] = other
    read.restore(raw)
    assert read.data == other
    with pytest.raises(zlib.error):
        rq.job.zlib.decompress(b"not zlib")
