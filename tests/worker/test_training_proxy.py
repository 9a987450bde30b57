"""The capturing proxy's training features end to end: stock ``rq worker`` processes, the ``openai`` SDK (sync,
async, streaming) against fake vLLM servers.

Logprobs aligned with token ids in train mode, per-mode sampling enforced over the agent's, a token-count
mismatch flagged, the resources version per call, and several upstreams: sticky per rollout, spread, and a server
going down mid-run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollq.models.contract import LLM, Rollout, Triplet
from rollq.models.llm_options import with_options
from rollq.producer import Producer
from tests.support.fake_vllm import FakeVLLM
from tests.support.servers import RedisServer, WorkerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

WAIT = 60.0
AGENT = "tests.support.capture_agents:AsyncCaptureAgent"
CLIENTS = ["sync", "async", "stream", "completion"]


@dataclass
class Fleet:
    producer: Producer
    fake: FakeVLLM
    worker: WorkerProcess

    def run(self, *inputs: dict[str, Any], mode: str = "train", resources_id: str | None = None) -> list[Rollout]:
        tasks = self.producer.enqueue_many(list(inputs), mode=mode, resources_id=resources_id)
        return self.producer.wait([t.rollout_id for t in tasks], timeout=WAIT)

    def publish(self, llm: LLM) -> str:
        return self.producer.update_resources({"llm": llm})


@pytest.fixture(scope="module", params=["0", "1"], ids=["proxy thread", "proxy on the agents' loop"])
def fleet(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Fleet]:
    fake = FakeVLLM().start()
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    producer = Producer.from_url(redis_server.url, namespace=namespace)
    producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})
    log = tmp_path_factory.mktemp("training") / "worker.log"
    env = {
        "ROLLQ_AGENT": AGENT,
        "ROLLQ_CONCURRENCY": "16",
        "ROLLQ_HEARTBEAT_SECONDS": "1",
        "ROLLQ_CAPTURE_ON_AGENT_LOOP": request.param,
    }
    worker = WorkerProcess(redis_server.url, namespace, log, env=env)
    yield Fleet(producer, fake, worker)
    worker.stop(timeout=30)
    print(f"--- worker log ---\n{worker.log()[-4000:]}")
    fake.stop()


def _sent(fake: FakeVLLM, triplet: Triplet) -> Any:
    return fake.sent[triplet.metadata["response_id"]]


def test_train_mode_asks_for_logprobs_and_records_one_per_token_id_for_every_client(fleet: Fleet) -> None:
    [rollout] = fleet.run({"steps": CLIENTS})
    triplets = rollout.triplets or []
    assert len(triplets) == 4, rollout.metadata
    for triplet in triplets:
        sent = _sent(fleet.fake, triplet)
        assert triplet.response["token_ids"] == sent.token_ids
        assert triplet.response["logprobs"] == pytest.approx(sent.logprobs)
        assert len(triplet.response["logprobs"]) == len(triplet.response["token_ids"])
    asked = [body.get("logprobs") for body in fleet.fake.received[-4:]]
    assert asked == [True, True, True, 0]  # chat: the flag; completions: the sampled token's own (0 alternatives)


def test_val_mode_asks_for_no_logprobs_unless_the_agent_does(fleet: Fleet) -> None:
    [rollout] = fleet.run({"steps": ["async", "stream"]}, mode="val")
    assert all("logprobs" not in body for body in fleet.fake.received[-2:])
    assert all("logprobs" not in t.response or t.response["logprobs"] is None for t in rollout.triplets or [])


def test_logprobs_can_be_turned_off_for_train_mode(fleet: Fleet) -> None:
    llm = with_options(LLM(endpoint=fleet.fake.url, model="fake-model"), train_logprobs=False)
    [rollout] = fleet.run({"steps": ["async"]}, resources_id=fleet.publish(llm))
    assert "logprobs" not in fleet.fake.received[-1]
    assert rollout.metadata["status"] == "succeeded"


def test_per_mode_sampling_is_enforced_over_the_agents_and_recorded(fleet: Fleet) -> None:
    llm = with_options(
        LLM(endpoint=fleet.fake.url, model="fake-model", sampling_parameters={"max_tokens": 64}),
        modes={"train": {"temperature": 1.0, "top_p": 1.0}, "val": {"temperature": 0.0}},
    )
    resources_id = fleet.publish(llm)
    agent_sampling = {"temperature": 0.3, "top_p": 1.0}
    [train] = fleet.run({"steps": CLIENTS, "sampling": agent_sampling}, resources_id=resources_id)
    train_bodies = fleet.fake.received[-4:]
    [val] = fleet.run({"steps": ["async", "stream"], "sampling": agent_sampling}, mode="val", resources_id=resources_id)
    val_bodies = fleet.fake.received[-2:]
    assert [(b["temperature"], b["top_p"]) for b in train_bodies] == [(1.0, 1.0)] * 4
    assert [(b["temperature"], b["top_p"]) for b in val_bodies] == [(0.0, 1.0)] * 2
    for triplet in train.triplets or []:
        assert triplet.metadata["sampling_enforced"] == {"temperature": 1.0, "top_p": 1.0}
        assert triplet.metadata["sampling_overridden"] == {"temperature": 0.3}  # top_p was the same
    for triplet in val.triplets or []:
        assert triplet.metadata["sampling_overridden"] == {"temperature": 0.3}
    assert all(t.metadata["resources_id"] == resources_id for t in train.triplets or [])


def test_the_agent_never_sees_rollqs_options_in_its_sampling_parameters(fleet: Fleet) -> None:
    llm = with_options(
        LLM(endpoint=fleet.fake.url, model="fake-model", sampling_parameters={"max_tokens": 64}),
        modes={"train": {"temperature": 1.0}},
    )
    assert "rollq" in llm.sampling_parameters
    resources_id = fleet.publish(llm)
    [rollout] = fleet.run({"steps": ["async"], "returns": None}, resources_id=resources_id)
    assert rollout.metadata["status"] == "succeeded"
    assert "rollq" not in fleet.fake.received[-1]  # nor does it reach the server


def test_a_token_count_mismatch_is_flagged_on_the_triplet_and_in_the_warnings(fleet: Fleet) -> None:
    fleet.fake.token_count_skew = 2
    try:
        [rollout] = fleet.run({"steps": ["async", "stream"]})
    finally:
        fleet.fake.token_count_skew = 0
    first, second = rollout.triplets or []
    ids = len(first.response["token_ids"])
    assert first.metadata["token_count_mismatch"] is True
    assert (first.metadata["response_tokens"], first.metadata["usage_completion_tokens"]) == (ids, ids + 2)
    assert second.metadata["token_count_mismatch"] is True  # streamed, usage in the last chunk
    assert any("completion_tokens for 2 of 2" in w for w in rollout.metadata["warnings"])
    [plain] = fleet.run({"steps": ["async"]})
    assert "token_count_mismatch" not in (plain.triplets or [])[0].metadata


@pytest.mark.slow
def test_each_call_carries_the_resources_version_the_worker_knew_when_it_ran(fleet: Fleet) -> None:
    before = fleet.publish(LLM(endpoint=fleet.fake.url, model="fake-model"))
    time.sleep(1.5)  # a heartbeat: the worker knows `before` as the latest
    [task] = fleet.producer.enqueue_many([{"steps": ["async", "sleep:3", "async"]}], mode="train")
    wait_until(lambda: any(task.rollout_id in str(b) for b in fleet.fake.received), "the first call")
    after = fleet.publish(LLM(endpoint=fleet.fake.url, model="fake-model"))
    [rollout] = fleet.producer.wait([task.rollout_id], timeout=WAIT)
    first, second = rollout.triplets or []
    assert (first.metadata["resources_id"], second.metadata["resources_id"]) == (before, after)
    assert rollout.metadata["resources_id"] == before  # the task's own version, where it always was


def test_upstream_retries_absorb_a_brief_503_and_a_server_going_down_moves_only_its_rollouts(
    fleet: Fleet, tmp_path: Path
) -> None:
    a, b = FakeVLLM(name="a").start(), FakeVLLM(name="b").start()
    go_on = tmp_path / "go-on"
    try:
        # Five tries a call (retries=4) for the four 503s below: absorbed even when one call meets all four, as
        # the first rollout's does here (it runs alone while the servers fail: a, b, a, b).
        llm = with_options(
            LLM(endpoint=a.url, model="fake-model"),
            endpoints=[a.url, b.url],
            retries=4,
            backoff_seconds=0.05,
            eject_seconds=60,
        )
        resources_id = fleet.publish(llm)
        a.fail_next = b.fail_next = 2  # two 503s each (fewer than eject_after in a row): absorbed by retries
        steps = ["async", f"until:{go_on}", "stream", "sync"]  # each rollout holds after its first call
        tasks = fleet.producer.enqueue_many([{"steps": steps}], mode="train", resources_id=resources_id)
        wait_until(lambda: len(a.sent) + len(b.sent) == 1, "the first rollout's first call answered")
        assert a.fail_next == b.fail_next == 0, "the first call met all four 503s"
        tasks += fleet.producer.enqueue_many(
            [{"steps": steps} for _ in range(11)], mode="train", resources_id=resources_id
        )
        wait_until(lambda: len(a.sent) + len(b.sent) == 12, "every rollout's first call answered")
        a.stop()  # down mid-run: connection refused from here on
        go_on.touch()
        rollouts = fleet.producer.wait([t.rollout_id for t in tasks], timeout=WAIT)
    finally:
        a.stop()
        b.stop()
    served = {"a": 0, "b": 0}
    for rollout in rollouts:
        assert rollout.metadata["status"] == "succeeded", rollout.metadata
        where = [t.metadata["response_id"].split("-")[1] for t in rollout.triplets or []]
        assert len(where) == 3
        served[where[0]] += 1
        if where[0] == "b":
            assert where == ["b", "b", "b"]  # sticky
        else:
            assert where == ["a", "b", "b"]  # moved once, then sticky to the next server
        upstreams = [t.metadata["upstream"] for t in rollout.triplets or []]
        assert upstreams == [{"a": a.url, "b": b.url}[w] for w in where]
    assert served["a"] > 0 and served["b"] > 0  # spread across the servers
    assert a.fail_next == b.fail_next == 0
    retried = [
        s["attributes"].get("rollq.llm.upstream_attempts", 1)
        for r in rollouts
        for s in r.trace or []
        if (s["attributes"] or {}).get("rollq.llm.captured")
    ]
    assert sum(n - 1 for n in retried) >= 4  # the four 503s and the calls cut off by the server going down
