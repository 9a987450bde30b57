"""Bad input of every kind gets a specific error, and the worker that met it keeps serving.

Each test queues the bad thing before its worker starts (the queue is FIFO, so
the worker meets it first), checks the outcome, then shows that a good task
still completes on that same worker.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from rq import Queue
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from rollq.models.contract import LLM
from rollq.models.errors import PayloadTooLargeError, UnknownResourcesError
from rollq.models.policy import RolloutPolicy
from rollq.producer.producer import Producer
from rollq.store.jobs import ROLLOUT_FUNC
from rollq.store.keys import Keys
from tests.support.fault_agents import assert_exactly_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}


@pytest.fixture
def producer(redis_server, namespace) -> Producer:
    return Producer.from_url(redis_server.url, namespace)


@pytest.fixture
def serve(redis_server, namespace, workers):
    """Start the test's one worker (named after the namespace) with extra environment; returns its process."""

    def start(**env: str):
        return workers(redis_server.url, namespace, env={**AGENT, **env}, args=["--name", f"{namespace}-worker"])

    return start


def assert_still_serving(producer: Producer) -> str:
    """Run a good task; it must succeed on the test's worker. Returns its rollout id."""
    rid = producer.enqueue({"sleep": 0}).rollout_id
    [rollout] = producer.wait([rid], timeout=30)
    assert rollout.metadata["status"] == "succeeded"
    assert rollout.metadata["worker"] == f"{producer.namespace}-worker"
    return rid


def failed_with(producer: Producer, rollout_id: str, error_type: str) -> str:
    """The error message of ``rollout_id``'s published failure, after checking its type."""
    [rollout] = producer.wait([rollout_id], timeout=30)
    assert rollout.metadata["status"] == "failed"
    assert rollout.metadata["error"]["type"] == error_type, rollout.metadata["error"]
    return rollout.metadata["error"]["message"]


# -- queue entries that are not valid tasks -------------------------------------


@pytest.mark.parametrize(
    ("stored_task", "named"),
    [
        pytest.param(b'{"rollout_id": "x", "input": ', "Invalid JSON", id="garbage-json"),
        pytest.param(
            lambda rid: {"rollout_id": rid, "input": 1, "mode": 42, "num_claims": "many"}, "mode", id="wrong-types"
        ),
        pytest.param(lambda rid: {"input": {"q": 1}}, "rollout_id", id="missing-fields"),
    ],
)
def test_task_record_that_is_not_a_valid_task_fails_with_invalid_task_error(producer, serve, stored_task, named):
    rid = producer.enqueue({"sleep": 0}).rollout_id
    raw = stored_task if isinstance(stored_task, bytes) else json.dumps(stored_task(rid))
    producer.connection.hset(producer.keys.task(rid), "task", raw)
    serve()

    message = failed_with(producer, rid, "InvalidTaskError")
    assert named in message
    assert producer.dead_letter() == [rid]
    good = assert_still_serving(producer)
    assert_exactly_once(producer.connection, producer.namespace, [rid, good])


def refused(producer: Producer, job_id: str, worker) -> None:
    registry = FailedJobRegistry(producer.namespace, connection=producer.connection, serializer=JSONSerializer)
    wait_until(lambda: job_id in registry.get_job_ids(), f"job {job_id} in the failed registry", timeout=30)
    assert f"refused job {job_id}" in worker.log()


def test_job_with_garbage_payload_is_refused(producer, serve):
    queue = Queue(producer.namespace, connection=producer.connection, serializer=JSONSerializer)
    job = queue.enqueue(ROLLOUT_FUNC, "rollout-that-does-not-matter")
    producer.connection.hset(Keys.rq_job(job.id), "data", bytes(range(256)))
    worker = serve()

    refused(producer, job.id, worker)
    assert "not valid rollq JSON" in worker.log()
    assert_still_serving(producer)


@pytest.mark.parametrize("serializer", [JSONSerializer, None], ids=["json", "pickle"])
def test_job_for_another_function_is_refused_and_never_run(producer, serve, serializer):
    marker = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    queue = Queue(producer.namespace, connection=producer.connection, serializer=serializer)
    job = queue.enqueue("os.system", f"touch {marker}")
    worker = serve()

    refused(producer, job.id, worker)
    assert_still_serving(producer)
    assert not marker.exists()


# -- resources ------------------------------------------------------------------


def test_resources_deleted_after_enqueue_fail_the_rollout_with_unknown_resources_error(producer, serve):
    llm = LLM(endpoint="http://127.0.0.1:1", model="m")
    version = producer.update_resources({"llm": llm})
    rid = producer.enqueue({"sleep": 0}, resources_id=version).rollout_id
    producer.connection.delete(producer.keys.resources(version))
    producer.update_resources({"llm": llm})  # the good task runs with this latest version
    serve()

    assert version in failed_with(producer, rid, "UnknownResourcesError")
    assert_still_serving(producer)


def test_unknown_resources_id_is_refused_at_enqueue(producer):
    with pytest.raises(UnknownResourcesError, match="v404"):
        producer.enqueue({"sleep": 0}, resources_id="v404")
    assert producer.connection.llen(producer.keys.rq_queue) == 0


# -- agents that misbehave --------------------------------------------------------


@pytest.mark.parametrize(
    ("task_input", "policy", "env", "error_type", "named"),
    [
        pytest.param({"raise": "the agent broke"}, None, {}, "RuntimeError", "the agent broke", id="raises"),
        pytest.param(
            {"sleep": 3600}, RolloutPolicy(timeout_seconds=1, max_attempts=1), {}, "AgentTimeoutError", "1s", id="hangs"
        ),
        pytest.param({"wrong_type": True}, None, {}, "UnsupportedResultError", "dict", id="wrong-type"),
        pytest.param(
            {"huge": 100_000}, None, {"ROLLQ_MAX_RESULT_BYTES": "10000"}, "PayloadTooLargeError", "10000", id="huge"
        ),
    ],
)
def test_misbehaving_agent_fails_the_rollout_with_a_specific_error(
    producer, serve, task_input, policy, env, error_type, named
):
    rid = producer.enqueue(task_input, policy=policy).rollout_id
    serve(**env)

    assert named in failed_with(producer, rid, error_type)
    assert producer.dead_letter() == [rid]
    good = assert_still_serving(producer)
    assert_exactly_once(producer.connection, producer.namespace, [rid, good])


def test_task_over_max_task_bytes_is_refused_at_enqueue(redis_server, namespace):
    producer = Producer.from_url(redis_server.url, namespace, max_task_bytes=1000)
    with pytest.raises(PayloadTooLargeError, match="over the limit of 1000 bytes"):
        producer.enqueue({"blob": "x" * 5000})
    assert producer.connection.llen(producer.keys.rq_queue) == 0
    assert list(producer.connection.scan_iter(match=producer.keys.task("*"))) == []


# -- hooks --------------------------------------------------------------------------


def test_raising_hook_is_logged_by_name_and_the_rollout_still_published(producer, serve):
    worker = serve(ROLLQ_HOOKS="tests.support.fault_agents:RaisingHook")
    rid = producer.enqueue({"sleep": 0}).rollout_id

    [rollout] = producer.wait([rid], timeout=30)
    assert rollout.metadata["status"] == "succeeded"
    wait_until(lambda: "RaisingHook.on_rollout_end raised" in worker.log(), "the hook's error in the log", timeout=10)
    assert "RaisingHook.on_rollout_start raised" in worker.log()
    assert_still_serving(producer)
