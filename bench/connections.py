"""How many Redis connections a busy worker process, a producer/trainer and an async producer hold.

Run: nice -n 10 python bench/connections.py [--concurrency 1,64,256] [--seconds 15] [--interval 0.2]

For each ``--concurrency`` (1 is the worker's default): a private redis-server, one stock
``rq worker -w rollq.worker.RolloutWorker`` at that concurrency running the mock-LLM agent
(bench/agents.py: 3 turns x U(0.1, 0.5) s), kept busy: a producer/trainer process (this one, one
``Producer.from_url``) keeps twice the concurrency queued from one thread and reads every rollout
through a consumer group (``rollouts(group=...)``) on another, while an ``AsyncProducer.from_url``
gathers one ``wait`` per task in flight. Every ``--interval`` seconds for ``--seconds``: ``CLIENT LIST``
grouped by client name (rollq names every connection: the worker's after the worker, a producer's
``rollq-producer:<host>:<pid>``; store/connection.py), and, for the worker, the TCP connections its
process holds to the Redis port (psutil), which counts them without trusting the names. Reported:
the maximum and median per process and kind, with the worker's threads, against the documented bound
(docs/scaling.md; tests/store/test_connection_bound.py holds the worker to it).
Writes bench/results/connections.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import redis  # noqa: E402

from bench.common import outcomes, private_redis, rollq_workers, write_result  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.producer.aio import AsyncProducer  # noqa: E402
from rollq.worker.config import MAX_REDIS_CONNECTIONS  # noqa: E402

NAMESPACE = "conn"


def worker_tcp_connections(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` to 127.0.0.1:``port``."""
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def summary(values: list[int]) -> dict[str, float]:
    return {"max": max(values, default=0), "median": statistics.median(values) if values else 0, "samples": len(values)}


def measure(concurrency: int, agent: str, seconds: float, interval: float) -> dict[str, Any]:
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-conn-") as logs:
        probe = server.client(client_name="bench-probe")
        workers = rollq_workers(server.url, NAMESPACE, 1, agent=agent, concurrency=concurrency, log_dir=Path(logs))
        producer = Producer.from_url(server.url, NAMESPACE)
        stop = threading.Event()
        read: list[str] = []
        pending: list[str] = []

        def feed() -> None:
            while not stop.is_set():
                queued = int(probe.llen(f"rq:queue:{NAMESPACE}"))  # type: ignore[arg-type]
                if queued < 2 * concurrency:
                    batch = producer.enqueue_many([{"i": i} for i in range(max(10, concurrency))])
                    pending.extend(t.rollout_id for t in batch)
                time.sleep(0.1)

        def train() -> None:
            reader = producer.rollouts(group="trainers", consumer="t0", idle_timeout=0.5)
            while not stop.is_set():  # the reader ends after idle_timeout without a rollout: read on
                read.extend(rollout.rollout_id for rollout in reader)

        async def waits() -> None:
            aio = AsyncProducer.from_url(server.url, NAMESPACE)
            while not stop.is_set():
                ids = list(pending[-4 * concurrency :])
                if ids:
                    await asyncio.gather(*(aio.wait([rid], timeout=2) for rid in ids), return_exceptions=True)
                else:
                    await asyncio.sleep(0.2)
            await aio.aclose()

        threads = [
            threading.Thread(target=feed, daemon=True),
            threading.Thread(target=train, daemon=True),
            threading.Thread(target=lambda: asyncio.run(waits()), daemon=True),
        ]
        try:
            workers.wait_registered(probe, NAMESPACE)
            for t in threads:
                t.start()
            worker_name = next(iter(probe.smembers(f"rq:workers:{NAMESPACE}"))).decode().rsplit(":", 1)[-1]  # type: ignore[union-attr]
            # Warm up until the slots are full, then sample.
            deadline = time.monotonic() + 30
            while outcomes(probe, NAMESPACE)[0] < concurrency and time.monotonic() < deadline:
                time.sleep(0.2)
            by_name: dict[str, list[int]] = {}
            own = f":{psutil.Process().pid}"
            tcp: list[int] = []
            started, done_before = time.monotonic(), outcomes(probe, NAMESPACE)[0]
            while time.monotonic() - started < seconds:
                workers.check_alive()
                counts = Counter(c.get("name") or "(unnamed)" for c in probe.client_list())
                for name, n in counts.items():
                    # This process's clients by role (rollq-producer, rollq-async-producer), the worker as such.
                    kind = "worker" if name == worker_name else name.split(":")[0] if name.endswith(own) else name
                    by_name.setdefault(kind, []).append(n)
                tcp.append(worker_tcp_connections(workers.processes[0].pid, server.port))
                time.sleep(interval)
            elapsed = time.monotonic() - started
            done = outcomes(probe, NAMESPACE)[0] - done_before
            threads_alive = len(psutil.Process(workers.processes[0].pid).threads())
        finally:
            stop.set()
            workers.stop()
            for t in threads:
                t.join(timeout=10)
        return {
            "concurrency": concurrency,
            "agent": agent,
            "rollouts_per_s_while_sampling": round(done / elapsed, 1),
            "rollouts_read_by_trainer": len(read),
            "worker_threads": threads_alive,
            "worker_connections_by_name": summary(by_name.pop("worker", [])),
            "worker_tcp_connections": summary(tcp),
            "by_client_name": {k: summary(v) for k, v in sorted(by_name.items())},
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--concurrency",
        default="1,64,256,64:bench.agents:SyncNoopAgent",
        help="comma-separated worker concurrencies, each optionally :agent (default: the mock-LLM agent)",
    )
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--interval", type=float, default=0.2)
    args = parser.parse_args()
    rows = []
    for spec in args.concurrency.split(","):
        count, _, agent = spec.partition(":")
        row = measure(int(count), agent or "bench.agents:MockLLMAgent", args.seconds, args.interval)
        print(row, flush=True)
        rows.append(row)
    write_result(
        "connections",
        {"documented_worker_bound": MAX_REDIS_CONNECTIONS, "rows": rows},
        sys.argv[1:],
        settings=vars(args),
    )


if __name__ == "__main__":
    try:
        main()
    except redis.ConnectionError as exc:
        sys.exit(f"connections: {exc}")
