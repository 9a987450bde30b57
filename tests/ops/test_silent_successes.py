"""No silent successes: `--url memory:// enqueue` is refused (it said "queued 4" into a Redis that vanished),
other commands on memory:// warn; a misspelt namespace gets a hint, in `rollq status` and in a worker's log."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import pytest

from rollq.producer import Producer
from tests.support.servers import ROLLQ, RedisServer, WorkerProcess


def _rollq(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([ROLLQ, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_enqueue_into_memory_is_refused_in_one_line() -> None:
    done = _rollq("--url", "memory://", "enqueue", stdin='{"input": 1}\n' * 4)
    assert done.returncode == 1 and "queued" not in done.stdout, done
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rollq: memory:// is a Redis inside this one `rollq enqueue` process"), line


def test_other_commands_on_memory_warn() -> None:
    done = _rollq("--url", "memory://", "resources", "list")
    assert done.returncode == 0
    assert "memory:// is a Redis inside this one `rollq resources list` process" in done.stderr


@pytest.mark.redis
def test_a_misspelt_namespace_gets_a_hint_in_status_and_in_the_worker_log(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    Producer.from_url(redis_server.url, namespace).enqueue({"sleep": 0})
    typo = namespace[:-1]
    done = _rollq("--url", redis_server.url, "-n", typo, "status")
    assert done.returncode == 0
    assert (
        f"rollq: namespace {typo!r} holds nothing here" in done.stderr and f"did you mean {namespace!r}?" in done.stderr
    )
    # The right one gets no hint.
    assert "holds nothing" not in _rollq("--url", redis_server.url, "-n", namespace, "status").stderr

    worker = workers(redis_server.url, typo, env={"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"})
    deadline = time.monotonic() + 30
    while f"did you mean {namespace!r}?" not in worker.log():
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.1)
