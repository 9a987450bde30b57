"""``/metrics`` and the dashboard's polled JSON answer a 503 naming Redis within seconds while Redis stalls, rather
than hanging past a Prometheus scrape timeout."""

from __future__ import annotations

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
    assert server.process is not None
    try:
        wait_until(lambda: _answers(urls[0]), "rollq metrics", timeout=60)
        assert all(_answers(url) for url in urls)  # each server's connection to Redis is open and pooled

        server.process.send_signal(signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(len(urls)) as pool:
                stalled = dict(zip(urls, pool.map(_status, urls), strict=True))
        finally:
            server.process.send_signal(signal.SIGCONT)

        for url, (status, body, seconds) in stalled.items():
            assert status == 503, (url, status, body[:300])
            assert seconds < PROMETHEUS_SCRAPE_TIMEOUT, (url, seconds)
            assert "Redis" in body and len(body.strip().splitlines()) == 1 and "Traceback" not in body, (url, body)
        wait_until(lambda: all(_answers(url) for url in urls), "the servers again once Redis answers", timeout=30)
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
        dashboard.stop()
    for log_text in (exporter_log.read_text(), dashboard.log()):
        assert "503" in log_text and "Redis" in log_text, log_text[-2000:]
