"""A worker that is done exits within seconds, whatever the order its threads run in at the end.

Stop 42's CI: an ``rq worker --burst`` logged "done, quitting", unsubscribed, then sat 53 s in RQ's
``unsubscribe`` until the test killed it. RQ's pubsub thread waits for commands (``rq shutdown``, stop-job) in
``get_message(timeout=60)``; RQ's unsubscribe sends UNSUBSCRIBE, whose reply wakes the thread, then clears the
thread's flag and joins it for 1 s. redis-py 8.2 made ``PubSubWorkerThread.stop()`` join with no bound, so when the
thread reads the reply before the main thread clears the flag, it goes back to waiting, for up to 60 s, and the
worker waits with it. On a loaded 2-core box that interleaving is common.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from rq.command import send_shutdown_command
from rq.queue import Queue
from rq.worker import Worker

from rollq.producer import Producer
from rollq.worker import RolloutWorker, WorkerSettings
from rollq.worker.rq_worker import EXIT_THREADS_LEFT
from tests.support.fault_agents import FaultAgent
from tests.support.servers import RedisServer, WorkerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis


def test_a_worker_exits_within_seconds_when_its_pubsub_thread_reads_the_unsubscribe_reply_first(
    redis_server: RedisServer, namespace: str
) -> None:
    worker = RolloutWorker([namespace], connection=redis_server.client(), agent=FaultAgent(), settings=WorkerSettings())
    worker.subscribe()
    pubsub = worker.pubsub
    assert pubsub is not None
    send_unsubscribe = pubsub.unsubscribe

    def unsubscribe_then_lose_the_cpu(*args: Any, **kwargs: Any) -> Any:
        # The interleaving, made certain: the thread reads the reply and waits again before stop() clears its flag.
        sent = send_unsubscribe(*args, **kwargs)
        deadline = time.monotonic() + 5
        while pubsub.subscribed and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        return sent

    pubsub.unsubscribe = unsubscribe_then_lose_the_cpu  # type: ignore[method-assign]
    started = time.monotonic()
    worker.unsubscribe()
    took = time.monotonic() - started

    assert took < 3, f"the worker waited {took:.1f} s for its pubsub thread"
    assert not worker.pubsub_thread.is_alive()


def test_rq_shutdown_reaches_a_running_worker_through_its_pubsub_thread_and_it_exits_cleanly(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    # The same thread, started by RolloutWorker.subscribe with its shorter wait, still carries RQ's commands.
    connection = redis_server.client()
    worker = workers(redis_server.url, namespace, env={"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"})
    queue = Queue(namespace, connection=connection)  # the server is shared: other tests' workers are registered too
    name = wait_until(lambda: next(iter(Worker.all(queue=queue)), None), "the worker", timeout=60).name
    wait_until(lambda: connection.pubsub_numsub(f"rq:pubsub:{name}")[0][1] == 1, "its subscription", timeout=30)
    send_shutdown_command(connection, name)
    assert worker.wait(15) == 0
    assert "received shutdown command" in worker.log().lower()


def test_a_worker_forced_out_past_a_non_daemon_thread_an_agent_left_exits_non_zero_naming_it(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    # Python waits for every non-daemon thread before a process exits: a thread an agent started and forgot kept
    # the stopped worker alive for as long as the thread ran (an hour here), its supervisor waiting on it. The
    # worker leaves without it after its grace period, and says so with its exit status, as a supervisor reads it.
    producer = Producer.from_url(redis_server.url, namespace)
    env = {"ROLLQ_AGENT": "tests.support.hostile_agents:HostileSyncAgent", "ROLLQ_GRACE_SECONDS": "2"}
    worker = workers(redis_server.url, namespace, env=env)
    [rollout] = producer.wait([producer.enqueue({"leak_thread": True}).rollout_id], timeout=30)
    assert rollout.metadata["status"] == "succeeded"

    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == EXIT_THREADS_LEFT
    (line,) = [ln for ln in worker.log().splitlines() if "leaked-by-the-agent" in ln]
    assert f"exiting with status {EXIT_THREADS_LEFT}" in line, line


def test_a_worker_whose_leftover_thread_ends_within_its_grace_period_exits_0(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    # Only a worker that had to leave threads behind is forced out: one the process could wait for is waited for.
    producer = Producer.from_url(redis_server.url, namespace)
    env = {"ROLLQ_AGENT": "tests.support.hostile_agents:HostileSyncAgent", "ROLLQ_GRACE_SECONDS": "20"}
    worker = workers(redis_server.url, namespace, env=env)
    [rollout] = producer.wait([producer.enqueue({"leak_thread": 3}).rollout_id], timeout=30)
    assert rollout.metadata["status"] == "succeeded"

    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert "leaked-by-the-agent" not in worker.log()
