"""A minimal Redis queue: the floor under any Redis-backed task queue on this box, for bench/noop.py to compare with.

The same work as a no-op rollout, and nothing else: the producer pushes every task (a small JSON object) onto a
list in one pipeline; a worker process pops one (``BRPOP``), does nothing, and appends a small JSON result to a
results stream (``XADD``), or, batched, pops up to 16 at once (``BLMPOP ... COUNT 16``) and appends their results
in one pipeline, as rollq's workers batch their claims and publications at concurrency 16; the producer reads
the stream (``XREAD``, blocking, 1000 at a time) until it has every result. Two commands per task (two round
trips one at a time, about 2/16 batched), no claim, no retry, no record of who ran what: what rollq does on top
(claims, RQ's job bookkeeping, the trace, at-least-once delivery) is what the ratio to this costs.

Run a worker: python -m bench.minimal_queue REDIS_URL QUEUE [BATCH] (bench/noop.py starts them).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import redis


def ready_key(queue: str) -> str:
    """The set a worker adds itself to once it is about to pop (the bench waits on its size)."""
    return f"minimal:{queue}:workers"


def tasks_key(queue: str) -> str:
    return f"minimal:{queue}:tasks"


def results_key(queue: str) -> str:
    return f"minimal:{queue}:results"


def work(url: str, queue: str, batch: int = 1) -> None:
    """Pop, no-op, publish, until SIGTERM: one task at a time, or up to ``batch`` per pop and pipeline."""
    connection = redis.Redis.from_url(url)
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    connection.sadd(ready_key(queue), os.getpid())
    while not stopping:
        if batch == 1:
            popped = connection.brpop([tasks_key(queue)], timeout=1)
            if popped is not None:
                connection.xadd(results_key(queue), {"r": result(popped[1])})
            continue
        reply = connection.blmpop(1, 1, tasks_key(queue), direction="RIGHT", count=batch)
        if reply is None:
            continue
        with connection.pipeline(transaction=False) as pipe:
            for payload in reply[1]:  # type: ignore[index]
                pipe.xadd(results_key(queue), {"r": result(payload)})
            pipe.execute()


def result(payload: bytes) -> str:
    """A no-op task's result: its id and a reward."""
    return json.dumps({"id": json.loads(payload)["id"], "reward": 0.0})


def run_batch(connection: redis.Redis, queue: str, n: int, timeout: float = 600) -> list[Any]:
    """Enqueue ``n`` tasks in one pipeline, then read results until every one has come back."""
    stream = results_key(queue)
    connection.delete(stream)
    with connection.pipeline(transaction=False) as pipe:
        for start in range(0, n, 1000):
            chunk = range(start, min(n, start + 1000))
            pipe.lpush(tasks_key(queue), *(json.dumps({"id": i, "input": {"i": i}}) for i in chunk))
        pipe.execute()
    seen: list[Any] = []
    last = "0-0"
    deadline = time.monotonic() + timeout
    while len(seen) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(seen)} of {n} minimal-queue results after {timeout}s")
        reply = connection.xread({stream: last}, count=1000, block=1000)
        for _, entries in reply:  # type: ignore[union-attr]
            for entry_id, fields in entries:
                seen.append(json.loads(fields[b"r"]))
                last = entry_id
    return seen


if __name__ == "__main__":
    usage = f"usage: python -m bench.minimal_queue REDIS_URL QUEUE [BATCH]\n\n{__doc__}"
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(usage)
        sys.exit(0)
    if not 3 <= len(sys.argv) <= 4 or not (len(sys.argv) == 3 or sys.argv[3].isdigit()):
        sys.exit(usage)
    work(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1)
