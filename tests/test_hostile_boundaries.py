"""Issue 26, "trust nothing that crosses a boundary": what a hostile tester found at the worker's boundaries
(hooks, a full Redis, deep records, agents' results), each reproduced on a real redis-server and real
``rq worker -w rollq.worker.RolloutWorker`` processes."""

from __future__ import annotations

import pytest

from rollq.models.policy import RolloutPolicy
from rollq.producer.producer import Producer
from rollq.store.keys import requeue_stat

pytestmark = pytest.mark.redis

ASYNC = {"ROLLQ_AGENT": "tests.hostile_agents:HostileAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}


# -- 2. a slow on_rollout_start hook ---------------------------------------------------------------------------


def test_a_slow_start_hook_fails_no_healthy_task_and_is_reported_over_its_budget(redis_server, namespace, workers):
    # 16 claims at once, each start hook 0.4 s: the last agent starts ~6 s after its claim, three times the 2 s
    # unresponsive limit. On 48fc877 claims were heartbeated only once launched, and the reaper took them over.
    producer = Producer.from_url(
        redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=2, timeout_seconds=60)
    )
    ids = [t.rollout_id for t in producer.enqueue_many([{"hook_sleep": 0.4}] * 32)]
    env = {
        **ASYNC,
        "ROLLQ_CONCURRENCY": "16",
        "ROLLQ_HOOKS": "tests.hostile_agents:SlowStartHook",
        "ROLLQ_HOOK_BUDGET_SECONDS": "0.2",
    }
    worker = workers(redis_server.url, namespace, env=env)
    rollouts = producer.wait(ids, timeout=90)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * len(ids)
    assert [r.metadata["attempt"] for r in rollouts] == [1] * len(ids)
    assert int(producer.connection.hget(producer.keys.stats, requeue_stat("unresponsive")) or 0) == 0
    for rollout in rollouts:
        assert rollout.metadata["hook_overruns"]["SlowStartHook.on_rollout_start"] >= 0.4
    assert "hook SlowStartHook.on_rollout_start took" in worker.log()
