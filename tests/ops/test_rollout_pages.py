"""rollq's own dashboard pages (rollouts, one rollout, workers, charts) under a live workload with failures, an
in-flight rollout and a dead worker, rendered in real headless Chromium; screenshots in docs/screenshots/."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rq.utils import utcformat

from rollq.producer import Producer
from tests.support.browser import chromium, rendered_rows, require_chromium
from tests.support.dashboard import SCREENSHOTS, Dashboard
from tests.support.servers import RedisServer, WorkerProcess
from tests.support.waiting import wait_until

AGENT = {
    "ROLLQ_AGENT": "tests.support.dashboard_agents:WorkloadAgent",
    "ROLLQ_CONCURRENCY": "4",
    "ROLLQ_GRACE_SECONDS": "0",
}
LLM = {"main_llm": {"resource_type": "llm", "endpoint": "http://llm:8000/v1", "model": "policy"}}


@pytest.mark.redis
@pytest.mark.browser
@pytest.mark.slow
def test_rollout_pages_show_rollouts_errors_triplets_trace_workers_and_charts_in_a_browser(
    redis_server: RedisServer,
    namespace: str,
    workers: Callable[..., WorkerProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    browser = require_chromium()
    producer = Producer.from_url(redis_server.url, namespace)
    client = producer.connection
    doomed = workers(redis_server.url, namespace, env=AGENT, args=["--name", f"doomed-{namespace}"])
    # Up and running (its concurrency recorded), then killed.
    wait_until(
        lambda: client.hget(f"rq:worker:doomed-{namespace}", "rollq_concurrency") == b"4", "a worker", timeout=60
    )
    # A worker SIGKILLed: RQ keeps its key for minutes; its last heartbeat (moved 2 minutes back, as if that
    # much time had passed) is what marks it dead.
    doomed.signal(signal.SIGKILL)
    doomed.wait()
    dead_key = f"rq:worker:doomed-{namespace}"
    client.hset(dead_key, "last_heartbeat", utcformat(_minutes_ago(2)))
    worker = workers(redis_server.url, namespace, env=AGENT, args=["--name", f"live-{namespace}"])

    # Four waves two seconds apart, two per resources version: the charts get a line per version.
    v1 = producer.update_resources({**LLM, "main_llm": {**LLM["main_llm"], "model": "policy-step-1"}})
    first = _wave(producer, [1, 2, 3], "train") + _wave(producer, [4, 5, 2], "train")
    failed = producer.enqueue({"fail": "tool call returned HTTP 500"}, mode="train").rollout_id
    producer.wait([failed], timeout=60)
    time.sleep(2.1)
    v2 = producer.update_resources({**LLM, "main_llm": {**LLM["main_llm"], "model": "policy-step-2"}})
    second = _wave(producer, [6, 7, 8], "val") + _wave(producer, [9, 7], "val")
    held = producer.enqueue({"hold": True}, mode="train").rollout_id
    wait_until(lambda: producer.get_task(held).num_claims == 1, "the held rollout to start", timeout=60)
    assert worker.process.poll() is None, worker.log()

    monkeypatch.setenv("ROLLQ_NAMESPACE", namespace)
    dash = Dashboard(redis_server.url, tmp_path / "dashboard.log")
    try:
        base = f"{dash.base}/rollq"
        profile = tmp_path / "profile"

        def page(path: str, role: str) -> list[list[str]]:
            sep = "&" if "?" in path else "?"
            return rendered_rows(chromium(browser, profile, f"{base}{path}{sep}refresh=0"), role)

        rows = page("/", "rollout")
        by_id = {r[0]: r for r in rows}
        assert set(by_id) == {*first, failed, *second}
        # Columns: rollout, status, mode, resources, reward, attempt, duration, finished, error.
        assert (
            by_id[failed][1:4] == ["failed", "train", v1]
            and by_id[failed][8] == "ValueError: tool call returned HTTP 500"
        )
        assert by_id[second[0]][1:5] == ["succeeded", "val", v2, "0.600"] and by_id[second[0]][5] == "1"
        assert by_id[first[0]][6].endswith("s") and by_id[first[0]][8] == ""
        assert {r[0] for r in page("/?status=failed", "rollout")} == {failed}
        assert {r[0] for r in page(f"/?resources_id={v2}", "rollout")} == set(second)
        assert {r[0] for r in page("/?mode=train&status=succeeded", "rollout")} == set(first)

        triplets = page(f"/rollout/{second[1]}", "triplet")
        # Columns: #, prompt, prompt tokens, response, response tokens, reward.
        assert triplets == [["1", "question 7", "5", "7", "2", "-"], ["2", "check 7", "7", "ok", "1", "0.7"]]
        spans = page(f"/rollout/{second[1]}", "span")
        assert [s[0] for s in spans] == ["rollout", "chat sim-1", "chat sim-1"] and float(spans[0][1]) >= 50
        failed_dom = chromium(browser, profile, f"{base}/rollout/{failed}?refresh=0")
        assert "ValueError: tool call returned HTTP 500" in failed_dom and "&quot;fail&quot;" not in failed_dom
        assert '"fail": "tool call returned HTTP 500"' in failed_dom.replace("&#34;", '"').replace("&quot;", '"')

        # Columns: worker, state, in flight, concurrency, last heartbeat.
        workers_rows = {r[0]: r for r in page("/workers", "worker")}
        assert workers_rows[f"live-{namespace}"][1:4] == ["busy", "1", "4"]
        assert workers_rows[f"doomed-{namespace}"][1:4] == ["dead", "0", "4"]
        assert workers_rows[f"doomed-{namespace}"][4].endswith("s ago")

        charts = chromium(browser, profile, f"{base}/charts?bucket=2&refresh=0")
        # Throughput, then mean reward by version (x: the versions in numeric order), one line per mode.
        assert charts.count("<polyline") == 1 + 2
        assert charts.count("<circle") >= 3 + 1 + 1  # points: 3+ throughput buckets, train at v1, val at v2
        assert f'class="tick">{v1}</text>' in charts and f'class="tick">{v2}</text>' in charts
        assert ">train</text>" in charts and ">val</text>" in charts

        # The failed rollout's page: its attempt and the traceback ending at the agent's raise.
        attempts = page(f"/rollout/{failed}", "attempt")
        assert [a[0] for a in attempts] == ["1"] and attempts[0][4] == "failed"
        assert "Traceback (most recent call last)" in failed_dom and 'data-role="traceback"' in failed_dom

        shots = {
            "rollq-rollouts.png": "/",
            "rollq-rollout.png": f"/rollout/{second[1]}",
            "rollq-rollout-failed.png": f"/rollout/{failed}",
            "rollq-workers.png": "/workers",
            "rollq-charts.png": "/charts?bucket=2",
        }
        for name, path in shots.items():
            shot = tmp_path / name
            sep = "&" if "?" in path else "?"
            chromium(browser, profile, f"{base}{path}{sep}refresh=0", screenshot=shot)
            assert shot.read_bytes().startswith(b"\x89PNG")
            if os.environ.get("ROLLQ_UPDATE_SCREENSHOTS"):
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, SCREENSHOTS / name)
    finally:
        dash.stop()
        print(dash.log()[-3000:])


def _wave(producer: Producer, rewards_x10: list[int], mode: str) -> list[str]:
    ids = [t.rollout_id for t in producer.enqueue_many([{"q": q} for q in rewards_x10], mode=mode)]
    producer.wait(ids, timeout=60)
    time.sleep(2.1)  # the next wave lands in a later chart bucket
    return ids


def _minutes_ago(minutes: float):  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) - timedelta(minutes=minutes)
