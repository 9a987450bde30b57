"""``/metrics``, the dashboard's polled JSON and rq-dashboard's pages and JSON answer a 503 naming Redis within
seconds while Redis stalls, rather than hanging past a Prometheus scrape timeout (or a browser's patience)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rollq.producer import Producer
from tests.support.dashboard import Dashboard
from tests.support.servers import ROLLQ, RedisServer, free_port
from tests.support.waiting import wait_until

PROMETHEUS_SCRAPE_TIMEOUT = 10.0
"""Prometheus's default ``scrape_timeout``: an answer later than this is a timeout to it, not a failure."""


def _status(url: str) -> tuple[int, str, float]:
    """The HTTP status, body and seconds taken of a GET of ``url`` (a client that waits at most 40 s)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=40) as response:
            return response.status, response.read().decode(), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), time.monotonic() - started


def _answers(url: str) -> bool:
    try:
        return _status(url)[0] == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def _while_stalled(server: RedisServer, urls: list[str]) -> dict[str, tuple[int, str, float]]:
    """What a GET of each of ``urls``, all at once, answers while ``server`` is SIGSTOPped (connections to it are
    accepted by the kernel, and nothing is ever read or answered)."""
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(len(urls)) as pool:
            return dict(zip(urls, pool.map(_status, urls), strict=True))
    finally:
        server.process.send_signal(signal.SIGCONT)


def _assert_503_naming_redis(stalled: dict[str, tuple[int, str, float]]) -> None:
    for url, (status, body, seconds) in stalled.items():
        assert status == 503, (url, status, body[:300])
        assert seconds < PROMETHEUS_SCRAPE_TIMEOUT, (url, seconds)
        assert "Redis" in body and len(body.strip().splitlines()) == 1 and "Traceback" not in body, (url, body)


@pytest.mark.redis
def test_metrics_and_dashboard_json_answer_503_naming_redis_while_redis_stalls(
    own_redis: Callable[..., RedisServer], namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An outside audit: with redis-server SIGSTOPped, /metrics (of `rollq metrics` and of the dashboard) and
    # /rollq/api/workers hung 30 s or more, so that Prometheus saw a scrape timeout rather than a failure.
    server = own_redis()
    Producer.from_url(server.url, namespace).enqueue({"n": 1})
    port = free_port()
    exporter_log = tmp_path / "metrics.log"
    with open(exporter_log, "wb") as log:
        exporter = subprocess.Popen(
            [ROLLQ, "--url", server.url, "-n", namespace, "metrics", "--port", str(port)], stderr=log
        )
    monkeypatch.setenv("ROLLQ_NAMESPACE", namespace)
    dashboard = Dashboard(server.url, tmp_path / "dashboard.log")
    urls = [
        f"http://127.0.0.1:{port}/metrics",
        f"{dashboard.base}/metrics",
        f"{dashboard.base}/rollq/api/workers",
    ]
    try:
        wait_until(lambda: _answers(urls[0]), "rollq metrics", timeout=60)
        assert all(_answers(url) for url in urls)  # each server's connection to Redis is open and pooled
        _assert_503_naming_redis(_while_stalled(server, urls))
        wait_until(lambda: all(_answers(url) for url in urls), "the servers again once Redis answers", timeout=30)
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
        dashboard.stop()
    for log_text in (exporter_log.read_text(), dashboard.log()):
        assert "503" in log_text and "Redis" in log_text, log_text[-2000:]


@pytest.mark.redis
def test_rq_dashboards_pages_and_json_answer_503_naming_redis_while_redis_stalls(
    own_redis: Callable[..., RedisServer], namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's audit: with redis-server SIGSTOPped, rq-dashboard's own pages and JSON (its queue list, the
    # workers, a job) hung as long as the browser waited: rq-dashboard built its connection without a socket timeout.
    server = own_redis()
    producer = Producer.from_url(server.url, namespace)
    job = producer.keys.job_id(producer.enqueue({"n": 1}).rollout_id)
    monkeypatch.setenv("ROLLQ_NAMESPACE", namespace)
    dashboard = Dashboard(server.url, tmp_path / "dashboard.log")
    urls = [
        f"{dashboard.base}{path}"
        for path in (
            "/",
            "/0/view/workers",
            "/0/data/queues.json",
            "/0/data/workers.json",
            f"/0/data/jobs/{namespace}/queued/8/asc/1.json",
            f"/0/data/job/{job}.json",
            f"/0/view/job/{job}",
        )
    ]
    try:
        assert all(_answers(url) for url in urls)
        stalled = _while_stalled(server, urls)
        _assert_503_naming_redis(stalled)
        for url, (_, body, _) in stalled.items():  # the JSON rq-dashboard's scripts poll answers JSON
            assert not url.endswith(".json") or json.loads(body)["error"].startswith("Redis did not answer"), body
        wait_until(lambda: all(_answers(url) for url in urls), "rq-dashboard again once Redis answers", timeout=30)
    finally:
        dashboard.stop()
    assert "503" in dashboard.log() and "Redis" in dashboard.log(), dashboard.log()[-2000:]
