"""Metrics through prometheus_client: exact values, escaped labels, the same registry printed by
`status --prometheus` and served on /metrics by `rollq metrics` and `rollq dashboard`."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollq.ops.metrics import render_prometheus
from rollq.ops.status import snapshot
from rollq.producer import Producer
from tests.support.servers import ROLLQ, RedisServer, WorkerProcess, free_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.mark.redis
def test_large_counters_and_odd_label_values_read_back_exactly(redis_server: RedisServer, namespace: str) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    client = producer.connection
    # 1,234,567 read back as 1,234,570 with the old %g formatting.
    client.hset(producer.keys.stats, mapping={"succeeded:train": 1234567, "failed:val": 9007199254740991})
    group = 'trainers "west"\\eu\nnight'
    client.xadd(producer.keys.results, {"rollout_id": "x", "rollout": "{}"})
    client.xgroup_create(producer.keys.results, group, id="0")

    samples = parse(render_prometheus(snapshot(client, producer.keys)))

    assert value(samples, "rollq_rollouts_total", namespace=namespace, status="succeeded", mode="train") == 1234567
    assert value(samples, "rollq_rollouts_total", namespace=namespace, status="failed", mode="val") == 9007199254740991
    assert value(samples, "rollq_consumer_group_lag", namespace=namespace, group=group) == 1
    assert value(samples, "rollq_results_stream_length", namespace=namespace) == 1
    assert value(samples, "rollq_results_stream_memory_bytes", namespace=namespace) > 0


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        SERVERS.append(response.headers.get("Server", ""))
        return response.read().decode()


SERVERS: list[str] = []


def _wait_for_http(url: str, process: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, process.communicate()
        try:
            return _get(url)
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.2)


@pytest.mark.redis
def test_metrics_exporter_and_dashboard_serve_reward_workers_in_flight_and_lag(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    v1 = producer.update_resources({"m": {"resource_type": "llm", "endpoint": "http://x", "model": "a"}})
    worker = workers(
        redis_server.url,
        namespace,
        env={
            "ROLLQ_AGENT": "tests.support.dashboard_agents:WorkloadAgent",
            "ROLLQ_CONCURRENCY": "4",
            "ROLLQ_GRACE_SECONDS": "0",
        },
    )
    ids = [t.rollout_id for t in producer.enqueue_many([{"q": 2}, {"q": 4}, {"q": 9}], mode="train", resources_id=v1)]
    ids.append(producer.enqueue({"q": 5}, mode="val").rollout_id)
    producer.wait(ids, timeout=60)
    producer.connection.xgroup_create(producer.keys.results, "trainers", id="0")
    held = producer.enqueue({"hold": True}, mode="train").rollout_id
    deadline = time.monotonic() + 30
    while producer.get_task(held).num_claims != 1:
        assert time.monotonic() < deadline and worker.process.poll() is None, worker.log()
        time.sleep(0.05)

    port = free_port()
    base = [ROLLQ, "--url", redis_server.url, "-n", namespace]
    exporter = subprocess.Popen([*base, "metrics", "--port", str(port)], stderr=subprocess.PIPE, text=True)
    dash_port = free_port()
    dashboard = subprocess.Popen([*base, "dashboard", "--port", str(dash_port)], stderr=subprocess.PIPE, text=True)
    try:
        served = parse(_wait_for_http(f"http://127.0.0.1:{port}/metrics", exporter))
        from_dashboard = parse(_wait_for_http(f"http://127.0.0.1:{dash_port}/metrics", dashboard))
    finally:
        for process in (exporter, dashboard):
            process.terminate()
            process.wait(timeout=30)
    printed = subprocess.run([*base, "status", "--prometheus"], capture_output=True, text=True, timeout=60)
    assert SERVERS[-1] == "waitress"  # the dashboard runs under a production WSGI server, not Flask's

    for samples in (served, from_dashboard, parse(printed.stdout)):
        ns = namespace
        assert value(samples, "rollq_reward_count", namespace=ns, mode="train", resources_id=v1) == 3
        assert value(samples, "rollq_reward_sum", namespace=ns, mode="train", resources_id=v1) == pytest.approx(1.5)
        assert value(samples, "rollq_reward_bucket", namespace=ns, mode="train", resources_id=v1, le="0.25") == 1
        assert value(samples, "rollq_reward_bucket", namespace=ns, mode="train", resources_id=v1, le="0.5") == 2
        assert value(samples, "rollq_reward_count", namespace=ns, mode="val", resources_id=v1) == 1
        assert value(samples, "rollq_workers_alive", namespace=ns) == 1
        assert value(samples, "rollq_in_flight", namespace=ns) == 1
        assert value(samples, "rollq_consumer_group_lag", namespace=ns, group="trainers") == 4
        assert value(samples, "rollq_results_stream_bytes", namespace=ns) > 0
        assert value(samples, "rollq_results_stream_memory_bytes", namespace=ns) > 0
        assert sum(v for (name, _), v in samples.items() if name == "rollq_worker_in_flight") == 1


def test_status_json_and_prometheus_together_is_a_usage_error() -> None:
    done = subprocess.run(
        [ROLLQ, "--url", "memory://", "status", "--json", "--prometheus"], capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 2
    assert "--json and --prometheus" in done.stderr


@pytest.mark.redis
def test_reward_metric_labels_the_newest_versions_folds_the_rest_and_buckets_negative_rewards(
    redis_server: RedisServer, namespace: str
) -> None:
    from rollq.store.keys import Keys
    from rollq.store.stats import reward_bucket, reward_stat

    keys = Keys(namespace)
    client = redis_server.client()
    for n in range(1, 13):  # v1 .. v12, two rollouts each: -0.6 and 0.5 + n/100
        for reward in (-0.6, 0.5 + n / 100):
            client.hincrby(keys.stats, reward_stat("train", f"v{n}", reward_bucket(reward)), 1)
            client.hincrbyfloat(keys.stats, reward_stat("train", f"v{n}", "sum"), reward)

    text = render_prometheus(snapshot(Producer.from_url(redis_server.url, namespace).connection, keys))
    samples = parse(text)

    versions = {dict(labels)["resources_id"] for name, labels in samples if name == "rollq_reward_count"}
    assert versions == {"v8", "v9", "v10", "v11", "v12", "older"}  # before: one series set per version, forever
    assert text.index('resources_id="v9"') < text.index('resources_id="v10"')  # numeric order
    labels = {"namespace": namespace, "mode": "train"}
    assert value(samples, "rollq_reward_count", **labels, resources_id="older") == 14
    assert value(samples, "rollq_reward_sum", **labels, resources_id="v12") == pytest.approx(-0.6 + 0.62)
    # Negative rewards have buckets of their own (before: all in le="0.0").
    assert value(samples, "rollq_reward_bucket", **labels, resources_id="v12", le="-0.75") == 0
    assert value(samples, "rollq_reward_bucket", **labels, resources_id="v12", le="-0.5") == 1
    assert value(samples, "rollq_reward_bucket", **labels, resources_id="v12", le="+Inf") == 2
