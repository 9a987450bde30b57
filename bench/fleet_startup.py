"""A fleet of worker processes started at once, as after a deploy: from exec to every process claiming its first task.

Run: python bench/fleet_startup.py [--processes 64] [--rounds 2]

On one private redis-server, each round starts ``--processes`` processes at the same moment, one kind after the
other (the order flips every round): stock ``rq worker`` processes (JSON serializer) with as many plain jobs queued
(``bench.rq_jobs.hold``: each holds its worker, so every process takes exactly one), and ``rq worker -w
rollq.worker.RolloutWorker`` processes at concurrency 1 with as many tasks (``bench.agents:HoldAgent``). Measured
from just before the first ``exec``: when half of the processes, and when all of them, had claimed (RQ's
``started_at``; rollq's ``last_claim``), and the processes' CPU until then. On a machine with fewer cores than
processes, that is how long their imports and start-up take to share the cores. Then every process (and RQ's work
horses) is killed; the server is thrown away with the run.

Writes bench/results/fleet_startup.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import redis  # noqa: E402
from rq import Queue  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from bench.common import RQ, RQ_JSON, Workers, private_redis, worker_env, write_result  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.store.keys import Keys  # noqa: E402

HOLD_SECONDS = 600.0
POLL = 0.05


def kill(workers: Workers) -> None:
    """Every worker process and its children (RQ's work horses), at once: no warm shutdown waits for a held job."""
    for p in workers.ps:
        try:
            for child in p.children(recursive=True):
                child.kill()
            p.kill()
        except psutil.NoSuchProcess:
            pass
    for p in workers.processes:
        p.wait()


def start_fleet(kind: str, connection: redis.Redis, url: str, logs: Path, n: int, round_: int) -> dict[str, Any]:
    """Queue ``n`` holding jobs, start ``n`` processes of ``kind``, time their claims."""
    if kind == "rq":
        queue = Queue(f"fleet-rq-{round_}", connection=connection, serializer=JSONSerializer)
        jobs = queue.enqueue_many([Queue.prepare_data("bench.rq_jobs.hold", (HOLD_SECONDS,)) for _ in range(n)])
        command = [RQ, "worker", "-S", RQ_JSON, "--url", url, "--quiet", queue.name]
        keys = [f"rq:job:{j.id}" for j in jobs]
        field, env = "started_at", worker_env()
    else:
        namespace = f"fleet-rollq-{round_}"
        tasks = Producer(connection, namespace).enqueue_many([{"seconds": HOLD_SECONDS}] * n, mode="train")
        command = [RQ, "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, "--quiet", namespace]
        keys = [Keys(namespace).task(t.rollout_id) for t in tasks]
        field, env = "last_claim", worker_env(ROLLQ_AGENT="bench.agents:HoldAgent", ROLLQ_CONCURRENCY="1")
    began = time.monotonic()
    workers = Workers([command] * n, env, logs)
    half: float | None = None
    try:
        while True:
            with connection.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hget(key, field)
                claimed = sum(1 for value in pipe.execute() if value)  # RQ writes started_at empty at enqueue
            now = time.monotonic() - began
            if half is None and claimed >= n / 2:
                half = now
            if claimed >= n:
                break
            if now > 600:
                raise RuntimeError(f"{claimed} of {n} {kind} processes claimed after 600 s; logs: {logs}")
            workers.check_alive()
            time.sleep(POLL)
        cpu = workers.cpu_seconds()
        rss = workers.rss_bytes()
    finally:
        kill(workers)
    return {
        "half_claimed_seconds": round(half or now, 2),
        "all_claimed_seconds": round(now, 2),
        "cpu_seconds_per_process": round(cpu / n, 3),
        "rss_mb_per_process": round(rss / n / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=64, help="processes started at once (default 64)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    kinds = {"stock rq worker": "rq", "rollq RolloutWorker": "rollq"}
    rounds: dict[str, list[dict[str, Any]]] = {label: [] for label in kinds}
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-fleet-") as logs:
        connection = server.client()
        for n in range(args.rounds):
            order = list(kinds) if n % 2 == 0 else list(reversed(kinds))
            for label in order:
                row = start_fleet(kinds[label], connection, server.url, Path(logs), args.processes, n)
                rounds[label].append(row)
                print(f"round {n + 1} {label}: {row}", flush=True)
    rq_label = next(iter(kinds))
    rows = []
    for label, measured in rounds.items():
        all_claimed = [r["all_claimed_seconds"] for r in measured]
        per_round = [
            round(a["all_claimed_seconds"] / b["all_claimed_seconds"], 2)
            for a, b in zip(measured, rounds[rq_label], strict=True)
        ]
        rows.append(
            {
                "worker": label,
                "processes": args.processes,
                "all claimed, s (median)": round(statistics.median(all_claimed), 2),
                "half claimed, s (median)": round(statistics.median(r["half_claimed_seconds"] for r in measured), 2),
                "all claimed per round, s": all_claimed,
                "vs stock rq worker, per round": per_round,
                "CPU s per process": round(statistics.median(r["cpu_seconds_per_process"] for r in measured), 3),
                "RSS MB per process": round(statistics.median(r["rss_mb_per_process"] for r in measured), 1),
            }
        )
    ratio = round(statistics.median(rows[1]["vs stock rq worker, per round"]), 2)
    print(write_result(
        "fleet_startup",
        {"processes": args.processes, "rows": rows, "rollq_vs_rq_all_claimed": ratio},
        sys.argv[1:],
        settings=vars(args),
    ))  # fmt: skip


if __name__ == "__main__":
    main()
