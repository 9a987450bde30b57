"""LLM calls captured end to end: stock ``rq worker`` processes, a fake vLLM server, real clients.

The agents (``tests/support/capture_agents.py``) call the endpoint in their resources with
the ``openai`` SDK (sync, async, streaming), raw ``httpx`` and ``curl`` in a
subprocess, none of them knowing about rollq; the worker points them at its
capturing proxy. The fake server records the token ids it sent per response id,
and the rollouts must carry exactly those.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollq.models.contract import LLM, Rollout, Triplet
from rollq.producer import Producer
from tests.support.fake_vllm import FakeVLLM
from tests.support.servers import RedisServer, WorkerProcess

pytestmark = pytest.mark.redis

WAIT = 60.0
AGENTS = "tests.support.capture_agents"


@dataclass
class Fleet:
    producer: Producer
    fake: FakeVLLM
    resources_id: str
    worker: WorkerProcess

    def run(self, *inputs: dict[str, Any], resources_id: str | None = None) -> list[Rollout]:
        tasks = self.producer.enqueue_many(list(inputs), mode="train", resources_id=resources_id or self.resources_id)
        return self.producer.wait([t.rollout_id for t in tasks], timeout=WAIT)

    def resources(self, fake: FakeVLLM, **sampling: Any) -> str:
        return self.producer.update_resources(
            {"llm": LLM(endpoint=fake.url, model="fake-model", sampling_parameters=sampling)}
        )


@pytest.fixture(scope="module", params=["0", "1"], ids=["proxy thread", "proxy on agents' loop"])
def fleet(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Fleet]:
    """One async-agent worker (16 rollouts at once) and the fake backend it calls; its proxy on a thread of its own,
    then on the agents' loop (ROLLQ_CAPTURE_ON_AGENT_LOOP)."""
    fake = FakeVLLM().start()
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    producer = Producer.from_url(redis_server.url, namespace=namespace)
    resources_id = producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})
    log = tmp_path_factory.mktemp("capture") / "worker.log"
    env = {
        "ROLLQ_AGENT": f"{AGENTS}:AsyncCaptureAgent",
        "ROLLQ_CONCURRENCY": "16",
        "ROLLQ_HEARTBEAT_SECONDS": "1",
        "ROLLQ_CAPTURE_ON_AGENT_LOOP": request.param,
    }
    worker = WorkerProcess(redis_server.url, namespace, log, env=env)
    yield Fleet(producer, fake, resources_id, worker)
    worker.stop(timeout=30)
    print(f"--- worker log ---\n{worker.log()[-4000:]}")
    fake.stop()


def assert_ids_are_the_servers(fake: FakeVLLM, triplet: Triplet) -> None:
    sent = fake.sent[triplet.metadata["response_id"]]
    assert triplet.prompt["token_ids"] == sent.prompt_token_ids
    assert triplet.response["token_ids"] == sent.token_ids
    assert triplet.response["text"] == sent.text


def test_every_call_of_every_client_is_one_triplet_with_the_servers_token_ids_in_order(fleet: Fleet) -> None:
    steps = ["sync", "reward:0.25", "async", "stream", "completion", "httpx", "reward:1.0"]
    [rollout] = fleet.run({"steps": steps})
    assert rollout.metadata["status"] == "succeeded", rollout.metadata
    triplets = rollout.triplets or []
    assert len(triplets) == 5
    for triplet in triplets:
        assert_ids_are_the_servers(fleet.fake, triplet)
        assert triplet.metadata["resource"] == "llm" and triplet.metadata["model"] == "fake-model"
    # In call order: the fake numbers its answers as it sends them.
    numbers = [int(t.metadata["response_id"].rsplit("-", 1)[1]) for t in triplets]
    assert numbers == sorted(numbers)
    assert [t.metadata["finish_reason"] for t in triplets] == ["stop", "stop", "stop", "length", "stop"]
    assert triplets[0].prompt["messages"][1]["content"] == f"{rollout.rollout_id} question 0"
    assert triplets[3].prompt["text"] == f"{rollout.rollout_id} prompt 4"
    assert [t.reward for t in triplets] == [0.25, None, None, None, 1.0]
    assert rollout.final_reward == 1.0
    assert "warnings" not in rollout.metadata
    captured = [s for s in rollout.trace or [] if (s["attributes"] or {}).get("rollq.llm.captured")]
    assert [s["attributes"]["gen_ai.operation.name"] for s in captured] == ["chat"] * 3 + ["text_completion", "chat"]
    assert captured[2]["attributes"]["rollq.llm.streamed"] is True
    assert all(s["attributes"]["http.response.status_code"] == 200 for s in captured)


def test_agent_and_tool_spans_make_no_triplets_and_each_call_names_its_agent(fleet: Fleet) -> None:
    steps = ["agent:solver", "tool", "async", "tool", "reward:0.5", "end_agent", "agent:critic", "stream", "end_agent"]
    [rollout] = fleet.run({"steps": steps})
    triplets = rollout.triplets or []
    assert [t.metadata.get("agent") for t in triplets] == ["solver", "critic"]
    assert [t.reward for t in triplets] == [0.5, None]
    names = [s["name"] for s in rollout.trace or []]
    assert names.count("execute_tool calc") == 2 and "invoke_agent solver" in names


def test_concurrent_rollouts_in_one_worker_never_mix_their_calls(fleet: Fleet) -> None:
    fleet.fake.delay = 0.05  # every rollout has a call in flight at the same time as the others
    try:
        rollouts = fleet.run(*({"steps": ["async", "stream", "reward:1", "sync"]} for _ in range(16)))
    finally:
        fleet.fake.delay = 0.0
    seen: set[str] = set()
    for rollout in rollouts:
        triplets = rollout.triplets or []
        assert len(triplets) == 3, rollout.metadata
        for triplet in triplets:
            assert triplet.prompt["messages"][1]["content"].startswith(f"{rollout.rollout_id} question")
            assert_ids_are_the_servers(fleet.fake, triplet)
            seen.add(triplet.metadata["response_id"])
        assert [t.reward for t in triplets] == [None, 1.0, None]
    assert len(seen) == 48


def test_a_backend_error_fails_the_rollout_naming_the_http_status(fleet: Fleet) -> None:
    failing = FakeVLLM(fail_status=503).start()
    try:
        [rollout] = fleet.run({"steps": ["async"]}, resources_id=fleet.resources(failing))
    finally:
        failing.stop()
    assert rollout.metadata["status"] == "failed"
    error = rollout.metadata["error"]
    assert error["type"] == "LLMBackendError" and "HTTP 503" in error["message"], error
    [span] = [s for s in rollout.trace or [] if (s["attributes"] or {}).get("rollq.llm.captured")]
    assert span["attributes"]["error.type"] == "503" and span["status"]["status_code"] == "ERROR"


def test_a_backend_that_refuses_token_ids_still_answers_and_the_rollout_says_they_are_missing(fleet: Fleet) -> None:
    refusing = FakeVLLM(reject_unknown_fields=True).start()
    try:
        [rollout] = fleet.run({"steps": ["async", "stream", "reward:1"]}, resources_id=fleet.resources(refusing))
    finally:
        refusing.stop()
    assert rollout.metadata["status"] == "succeeded", rollout.metadata
    triplets = rollout.triplets or []
    assert [t.response["text"] for t in triplets] == ["reply 1", "reply 2"]
    assert all("token_ids" not in t.prompt and t.metadata["token_ids_missing"] for t in triplets)
    assert rollout.metadata["warnings"] == ["token ids missing for 2 of 2 LLM call(s)"]


def test_logprobs_asked_for_by_the_resource_come_back_on_the_triplet(fleet: Fleet) -> None:
    [rollout] = fleet.run({"steps": ["async", "stream"]}, resources_id=fleet.resources(fleet.fake, logprobs=True))
    for triplet in rollout.triplets or []:
        sent = fleet.fake.sent[triplet.metadata["response_id"]]
        assert sent.logprobs is not None and triplet.response["logprobs"] == pytest.approx(sent.logprobs)


def test_a_nan_reward_fails_the_rollout_saying_so(fleet: Fleet) -> None:
    [rollout] = fleet.run({"steps": ["async", "reward:nan"]})
    assert rollout.metadata["status"] == "failed"
    assert "finite" in rollout.metadata["error"]["message"] and "nan" in rollout.metadata["error"]["message"]


def test_tool_calls_are_recorded_on_the_response(fleet: Fleet) -> None:
    [rollout] = fleet.run({"steps": ["tools"]})
    [triplet] = rollout.triplets or []
    assert triplet.response["tool_calls"][0]["function"] == {"name": "calc", "arguments": '{"x": 1}'}
    assert triplet.metadata["finish_reason"] == "tool_calls"


def test_a_sync_agent_calling_through_curl_httpx_and_the_sync_sdk_is_captured(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    fake = FakeVLLM().start()
    try:
        producer = Producer.from_url(redis_server.url, namespace=namespace)
        producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})
        workers(redis_server.url, namespace, env={"ROLLQ_AGENT": f"{AGENTS}:SyncCaptureAgent"})
        [task] = producer.enqueue_many([{"steps": ["curl", "reward:0.5", "httpx", "sync", "reward:1"]}], mode="train")
        [rollout] = producer.wait([task.rollout_id], timeout=WAIT)
    finally:
        fake.stop()
    triplets = rollout.triplets or []
    assert len(triplets) == 3, rollout.metadata
    for triplet in triplets:
        assert_ids_are_the_servers(fake, triplet)
    assert [t.reward for t in triplets] == [0.5, None, 1.0]


def test_a_blocking_llm_call_on_the_agents_loop_fails_its_rollout_naming_the_timeout_and_the_worker_goes_on(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    """With the proxy on the agents' loop, an async agent that calls a sync client on that loop blocks the proxy
    that would answer it (docs/workers.md, "The proxy on the agents' loop"): its call times out, its rollout fails
    saying so, and the next rollout is served."""
    fake = FakeVLLM().start()
    try:
        producer = Producer.from_url(redis_server.url, namespace=namespace)
        producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})
        env = {"ROLLQ_AGENT": f"{AGENTS}:AsyncCaptureAgent", "ROLLQ_CAPTURE_ON_AGENT_LOOP": "1"}
        worker = workers(redis_server.url, namespace, env=env)
        [blocked] = producer.enqueue_many([{"steps": ["sync-on-loop"]}], mode="train")
        [rollout] = producer.wait([blocked.rollout_id], timeout=WAIT)
        [after] = producer.enqueue_many([{"steps": ["async", "reward:1"]}], mode="train")
        [next_rollout] = producer.wait([after.rollout_id], timeout=WAIT)
    finally:
        fake.stop()
    assert rollout.metadata["status"] == "failed"
    assert rollout.metadata["error"]["type"] == "APITimeoutError", rollout.metadata["error"]
    assert next_rollout.metadata["status"] == "succeeded" and next_rollout.final_reward == 1.0
    assert len(next_rollout.triplets or []) == 1
    assert "the capturing proxy runs on this loop, so an LLM call made that way waits" in worker.log()


def test_with_capture_off_agents_call_the_endpoint_directly(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    fake = FakeVLLM().start()
    try:
        producer = Producer.from_url(redis_server.url, namespace=namespace)
        producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})
        env = {"ROLLQ_AGENT": f"{AGENTS}:AsyncCaptureAgent", "ROLLQ_CAPTURE_LLM": "0"}
        workers(redis_server.url, namespace, env=env)
        [task] = producer.enqueue_many([{"steps": ["async"]}], mode="train")
        [rollout] = producer.wait([task.rollout_id], timeout=WAIT)
    finally:
        fake.stop()
    assert rollout.metadata["status"] == "succeeded"
    assert rollout.triplets is None
    assert "return_token_ids" not in fake.received[0]


def test_the_demo_reports_triplets_per_rollout_all_with_token_ids(redis_server: RedisServer) -> None:
    from rollq.ops.demo import run_demo

    namespace = f"t-{uuid.uuid4().hex[:10]}"
    summary = run_demo(redis_server.url, tasks=12, workers=1, concurrency=8, namespace=namespace, echo=lambda _: None)
    assert summary.succeeded == 12
    assert 12 <= summary.triplets <= 24 and summary.triplets_with_token_ids == summary.triplets
    assert "every triplet carries prompt and response token ids" in summary.render()


def test_the_triplet_agent_setting_keeps_only_that_agents_calls(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    fake = FakeVLLM().start()
    try:
        producer = Producer.from_url(redis_server.url, namespace=namespace)
        producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})
        env = {"ROLLQ_AGENT": f"{AGENTS}:AsyncCaptureAgent", "ROLLQ_TRIPLET_AGENT": "solver"}
        workers(redis_server.url, namespace, env=env)
        steps = ["agent:planner", "async", "end_agent", "agent:solver", "async", "reward:1", "end_agent", "async"]
        [task] = producer.enqueue_many([{"steps": steps}], mode="train")
        [rollout] = producer.wait([task.rollout_id], timeout=WAIT)
    finally:
        fake.stop()
    [triplet] = rollout.triplets or []
    assert triplet.metadata["agent"] == "solver" and triplet.reward == 1.0
    assert triplet.prompt["messages"][1]["content"] == f"{rollout.rollout_id} question 4"
