"""Workers started before their Redis (or during a failover) wait for it, bounded by ROLLQ_REDIS_WAIT_SECONDS and
logged, instead of exiting at once: both `rollq worker` and a stock `rq worker -w rollq.worker.RolloutWorker`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rollq.producer import Producer
from tests.support.servers import REPO, RedisServer, WorkerProcess, free_port
from tests.support.waiting import wait_until

BIN = Path(sys.executable).parent
AGENT = "tests.support.fault_agents:FaultAgent"


def _command(kind: str, url: str, namespace: str) -> list[str]:
    if kind == "rollq worker":
        return [str(BIN / "rollq"), "--url", url, "-n", namespace, "worker", "--agent", AGENT]
    return [str(BIN / "rq"), "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, namespace]


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["rollq worker", "rq worker"])
def test_a_worker_started_before_redis_waits_for_it_then_runs_tasks(kind: str, tmp_path: Path, namespace: str) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    log_path = tmp_path / "worker.log"
    env = {**os.environ, "ROLLQ_AGENT": AGENT, "ROLLQ_REDIS_WAIT_SECONDS": "60", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            _command(kind, url, namespace), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
    server = RedisServer(tmp_path)
    try:
        deadline = time.monotonic() + 30
        while "waiting up to 60s for it (ROLLQ_REDIS_WAIT_SECONDS)" not in log_path.read_text():
            # Before: both exited at once (rc 1 for rq worker, 3 for rollq worker).
            assert worker.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        time.sleep(2)
        assert worker.poll() is None, log_path.read_text()
        server.port = port
        server.start()
        producer = Producer.from_url(url, namespace)
        rid = producer.enqueue({"sleep": 0}).rollout_id
        assert producer.wait([rid], timeout=60)[0].metadata["status"] == "succeeded", log_path.read_text()
        assert "answers after" in log_path.read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        server.stop()


@pytest.mark.parametrize("kind", ["rollq worker", "rq worker"])
def test_the_wait_is_bounded_by_the_setting(kind: str, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    env = {**os.environ, "ROLLQ_AGENT": AGENT, "ROLLQ_REDIS_WAIT_SECONDS": "1"}
    started = time.monotonic()
    done = subprocess.run(_command(kind, url, "nowhere"), capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert done.returncode != 0 and time.monotonic() - started < 20
    assert "waiting up to 1s for it" in done.stderr
    if kind == "rollq worker":
        (last,) = [line for line in done.stderr.splitlines() if line.startswith("rollq:")]
        assert "cannot reach Redis" in last and "waited 1s" in last


@pytest.mark.redis
def test_a_worker_logs_one_warning_when_it_loses_redis_and_one_line_when_it_is_back(
    own_redis: Callable[..., RedisServer], namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    # An operator's audit: a worker logged nothing while its Redis was down for 6 s (every thread's commands retried
    # in silence), so its log could not tell an outage from a quiet queue.
    server = own_redis(appendonly=True)
    env = {"ROLLQ_AGENT": AGENT, "ROLLQ_HEARTBEAT_SECONDS": "0.5", "ROLLQ_LOG_FORMAT": "json"}
    worker = workers(server.url, namespace, env=env)
    producer = Producer.from_url(server.url, namespace)
    [first] = producer.wait([producer.enqueue({"sleep": 0}).rollout_id], timeout=60)
    assert first.metadata["status"] == "succeeded"
    before = len(worker.log())

    server.restart(down_seconds=6)

    [after] = producer.wait([producer.enqueue({"sleep": 0}).rollout_id], timeout=60)
    assert after.metadata["status"] == "succeeded"
    wait_until(lambda: "Redis is back" in worker.log()[before:], "the worker to log that Redis is back", timeout=15)
    time.sleep(1)  # any late line of the outage
    entries = [json.loads(line) for line in worker.log()[before:].splitlines() if line.startswith("{")]
    lost = [e for e in entries if "lost Redis" in e["message"]]
    back = [e for e in entries if "Redis is back" in e["message"]]
    assert len(lost) == 1 and len(back) == 1, entries
    address = f"redis://127.0.0.1:{server.port}/0"
    assert lost[0]["level"] == "WARNING" and address in lost[0]["message"], lost[0]
    assert "Connection refused" in lost[0]["message"] or "Connection closed" in lost[0]["message"], lost[0]
    assert back[0]["level"] == "INFO" and address in back[0]["message"], back[0]
    seconds = float(re.search(r"after ([0-9.]+)s", back[0]["message"]).group(1))  # type: ignore[union-attr]
    assert 5 <= seconds < 30, back[0]
    others = [e for e in entries if e["level"] in ("WARNING", "ERROR", "CRITICAL") and e not in lost]
    assert not others, others
