"""The README's first `rq worker -w rollq.worker.RolloutWorker` command, done wrong the common ways: one clear
line, no traceback (RQ's CLI prints one for any setup error)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import REPO, RedisServer

RQ = str(Path(sys.executable).parent / "rq")


def _rq_worker(url: str, *queues: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("ROLLQ_AGENT", "ROLLQ_REDIS_URL", "REDIS_URL")}
    return subprocess.run(
        [RQ, "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, "--burst", *queues],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**base, **env},
    )


@pytest.mark.redis
def test_no_agent_is_one_line(redis_server: RedisServer, namespace: str) -> None:
    done = _rq_worker(redis_server.url, namespace)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "rollq: no agent configured: set ROLLQ_AGENT=package.module:AgentClass" in done.stderr


@pytest.mark.redis
def test_a_rollq_url_that_disagrees_with_rq_url_is_one_line(redis_server: RedisServer, namespace: str) -> None:
    done = _rq_worker(
        redis_server.url,
        namespace,
        ROLLQ_AGENT="tests.support.fault_agents:FaultAgent",
        ROLLQ_REDIS_URL="redis://127.0.0.1:1/0",
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "rollq: " in done.stderr and "ROLLQ_REDIS_URL" in done.stderr


@pytest.mark.redis
def test_an_rq_worker_without_a_queue_name_gets_a_hint(redis_server: RedisServer) -> None:
    done = _rq_worker(redis_server.url, ROLLQ_AGENT="tests.support.fault_agents:FaultAgent")
    said = done.stdout + done.stderr
    assert "no queue name given" in said and "e.g. `... rollq`" in said, said
