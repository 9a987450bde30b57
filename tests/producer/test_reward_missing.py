"""A rollout that succeeds without any reward is never silent: flagged in its metadata, counted in ``rollq status``
and ``/metrics``, and logged once per worker process (a reward API writing where rollq does not read turned every
reward into None, with status ``succeeded`` and no warning)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollq.models.contract import LLM
from rollq.ops.metrics import render_prometheus
from rollq.ops.status import render_text, snapshot
from rollq.producer import Producer
from tests.support.fake_vllm import FakeVLLM
from tests.support.servers import RedisServer, WorkerProcess

pytestmark = pytest.mark.redis


def test_a_succeeded_rollout_without_reward_is_flagged_counted_and_logged_once(
    redis_server: RedisServer, namespace: str, fake: FakeVLLM, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})
    inputs = [{"steps": ["async"]}, {"steps": ["async", "reward:0.5"]}, {"steps": ["async"]}, {"steps": ["async"]}]
    ids = [t.rollout_id for t in producer.enqueue_many(inputs, mode="train")]
    worker = workers(
        redis_server.url,
        namespace,
        env={"ROLLQ_AGENT": "tests.support.capture_agents:AsyncCaptureAgent", "ROLLQ_CONCURRENCY": "2"},
    )
    rollouts = producer.wait(ids, timeout=60)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * 4
    assert [r.metadata.get("reward_missing") for r in rollouts] == [True, None, True, True]
    assert rollouts[1].final_reward == 0.5
    state = snapshot(producer.connection, producer.keys)
    assert state.reward_missing == 3
    assert "succeeded         4 (3 with no reward)" in render_text(state)
    assert f'rollq_rollouts_without_reward_total{{namespace="{namespace}"}} 3.0' in render_prometheus(state)
    assert worker.log().count("succeeded with no reward") == 1
