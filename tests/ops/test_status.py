"""``rollq status`` (text, --json, --prometheus), ``/metrics`` and the dashboard's cards count every outcome a
rollout can be published with."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rq.queue import Queue
from rq.worker import Worker

from rollq.models.policy import RolloutStatus
from rollq.ops.dashboard import create_app
from rollq.ops.metrics import render_prometheus
from rollq.ops.status import render_text, snapshot
from rollq.producer import Producer
from rollq.store.stats import StatsField
from tests.support.servers import RedisServer


@pytest.mark.redis
def test_cancelled_rollouts_are_counted_in_status_metrics_and_dashboard_cards(
    redis_server: RedisServer, namespace: str
) -> None:
    # An outside audit: after `rollq tasks cancel c-1 c-2` the results stream held 302 rollouts, but status,
    # rollq_rollouts_total and the dashboard cards added up to 300 (the stats hash had `cancelled:train`).
    producer = Producer.from_url(redis_server.url, namespace)
    ids = [producer.enqueue({"n": i}, mode="train", rollout_id=f"c-{i}").rollout_id for i in (1, 2)]
    producer.enqueue({"n": 3}, mode="val", rollout_id="c-3")
    producer.cancel([*ids, "c-3"])

    s = snapshot(producer.connection, producer.keys)
    assert s.cancelled == 3
    assert s.succeeded + s.failed + s.cancelled == s.results_stream_length == 3
    assert "  cancelled         3" in render_text(s).splitlines()
    assert json.loads(json.dumps(s.to_dict()))["cancelled"] == 3
    published = {
        (sample.labels["status"], sample.labels["mode"]): sample.value
        for family in text_string_to_metric_families(render_prometheus(s))
        for sample in family.samples
        if sample.name == "rollq_rollouts_total"
    }
    assert published == {("cancelled", "train"): 2, ("cancelled", "val"): 1}
    assert sum(published.values()) == s.results_stream_length

    web = create_app(redis_server.url, namespace).test_client()
    cards = web.get("/rollq/api/rollouts").get_json()["cards"]
    assert cards["cancelled"] == 3
    assert sum(cards[status.value] for status in RolloutStatus) == 3
    page = web.get("/rollq/").get_data(as_text=True)
    assert re.search(r'data-role="cancelled">cancelled<b[^>]*>3</b>', page), page


@pytest.mark.redis
def test_task_missing_results_are_counted_on_the_dashboard_summary_as_in_status_and_metrics(
    redis_server: RedisServer, namespace: str
) -> None:
    # The operator's audit: `rollq status` and /metrics count the results kept because Redis had lost their task
    # record (reason task-missing, docs/reliability.md), the dashboard's summary did not show them at all.
    producer = Producer.from_url(redis_server.url, namespace)
    producer.connection.hincrby(producer.keys.stats, StatsField.TASK_MISSING, 2)  # as the finish script counts them

    s = snapshot(producer.connection, producer.keys)
    assert s.task_missing == 2 and "reason task-missing" in render_text(s)
    assert "rollq_task_missing_total" in render_prometheus(s)

    web = create_app(redis_server.url, namespace).test_client()
    cards = web.get("/rollq/api/rollouts").get_json()["cards"]
    assert cards["task-missing"] == 2
    assert sum(cards[status.value] for status in RolloutStatus) == 0  # not a published rollout
    page = web.get("/rollq/").get_data(as_text=True)
    assert re.search(r'data-role="task-missing"[^>]*>task-missing<b[^>]*>2</b>', page), page


@pytest.mark.redis
def test_a_worker_a_reaper_marked_is_listed_dead_until_it_heartbeats_again(
    redis_server: RedisServer, namespace: str
) -> None:
    # A reaper's mark (it took the worker's attempts for want of heartbeats) counts only while it is newer than the
    # worker's last heartbeat: a worker that was only stalled is alive again at its next beat.
    producer = Producer.from_url(redis_server.url, namespace)
    worker = Worker([Queue(namespace, connection=producer.connection)], connection=producer.connection)
    worker.register_birth()
    try:
        worker.heartbeat()

        def row() -> dict[str, Any]:
            (found,) = [w for w in snapshot(producer.connection, producer.keys).workers if w["name"] == worker.name]
            return found

        assert row()["alive"] and row()["reaped_at"] is None
        reaped_at = worker.last_heartbeat.timestamp() + 0.5
        producer.connection.set(producer.keys.reaped_worker(worker.name), repr(reaped_at))
        assert (row()["alive"], row()["reaped_at"]) == (False, reaped_at)
        time.sleep(0.6)
        worker.heartbeat()
        assert row()["alive"] and row()["reaped_at"] is None
    finally:
        worker.register_death()


@pytest.mark.redis
def test_status_with_a_results_trim_hash_of_another_type_shows_everything_else_and_names_the_key(
    redis_server: RedisServer, namespace: str
) -> None:
    # `rollq groups` names a damaged trim hash and fails; `rollq status`, /metrics and the dashboard read the same
    # groups on every call, and one auxiliary key of another type failed all of them.
    producer = Producer.from_url(redis_server.url, namespace)
    producer.enqueue({"n": 1})
    producer.connection.xgroup_create(producer.keys.results, "trainer", id="0", mkstream=True)
    producer.connection.rpush(producer.keys.results_trim, "not a hash")

    s = snapshot(producer.connection, producer.keys)
    assert s.queued == 1 and s.consumer_groups == []
    assert s.consumer_groups_error is not None and producer.keys.results_trim in s.consumer_groups_error
    assert f"consumer groups   unreadable: {s.consumer_groups_error}" in render_text(s)
    assert "rollq_queue_depth{" in render_prometheus(s)
    assert create_app(redis_server.url, namespace).test_client().get("/rollq/api/rollouts").status_code == 200


@pytest.mark.redis
def test_listing_registered_workers_leaves_a_scrape_connections_socket_timeout_alone(
    redis_server: RedisServer, namespace: str
) -> None:
    # CI: RQ's Worker.__init__ raises its connection's socket timeout to 415 s (the dequeue timeout + 10), and
    # Worker.all builds one per registered worker. /metrics, `rollq status --watch` and the dashboard read Redis with
    # a 3 s timeout so that a stalled Redis is a 503 within seconds: after one listing with a worker registered, a
    # stall hung each of them for 415 s.
    from rollq.ops.metrics import SCRAPE_SOCKET_TIMEOUT_SECONDS, scrape_connection

    producer = Producer.from_url(redis_server.url, namespace)
    worker = Worker([Queue(namespace, connection=producer.connection)], connection=producer.connection)
    worker.register_birth()
    try:
        connection = scrape_connection(redis_server.url)
        assert [w["name"] for w in snapshot(connection, producer.keys).workers] == [worker.name]
        app = create_app(redis_server.url, namespace)
        assert app.test_client().get("/0/view/workers").status_code == 200
        assert app.test_client().get("/0/data/workers.json").status_code == 200
        for pool in (connection.connection_pool, app.config["ROLLQ_CONNECTION"].connection_pool):
            assert pool.connection_kwargs["socket_timeout"] == SCRAPE_SOCKET_TIMEOUT_SECONDS
    finally:
        worker.register_death()
