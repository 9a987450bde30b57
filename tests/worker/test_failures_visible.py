"""A failed rollout is visible everywhere an operator looks: RQ's failed registry (so `rq info` and rq-dashboard
count it) with the error as its exception info, the job's meta and description, `rollq task`, `rollq rollouts get`,
`rollq dead-letter list`, and the OTLP root span of the attempt."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer

from rollq.ops.dashboard import create_app
from rollq.producer import Producer
from rollq.store.connection import connect
from rollq.worker import RolloutWorker, WorkerSettings
from rollq.worker.tracer import OtelTracer, emit_reward
from tests.support.dashboard_agents import WorkloadAgent
from tests.support.servers import ROLLQ, RedisServer, WorkerProcess

RESOURCES = {"main_llm": {"resource_type": "llm", "endpoint": "http://llm:8000/v1", "model": "m"}}


@pytest.fixture
def finished_pair(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> tuple[Producer, str, str, str]:
    """One succeeded and one failed rollout, run by a real `rq worker` subprocess."""
    producer = Producer.from_url(redis_server.url, namespace)
    version = producer.update_resources(RESOURCES)
    workers(redis_server.url, namespace, env={"ROLLQ_AGENT": "tests.support.dashboard_agents:WorkloadAgent"})
    ok = producer.enqueue({"q": 7}, mode="train", resources_id=version).rollout_id
    bad = producer.enqueue({"fail": "bad input 42"}, mode="train", resources_id=version).rollout_id
    producer.wait([ok, bad], timeout=60)
    # The rollout is published before RQ's end-of-job bookkeeping runs; wait for that too.
    failed = FailedJobRegistry(namespace, connection=producer.connection)
    deadline = time.monotonic() + 30
    while producer.keys.job_id(bad) not in failed.get_job_ids(cleanup=False):
        assert time.monotonic() < deadline, "the failed job never reached RQ's failed registry"
        time.sleep(0.05)
    return producer, ok, bad, version


@pytest.mark.redis
def test_a_failed_rollout_is_a_failed_rq_job_with_the_error_and_outcome_shown(
    finished_pair: tuple[Producer, str, str, str], namespace: str
) -> None:
    producer, ok, bad, version = finished_pair
    client, job_id = producer.connection, producer.keys.job_id

    assert FailedJobRegistry(namespace, connection=client).get_job_ids(cleanup=False) == [job_id(bad)]
    assert FinishedJobRegistry(namespace, connection=client).get_job_ids(cleanup=False) == [job_id(ok)]
    failed = Job.fetch(job_id(bad), connection=client, serializer=JSONSerializer)
    result = failed.latest_result()
    assert result is not None and result.exc_string is not None
    # The traceback first (where people look, issue 23), then the error line.
    assert result.exc_string.startswith("Traceback (most recent call last):")
    assert "ValueError: bad input 42" in result.exc_string
    meta = failed.get_meta()["rollout"]
    error = dict(meta["error"])
    assert "raise ValueError(task_input" in error.pop("traceback")  # the agent's own frame
    assert (meta["status"], meta["attempt"], error) == (
        "failed",
        1,
        {"type": "ValueError", "message": "bad input 42"},
    )
    assert json.loads(meta["input"]) == {"fail": "bad input 42"} and meta["resources_id"] == version
    assert "failed, attempt 1" in (failed.description or "")

    done = Job.fetch(job_id(ok), connection=client, serializer=JSONSerializer)
    outcome = done.return_value()
    assert (outcome["status"], outcome["attempt"], outcome["reward"], outcome["resources_id"]) == (
        "succeeded",
        1,
        0.7,
        version,
    )
    assert json.loads(outcome["input"]) == {"q": 7}
    assert "succeeded, attempt 1, reward 0.7" in (done.description or "")
    # Kept for an hour by default, not 60 s.
    assert client.ttl(done.key) > 3000


@pytest.mark.redis
def test_rq_info_and_rq_dashboard_count_the_failed_rollout(
    finished_pair: tuple[Producer, str, str, str], namespace: str, redis_server: RedisServer
) -> None:
    app = create_app(redis_server.url, namespace)

    queues = app.test_client().get("/0/data/queues.json").json["queues"]

    (row,) = [q for q in queues if q["name"] == namespace]
    assert (row["failed_job_registry_count"], row["finished_job_registry_count"]) == (1, 1), row
    producer, ok, bad, _ = finished_pair
    job_id = producer.keys.job_id
    page = app.test_client().get(f"/0/data/job/{job_id(bad)}.json").json
    assert page["status"] == "failed" and page["exc_info"].startswith("Traceback (most recent call last):")
    assert "ValueError: bad input 42" in page["exc_info"]
    shown = json.loads(page["metadata"])["rollout"]
    assert (shown["status"], shown["attempt"], shown["error"]["type"]) == ("failed", 1, "ValueError")
    assert "bad input 42" in shown["input"] and "failed, attempt 1" in page["description"]
    assert app.test_client().get(f"/0/data/job/{job_id(ok)}.json").json["result"]["reward"] == 0.7
    info = subprocess.run(
        [str(Path(sys.executable).parent / "rq"), "info", "--url", redis_server.url, "--only-queues", namespace],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "1 finished, 1 failed" in info.stdout, info.stdout + info.stderr


@pytest.mark.redis
@pytest.mark.slow
def test_cli_shows_one_task_one_rollout_and_the_dead_letter_errors(
    finished_pair: tuple[Producer, str, str, str], namespace: str, redis_server: RedisServer
) -> None:
    producer, ok, bad, version = finished_pair
    base = [ROLLQ, "--url", redis_server.url, "-n", namespace]

    def run(*args: str) -> str:
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    shown = run("task", bad)
    # One "field value" line each, then the traceback (issue 23: tracebacks where people look).
    head, _, traceback = shown.partition("\ntraceback\n")
    assert "ValueError: bad input 42" in traceback and "raise ValueError(task_input" in traceback
    task = dict(line.split(None, 1) for line in head.splitlines() if line.strip())
    task_json = json.loads(run("task", bad, "--json"))
    rollout = json.loads(run("rollouts", "get", ok))
    dead = run("dead-letter", "list").splitlines()
    missing = subprocess.run([*base, "rollouts", "get", "never-queued"], capture_output=True, text=True, timeout=60)

    assert task["state"] == "failed" and task["error"] == "ValueError: bad input 42"
    assert task["attempts"].startswith("1 of 3 used") and task["worker"] != "-"
    assert task_json["ended_at"] >= task_json["last_claim_at"] >= task_json["created_at"] > 0
    assert task_json["resources_id"] == version
    assert (rollout["rollout_id"], rollout["final_reward"]) == (ok, 0.7)
    assert [len(t["prompt"]["token_ids"]) for t in rollout["triplets"]] == [5, 7]
    assert dead == [f"{bad}\t1 attempt(s)\tValueError: bad input 42"]
    assert (
        missing.returncode == 1
        and missing.stderr.strip() == f"rollq: no task 'never-queued' in namespace '{namespace}'"
    )


def test_otlp_root_span_carries_status_error_the_exception_and_the_rollout_attributes() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    url, namespace = f"memory://{uuid.uuid4().hex}", "otel"
    producer = Producer.from_url(url, namespace)
    version = producer.update_resources(RESOURCES)
    ok = producer.enqueue({"q": 3}, mode="val").rollout_id
    bad = producer.enqueue({"fail": "no luck"}, mode="train", resources_id=version).rollout_id

    RolloutWorker(
        [namespace],
        connection=connect(url),
        agent=WorkloadAgent(),
        tracer=OtelTracer(provider),
        settings=WorkerSettings(concurrency=2),
    ).work(burst=True, logging_level="WARNING")

    roots = {s.attributes["rollq.rollout_id"]: s for s in exporter.get_finished_spans() if s.name == "rollout"}
    failed, succeeded = roots[bad], roots[ok]
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.status.description == "ValueError: no luck"
    (event,) = [e for e in failed.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "no luck"
    assert {
        k: failed.attributes[k] for k in ("rollq.namespace", "rollq.mode", "rollq.attempt", "rollq.resources_id")
    } == {
        "rollq.namespace": namespace,
        "rollq.mode": "train",
        "rollq.attempt": 1,
        "rollq.resources_id": version,
    }
    assert succeeded.status.status_code == StatusCode.OK
    assert "rollq.final_reward" not in failed.attributes
    assert succeeded.attributes["rollq.final_reward"] == pytest.approx(0.3)
    assert succeeded.attributes["rollq.resources_id"] == version  # the latest, which it ran with


class EmitsRewards(WorkloadAgent):
    """Reports rewards as spans (emit_reward) and returns nothing: the way docs/workers.md shows."""

    async def training_rollout_async(self, task_input, rollout_id, resources):  # type: ignore[no-untyped-def]
        emit_reward(0.1)
        emit_reward(task_input["q"] / 10)


def test_otlp_root_span_takes_the_reward_of_the_last_reward_span() -> None:
    # emit_reward reports through the global provider, as agent libraries do.
    tracer = OtelTracer()
    exporter = InMemorySpanExporter()
    tracer.provider.add_span_processor(SimpleSpanProcessor(exporter))
    url = f"memory://{uuid.uuid4().hex}"
    rid = Producer.from_url(url, "otel").enqueue({"q": 6}, mode="train").rollout_id

    RolloutWorker(["otel"], connection=connect(url), agent=EmitsRewards(), tracer=tracer).work(
        burst=True, logging_level="WARNING"
    )

    (root,) = [
        s for s in exporter.get_finished_spans() if s.name == "rollout" and s.attributes["rollq.rollout_id"] == rid
    ]
    assert root.attributes["rollq.final_reward"] == pytest.approx(0.6)
