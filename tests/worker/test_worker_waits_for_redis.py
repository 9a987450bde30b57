"""Workers started before their Redis (or during a failover) wait for it, bounded by ROLLQ_REDIS_WAIT_SECONDS and
logged, instead of exiting at once: both `rollq worker` and a stock `rq worker -w rollq.worker.RolloutWorker`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollq.producer import Producer
from tests.support.servers import REPO, RedisServer, free_port

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
