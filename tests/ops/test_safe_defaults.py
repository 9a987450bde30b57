"""With no URL, rollq uses redis://localhost:6379/0 (never a throwaway in-process Redis), names the Redis it
uses, fails fast on a peer that never answers, and stock `rq worker` follows ROLLQ_REDIS_URL.

Each subprocess that could reach localhost:6379 runs in a network namespace of its own (tests/support/isolated.py).
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from rollq.store.connection import DEFAULT_URL, resolve_url
from tests.support.isolated import run_isolated
from tests.support.servers import REPO, ROLLQ, free_port

EXAMPLES = REPO / "examples"
pytestmark = pytest.mark.redis


def test_without_any_url_the_default_is_local_redis_not_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ROLLQ_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)

    assert resolve_url() == DEFAULT_URL == "redis://localhost:6379/0"


def test_commands_without_a_url_use_localhost_6379_and_fail_loudly_when_nothing_is_there() -> None:
    done = run_isolated(
        f"{ROLLQ} resources list || echo rc=$?; echo '{{\"input\": 1}}' | {ROLLQ} enqueue || echo rc=$?"
    )

    lines = done.stdout.split()
    assert lines == ["rc=3", "rc=3"], done
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 2 and all(
        e.startswith("rollq: cannot reach Redis at redis://localhost:6379/0") for e in errors
    )


def test_without_a_url_tasks_land_in_the_redis_on_localhost_and_every_process_names_it() -> None:
    script = f"""
    start_redis 6379
    echo '{{"input": 1, "rollout_id": "first"}}' | {ROLLQ} --log-level INFO enqueue --mode train
    redis-cli -p 6379 llen rq:queue:rollq
    {ROLLQ} worker --agent rollq.worker.sample_agent:SampleAgent --burst 2>&1 | grep -o 'Redis at [^ ]*' | head -1
    {ROLLQ} task first | head -2
    """
    done = run_isolated(script)

    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")
    assert out[0] == "first" and out[1] == "1", done.stdout
    assert "Redis at redis://localhost:6379/0" in done.stderr  # the enqueue's INFO line
    assert "Redis at redis://localhost:6379/0" in out[2]
    assert out[3].split() == ["task", "first"] and out[4].split()[0] == "state", done.stdout


@pytest.fixture
def silent_peer() -> Iterator[int]:
    """A TCP port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_a_peer_that_never_answers_fails_within_seconds_in_one_line(silent_peer: int) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [ROLLQ, "--url", f"redis://:secret@127.0.0.1:{silent_peer}/0", "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started

    assert done.returncode == 3
    (line,) = done.stderr.strip().splitlines()
    assert (
        line.startswith(f"rollq: cannot reach Redis at redis://:***@127.0.0.1:{silent_peer}/0") and "secret" not in line
    )
    assert "within 5s" in line
    assert took < 15, took


class _Http(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_url_pointing_at_some_other_service_is_one_line() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Http)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = subprocess.run(
            [ROLLQ, "--url", f"redis://127.0.0.1:{server.server_port}/0", "resources", "list"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.shutdown()

    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("rollq: cannot reach Redis at"), line


def test_stock_rq_worker_without_url_follows_rollq_redis_url_and_logs_it_masked() -> None:
    url = "redis://:pw-4711@127.0.0.1:6390/0"
    script = f"""
    start_redis 6390 pw-4711
    {ROLLQ} -n ops resources set {EXAMPLES}/resources.json >/dev/null
    echo '{{"input": {{"a": 1, "b": 2}}, "rollout_id": "r1"}}' | {ROLLQ} -n ops enqueue --mode train >/dev/null 2>&1
    ROLLQ_AGENT=rollq.worker.sample_agent:SampleAgent \\
        rq worker -w rollq.worker.RolloutWorker --burst ops > worker.log 2>&1
    {ROLLQ} -n ops task r1 | grep '^state'
    grep -o 'Redis at [^ ]*' worker.log | head -1
    grep -c pw-4711 worker.log || true
    """
    done = run_isolated(script, env={"ROLLQ_REDIS_URL": url}, cwd=Path(_tmpdir()))

    assert done.returncode == 0, done.stderr
    state, redis_line, password_hits = done.stdout.strip().splitlines()
    assert state.split() == ["state", "succeeded"], done.stdout
    assert redis_line == "Redis at redis://:***@127.0.0.1:6390/0"
    assert password_hits == "0"


def test_stock_rq_worker_given_another_redis_than_rollq_redis_url_refuses_to_start() -> None:
    script = """
    start_redis 6390
    ROLLQ_AGENT=rollq.worker.sample_agent:SampleAgent rq worker -w rollq.worker.RolloutWorker \\
        --url redis://127.0.0.1:6390/1 --burst ops > worker.log 2>&1 && echo started || echo refused
    grep -o 'ROLLQ_REDIS_URL is [^:]*' worker.log | head -1
    """
    done = run_isolated(script, env={"ROLLQ_REDIS_URL": "redis://127.0.0.1:6390/0"}, cwd=Path(_tmpdir()))

    assert done.stdout.split("\n")[:2] == ["refused", "ROLLQ_REDIS_URL is redis"], done


def _tmpdir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="rollq-test-")


def test_dashboard_refuses_to_start_when_redis_is_unreachable() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [ROLLQ, "--url", f"redis://127.0.0.1:{free_port()}/0", "dashboard", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 3
    assert done.stderr.strip().startswith("rollq: cannot reach Redis"), done.stderr
    assert time.monotonic() - started < 15
