"""Enqueue 100k tasks: rollq's ``Producer.enqueue_many`` beside RQ's ``Queue.enqueue_many`` (JSON serializer).

Run: python bench/enqueue.py [--tasks 100000] [--rounds 3]

Both go to the same private redis-server, which is flushed between rounds
(it is the benchmark's own). Each round enqueues ``--tasks`` in one call; the
median round counts. Also reported: the producer's own CPU, redis-server's
CPU, and Redis commands per task (INFO commandstats, Lua-internal included).
Writes bench/results/enqueue.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from rq import Queue  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from bench.common import commands_between, commandstats, private_redis, rate, write_result  # noqa: E402
from rollq.producer import Producer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.tasks

    with private_redis() as server:
        connection = server.client()
        redis_proc = psutil.Process(server.process.pid)  # type: ignore[union-attr]
        producer = Producer(connection, "bench-enqueue")
        queue = Queue("bench-enqueue-rq", connection=connection, serializer=JSONSerializer)

        def rollq() -> int:
            return len(producer.enqueue_many([{"question": f"q{i}", "i": i} for i in range(n)], mode="train"))

        def rq() -> int:
            return len(queue.enqueue_many([Queue.prepare_data("bench.rq_jobs.noop", result_ttl=60) for _ in range(n)]))

        systems: dict[str, Callable[[], int]] = {
            "rollq Producer.enqueue_many": rollq,
            "RQ Queue.enqueue_many (JSON)": rq,
        }
        rounds: dict[str, list[dict[str, Any]]] = {label: [] for label in systems}
        for i in range(args.rounds):
            for label, enqueue in systems.items():
                # The server is this benchmark's own (private_redis): each round starts empty.
                connection.flushall()
                before, redis_cpu = commandstats(connection), sum(redis_proc.cpu_times()[:2])
                cpu, started = time.process_time(), time.perf_counter()
                queued = enqueue()
                elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
                redis_cpu = sum(redis_proc.cpu_times()[:2]) - redis_cpu
                commands = commands_between(before, commandstats(connection))
                if queued != n:
                    sys.exit(f"{label}: {queued} of {n} tasks queued")
                rounds[label].append(
                    {
                        "seconds": round(elapsed, 3),
                        "tasks_per_s": rate(n, elapsed),
                        "producer_cpu_us_per_task": round(1e6 * cpu / n, 1),
                        "redis_cpu_us_per_task": round(1e6 * redis_cpu / n, 1),
                        "commands_per_task": round(sum(commands.values()) / n, 2),
                    }
                )
                r = rounds[label][-1]
                print(
                    f"  round {i + 1}  {label:30s} {r['tasks_per_s']:9.1f} tasks/s  "
                    f"producer {r['producer_cpu_us_per_task']:5.1f} us/task  "
                    f"redis {r['redis_cpu_us_per_task']:5.1f} us/task"
                )
        connection.flushall()

    rows = []
    for label, rs in rounds.items():
        rows.append(
            {
                "label": label,
                "tasks": n,
                "rounds": rs,
                **{key: statistics.median(r[key] for r in rs) for key in rs[0] if key != "seconds"},
            }
        )
    rows[0]["vs_rq"] = round(rows[0]["tasks_per_s"] / rows[1]["tasks_per_s"], 2)
    write_result("enqueue", {"rows": rows, "target": "enqueue at least 20k tasks/s"}, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
