"""``/metrics``, the dashboard's polled JSON and rq-dashboard's pages and JSON answer a 503 naming Redis within
seconds while Redis stalls, rather than hanging past a Prometheus scrape timeout (or a browser's patience);
``rollq status --watch`` says Redis is not answering within seconds, and goes on once it answers."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest

from rollq.producer import Producer
from tests.support.browser import chromium, require_chromium
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


@pytest.mark.redis
def test_rq_dashboards_pages_and_json_answer_503_naming_redis_while_redis_is_down(
    own_redis: Callable[..., RedisServer], namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's audit: with redis-server stopped (connection refused, not stalled), rq-dashboard's front page
    # `/` still answered 200 with a page that only said "Connection Error": a load balancer's check saw it healthy.
    server = own_redis()
    Producer.from_url(server.url, namespace).enqueue({"n": 1})
    monkeypatch.setenv("ROLLQ_NAMESPACE", namespace)
    dashboard = Dashboard(server.url, tmp_path / "dashboard.log")
    urls = [
        f"{dashboard.base}{path}"
        for path in ("/", "/0/", "/0/view/queues", "/0/view/workers", "/0/data/queues.json", "/rollq/")
    ]
    try:
        assert all(_answers(url) for url in urls)
        server.stop()
        with ThreadPoolExecutor(len(urls)) as pool:
            down = dict(zip(urls, pool.map(_status, urls), strict=True))
        _assert_503_naming_redis(down)
        for url, (_, body, _) in down.items():
            assert "Connection Error" not in body and "refused" in body, (url, body)
            assert not url.endswith(".json") or json.loads(body)["error"].startswith("Redis did not answer"), body
        server.start()
        wait_until(lambda: all(_answers(url) for url in urls), "rq-dashboard again once Redis is back", timeout=30)
    finally:
        dashboard.stop()
    assert "503" in dashboard.log() and "Redis" in dashboard.log(), dashboard.log()[-2000:]


def _forward(url: str) -> tuple[int, str, bytes]:
    """The status, content type and body of a GET of ``url``."""
    try:
        with urllib.request.urlopen(url, timeout=40) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


class _StallingProxy:
    """An HTTP proxy in front of ``dashboard`` that SIGSTOPs ``server`` (Redis) for each of the first ``polls`` GETs
    of a page's JSON (``/rollq/api/...``) it passes on, and SIGCONTs it when the answer is back: a browser polls a
    page it loaded while Redis answered, and the next ``polls`` polls meet a stalled Redis."""

    def __init__(self, dashboard: Dashboard, server: RedisServer, polls: int) -> None:
        self.stalled: list[int] = []  # the status of each stalled poll
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                stall = self.path.startswith("/rollq/api/") and len(proxy.stalled) < polls
                assert server.process is not None
                if stall:
                    server.process.send_signal(signal.SIGSTOP)
                try:
                    status, kind, data = _forward(dashboard.base + self.path)
                finally:
                    if stall:
                        server.process.send_signal(signal.SIGCONT)
                if stall:
                    proxy.stalled.append(status)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.base = f"http://127.0.0.1:{self.http.server_port}"
        Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def _banner(dom: str) -> str:
    """The text of the page's poll-failure banner, or ``""`` while it is hidden."""
    found = re.search(r'<div[^>]*data-role="poll-failed"([^>]*)>(.*?)</div>', dom, re.S)
    assert found, dom[-3000:]
    return "" if "hidden" in found.group(1) else " ".join(found.group(2).split())


@pytest.mark.redis
@pytest.mark.browser
@pytest.mark.slow
def test_dashboard_page_shows_a_banner_while_its_polls_fail_and_clears_it_when_they_answer(
    own_redis: Callable[..., RedisServer], namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's audit: while Redis stalled, each poll of the rollouts page failed (503), and the page went on
    # showing the numbers of its last good poll as if they were current, with no word of it.
    browser = require_chromium()
    server = own_redis()
    Producer.from_url(server.url, namespace).enqueue({"n": 1})
    monkeypatch.setenv("ROLLQ_NAMESPACE", namespace)
    dashboard = Dashboard(server.url, tmp_path / "dashboard.log")
    try:
        # Every poll in the page's 12 s (two, 5 s apart) meets a stalled Redis: the banner says so, and why.
        failing = _StallingProxy(dashboard, server, polls=100)
        try:
            dom = chromium(browser, tmp_path / "profile-a", failing.base + "/rollq/", virtual_ms=12_000)
        finally:
            failing.close()
        assert failing.stalled and set(failing.stalled) == {503}, failing.stalled
        banner = _banner(dom)
        assert re.search(r"Redis not answering since \d\d:\d\d:\d\d UTC", banner), banner
        assert re.search(r"last update \d\d:\d\d:\d\d UTC failed: 503 Redis did not answer", banner), banner
        assert 'data-failed-polls="' in dom

        # Only the first poll fails: the banner went up, and down again with the next poll's answer.
        once = _StallingProxy(dashboard, server, polls=1)
        try:
            dom = chromium(browser, tmp_path / "profile-b", once.base + "/rollq/", virtual_ms=12_000)
        finally:
            once.close()
        assert once.stalled == [503], once.stalled
        assert _banner(dom) == "", dom[-3000:]
        assert 'data-failed-polls="1"' in dom and 'data-polled="' in dom, dom[-3000:]
    finally:
        dashboard.stop()


@pytest.mark.redis
def test_status_watch_says_redis_is_not_answering_within_seconds_and_resumes_when_it_answers(
    own_redis: Callable[..., RedisServer], namespace: str, tmp_path: Path
) -> None:
    # An operator's audit: with redis-server SIGSTOPped in the middle of `rollq status --watch`, the watch waited out
    # the 30 s socket timeout, retried, and printed nothing meanwhile (only its first reachability check was quick).
    server = own_redis()
    Producer.from_url(server.url, namespace).enqueue({"n": 1})
    output = tmp_path / "watch.out"
    with open(output, "wb") as out:
        watch = subprocess.Popen(
            [ROLLQ, "--url", server.url, "-n", namespace, "status", "--watch", "0.5"], stdout=out, stderr=out
        )
    assert server.process is not None
    try:
        wait_until(lambda: output.read_text().count(f"namespace {namespace}") >= 2, "two refreshes", timeout=30)
        server.process.send_signal(signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            line = wait_until(
                lambda: re.search(r"Redis not answering since (\d\d:\d\d:\d\d)", output.read_text()),
                "the watch to say Redis is not answering",
                timeout=15,
            )
            assert time.monotonic() - stopped < 8, output.read_text()[-2000:]
            assert "TimeoutError" in output.read_text()[line.start() :], line.group(0)  # it names what went wrong
            time.sleep(4)  # the watch goes on while Redis stalls, each refresh bounded
            assert watch.poll() is None, output.read_text()[-2000:]
            assert output.read_text().count("Redis not answering since") >= 2, output.read_text()[-2000:]
        finally:
            server.process.send_signal(signal.SIGCONT)
        stalled_at = output.read_text().rindex("Redis not answering since")
        wait_until(lambda: f"namespace {namespace}" in output.read_text()[stalled_at:], "a fresh refresh", timeout=15)
        assert watch.poll() is None and "Traceback" not in output.read_text(), output.read_text()[-2000:]
    finally:
        watch.terminate()
        watch.wait(timeout=30)
