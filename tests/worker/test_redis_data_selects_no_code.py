"""Nothing read from Redis decides which code a rollq worker imports or calls (issue 12, problem 5).

Anyone who can write to Redis can write RQ job hashes. RQ itself imports and
calls the functions those hashes name: failure callbacks when its registry
clean-up finds an abandoned job (at every worker start-up), success and
stopped callbacks, and it posts to the webhook URLs they list. These tests
write such hashes for a rollq queue, run a real worker (start-up, registry
clean-up, a refused job, a normal job) and check that nothing was imported,
called or contacted.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollq.producer.producer import Producer
from rollq.store.keys import Keys
from tests.support.servers import REPO

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}

EVIL_MODULE = """
import pathlib
HERE = pathlib.Path(__file__).parent
(HERE / "imported.marker").write_text("imported")


def fire(*args, **kwargs):
    (HERE / "called.marker").write_text(repr(args))
"""


@pytest.fixture
def evil_path(tmp_path: Path) -> Path:
    """A directory with a module whose import and whose function each leave a marker file."""
    directory = tmp_path / "evil"
    directory.mkdir()
    (directory / "evil_marker.py").write_text(EVIL_MODULE)
    return directory


@pytest.fixture
def webhook_hits() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server counting the requests it gets; yields (url, paths requested)."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        do_GET = do_PUT = do_POST  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", hits
    server.shutdown()


def _evil_fields(hook_url: str) -> dict[str, str]:
    return {
        "success_callback_name": "evil_marker.fire",
        "failure_callback_name": "evil_marker.fire",
        "stopped_callback_name": "evil_marker.fire",
        "webhooks": json.dumps(
            [{"url": hook_url, "job_status": "failed"}, {"url": hook_url, "job_status": "finished"}]
        ),
    }


def _job_hash(func: str, args: list[str], namespace: str, hook_url: str) -> dict[str, bytes | str]:
    return {
        "data": zlib.compress(json.dumps([func, None, args, {}]).encode()),
        "origin": namespace,
        "status": "started",
        "created_at": "2026-01-01T00:00:00.000000Z",
        "description": "written by someone who can write to Redis",
        "timeout": "180",
        **_evil_fields(hook_url),
    }


def test_callbacks_and_webhooks_named_in_job_hashes_are_never_run(
    redis_server, namespace, workers, evil_path, webhook_hits
):
    hook_url, hits = webhook_hits
    producer = Producer.from_url(redis_server.url, namespace)
    connection = producer.connection
    keys = Keys(namespace)
    # 1. An "abandoned" job in RQ's started registry, long expired: RQ's start-up clean-up runs its failure callback.
    connection.hset(Keys.rq_job("planted"), mapping=_job_hash("evil_marker.fire", [], namespace, hook_url))
    connection.zadd(f"rq:wip:{namespace}", {"planted:exec-1": 1})
    # 2. A genuine rollq job whose hash someone extended with callbacks and webhooks: it runs and succeeds.
    task = producer.enqueue({"sleep": 0})
    connection.hset(Keys.rq_job(task.rollout_id), mapping=_evil_fields(hook_url))
    # 3. A foreign job on the queue, behind it (so taken ahead): the worker refuses it, RQ's failure handling runs.
    connection.hset(Keys.rq_job("foreign"), mapping=_job_hash("evil_marker.fire", [], namespace, hook_url))
    connection.rpush(keys.rq_queue, "foreign")
    # 4. A genuine rollq job whose agent raises: a failed rollout, RQ bookkeeping as usual.
    failing = producer.enqueue({"raise": "on purpose"})
    connection.hset(Keys.rq_job(failing.rollout_id), mapping=_evil_fields(hook_url))

    worker = workers(
        redis_server.url,
        namespace,
        env={**AGENT, "ROLLQ_CONCURRENCY": "4", "PYTHONPATH": f"{evil_path}{os.pathsep}{REPO}"},
        args=["--burst"],
    )
    assert worker.wait(timeout=60) == 0, worker.log()

    rollouts = producer.wait([task.rollout_id, failing.rollout_id], timeout=10)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded", "failed"]
    # The clean-up did run: the planted job left the started registry for the failed one.
    assert connection.zcard(f"rq:wip:{namespace}") == 0
    assert connection.zscore(f"rq:failed:{namespace}", "planted") is not None
    # The foreign job was turned away without running (refused from the dequeue, or quarantined from the take-ahead).
    assert "refused job foreign" in worker.log() or "moved job foreign to the quarantine list" in worker.log()
    assert sorted(p.name for p in evil_path.iterdir()) == ["evil_marker.py"], worker.log()
    assert hits == []
