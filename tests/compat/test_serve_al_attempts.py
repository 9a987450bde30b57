"""``rollq serve-al`` publishes an attempt exactly as a worker would: the same outcome keys (generation
included) on every rollout, whichever gateway a client posts to. Real redis-server, real ``rollq serve-al``
processes, Agent Lightning 0.1's HTTP exchange spoken with urllib."""

from __future__ import annotations

import pytest

from rollq.models.policy import RolloutPolicy, TaskState
from rollq.producer.producer import Producer
from tests.support.http_json import post_json as _post
from tests.support.serve_al import take_task as _take
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis


def test_a_rollout_posted_for_a_revived_task_carries_the_generation_its_record_says(
    redis_server, namespace, serve_al
) -> None:  # type: ignore[no-untyped-def]
    # One attempt each, and a client that goes silent loses it within about 3 s (2 s lease + 1 s unresponsive).
    policy = RolloutPolicy(max_attempts=1, unresponsive_seconds=1, timeout_seconds=60)
    producer = Producer.from_url(redis_server.url, namespace, policy=policy)
    first, second = (t.rollout_id for t in producer.enqueue_many([{"q": 1}, {"q": 2}], mode="train"))
    handing, other = serve_al("--max-releases", "0"), serve_al()

    # Generation 1: both handed out, neither posted; the reaper fails them for good.
    assert sorted(_take(handing).rpartition("#")[0] for _ in range(2)) == sorted([f"{first}#1", f"{second}#1"])
    wait_until(
        lambda: sorted(producer.dead_letter()) == sorted([first, second]), "both to be dead-lettered", timeout=30
    )
    assert {producer.get_rollout(rid).metadata["generation"] for rid in (first, second)} == {1}  # type: ignore[union-attr]

    # Generation 2: revived, handed out again; one posted to the gateway that handed it out, one to another
    # gateway of the same namespace (as behind a load balancer), which never held that attempt.
    assert sorted(producer.requeue_dead([first, second])) == sorted([first, second])
    handed = {(taken := _take(handing)).partition("#")[0]: taken for _ in range(2)}
    assert sorted(handed) == sorted([first, second])
    assert [handed[first].rpartition("#")[0], handed[second].rpartition("#")[0]] == [f"{first}#2", f"{second}#2"]
    assert _post(handing + "rollout", {"rollout_id": handed[first], "final_reward": 1.0})["status"] == "delivered"
    assert _post(other + "rollout", {"rollout_id": handed[second], "final_reward": 0.5})["status"] == "delivered"

    for rid, reward in ((first, 1.0), (second, 0.5)):
        rollout = producer.get_rollout(rid)
        assert rollout is not None and rollout.final_reward == reward
        info = producer.task_info(rid)
        assert info.state == TaskState.SUCCEEDED
        record_generation = int(producer.connection.hget(producer.keys.task(rid), "generation") or 1)
        assert record_generation == 2
        assert (rollout.metadata["status"], rollout.metadata["attempt"]) == ("succeeded", 2)
        assert rollout.metadata["generation"] == record_generation, rollout.metadata
