"""``ROLLQ_ROLLOUT_TRACE``: which published rollouts keep their trace, with triplets and rewards the same either way.

A captured LLM call's span repeats the call's messages and token ids, so the trace is most of a rollout's bytes; a
trainer that reads only triplets can leave it out, and keep it where it explains a failure.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest

from rollq.models.contract import LLM, Rollout
from rollq.ops.dashboard import create_app
from rollq.producer import Producer
from tests.support.fake_vllm import FakeVLLM
from tests.support.servers import REPO, ROLLQ, RedisServer, WorkerProcess

AGENTS = "tests.support.capture_agents"
WAIT = 60.0
SUCCEEDS = {"steps": ["async", "reward:1"]}
FAILS = {"steps": ["async"], "returns": True}  # a bool is no reward: the rollout fails, naming why


def _run(url: str, namespace: str, workers: Callable[..., WorkerProcess], kept: str | None) -> list[Rollout]:
    fake = FakeVLLM().start()
    try:
        producer = Producer.from_url(url, namespace=namespace)
        producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})
        env = {"ROLLQ_AGENT": f"{AGENTS}:AsyncCaptureAgent"}
        if kept is not None:
            env["ROLLQ_ROLLOUT_TRACE"] = kept
        workers(url, namespace, env=env)
        tasks = producer.enqueue_many([SUCCEEDS, FAILS], mode="train")
        return producer.wait([t.rollout_id for t in tasks], timeout=WAIT)
    finally:
        fake.stop()


@pytest.mark.parametrize("kept", ["failed", "none"])
def test_a_worker_that_drops_traces_publishes_the_same_triplets_and_rewards_without_them(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], kept: str
) -> None:
    succeeded, failed = _run(redis_server.url, namespace, workers, kept)

    assert succeeded.metadata["status"] == "succeeded" and succeeded.trace is None
    [triplet] = succeeded.triplets or []
    assert triplet.prompt["token_ids"] and triplet.response["token_ids"] and triplet.response["logprobs"]
    assert triplet.reward == 1.0 and succeeded.final_reward == 1.0
    assert failed.metadata["status"] == "failed" and "bool" in failed.metadata["error"]["message"]
    if kept == "failed":  # its spans say what the failed attempt did
        assert failed.trace and any(span["name"].startswith("chat") for span in failed.trace)
    else:
        assert failed.trace is None
    page = create_app(redis_server.url, namespace).test_client().get(f"/rollq/rollout/{succeeded.rollout_id}")
    assert page.status_code == 200 and "published without its trace" in page.text


def test_by_default_every_rollout_keeps_its_trace_and_it_is_most_of_its_bytes(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    succeeded, failed = _run(redis_server.url, namespace, workers, None)

    assert succeeded.trace and failed.trace
    without = succeeded.model_copy(update={"trace": None})
    assert len(without.model_dump_json()) < len(succeeded.model_dump_json()) / 2


def test_rollq_worker_takes_the_setting_as_an_option(redis_server: RedisServer, namespace: str) -> None:
    fake = FakeVLLM().start()
    try:
        producer = Producer.from_url(redis_server.url, namespace)
        producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})
        [task] = producer.enqueue_many([SUCCEEDS], mode="train")
        base = [ROLLQ, "--url", redis_server.url, "-n", namespace, "worker", "--burst", "--agent"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLQ_")}
        wrong = subprocess.run([*base, f"{AGENTS}:AsyncCaptureAgent", "--rollout-trace", "some"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        done = subprocess.run([*base, f"{AGENTS}:AsyncCaptureAgent", "--rollout-trace", "none"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        [rollout] = producer.wait([task.rollout_id], timeout=WAIT)
    finally:
        fake.stop()

    assert wrong.returncode == 2 and "'some' is not one of 'all', 'failed', 'none'" in wrong.stderr
    assert done.returncode == 0, done.stderr
    assert rollout.trace is None and rollout.triplets and rollout.final_reward == 1.0
