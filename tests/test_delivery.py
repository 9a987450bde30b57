"""Delivery a trainer can trust, on a real redis-server and real worker processes (issue 12).

Re-runs are visible (generation), trimming never leaves a silent gap, the
stream is bounded in bytes, and readers ride out Redis outages.
"""

from __future__ import annotations

import pytest
from fault_agents import wait_until

from rollq.producer.producer import Producer

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.fault_agents:FaultAgent"}


def test_a_rerun_after_a_dead_letter_requeue_carries_the_next_generation(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace)
    fine = producer.enqueue({"sleep": 0}).rollout_id
    rid = producer.enqueue({"raise": "deterministic bug"}).rollout_id
    workers(redis_server.url, namespace, env=AGENT)
    reader = iter(producer.rollouts("trainers", idle_timeout=10))
    first = {r.rollout_id: r for r in (next(reader), next(reader))}
    assert first[fine].metadata["generation"] == 1
    assert (first[rid].metadata["status"], first[rid].metadata["generation"]) == ("failed", 1)

    assert producer.requeue_dead([rid]) == [rid]
    second = next(reader)
    assert (second.rollout_id, second.metadata["status"], second.metadata["generation"]) == (rid, "failed", 2)
    assert producer.wait([rid], timeout=10)[0].metadata["generation"] == 2

    wait_until(lambda: producer.dead_letter() == [rid], 10, "the re-run to be dead-lettered again")
    assert producer.requeue_dead([rid]) == [rid]
    assert next(reader).metadata["generation"] == 3
