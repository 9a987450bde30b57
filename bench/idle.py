"""What idle workers cost Redis, and what a finished mock-LLM rollout leaves in it.

Run: python bench/idle.py [--workers 4] [--seconds 30]

1. Starts ``--workers`` ``RolloutWorker`` processes (concurrency 64, default heartbeat) on a private
   redis-server with an empty queue, then counts the commands Redis ran (INFO commandstats) and the
   connections it held over ``--seconds``: the floor a fleet pays before any rollout, which
   docs/scaling.md multiplies by 10,000.
2. Runs 20 mock-LLM rollouts (bench/agents.py: MockLLMAgent) through one in-process worker in burst
   mode and reports the rollout's JSON size and ``MEMORY USAGE`` of a task record and of the results
   stream per entry.

Writes bench/results/idle.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import commands_between, commandstats, private_redis, rollq_workers, write_result  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.store.keys import Keys  # noqa: E402
from rollq.worker import RolloutWorker, WorkerSettings  # noqa: E402


def sizes(count: int = 20) -> dict[str, float]:
    """Bytes a finished mock-LLM rollout takes: its JSON, its task record, its results-stream entry."""
    with private_redis() as server:
        connection = server.client()
        ids = [t.rollout_id for t in Producer(connection, "sz").enqueue_many([{"question": i} for i in range(count)])]
        settings = WorkerSettings(agent="bench.agents:MockLLMAgent", concurrency=count)
        RolloutWorker(["sz"], connection=server.client(), settings=settings).work(burst=True, logging_level="WARNING")
        keys = Keys("sz")
        entries: list = connection.xrange(keys.results)  # type: ignore[assignment]
        return {
            "rollout_json_bytes": round(sum(len(e[1][b"rollout"]) for e in entries) / len(entries)),
            "task_record_bytes": round(sum(int(connection.memory_usage(keys.task(r)) or 0) for r in ids) / count),
            "results_stream_bytes_per_entry": round(int(connection.memory_usage(keys.results) or 0) / len(entries)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-bench-idle-") as logs:
        workers = rollq_workers(
            server.url, "idle", args.workers, agent="bench.agents:MockLLMAgent", concurrency=64, log_dir=Path(logs)
        )
        try:
            probe = server.client()
            workers.wait_registered(probe, "idle")
            time.sleep(3.0)
            before, t0 = commandstats(probe), time.monotonic()
            time.sleep(args.seconds)
            after, t1 = commandstats(probe), time.monotonic()
            connections = int(probe.info("clients")["connected_clients"]) - 1  # less the probe
        finally:
            workers.stop()
    commands = commands_between(before, after)
    footprint = sizes()
    print(f"  a finished mock-LLM rollout: {footprint}")
    per_worker = sum(commands.values()) / (t1 - t0) / args.workers
    print(f"  {per_worker:.2f} commands/s and {connections / args.workers:.1f} connections per idle worker process")
    write_result(
        "idle",
        {
            "workers": args.workers,
            "seconds": round(t1 - t0, 1),
            "commands_per_s_per_idle_worker": round(per_worker, 2),
            "connections_per_idle_worker": round(connections / args.workers, 1),
            "commands": commands,
            "mock_llm_rollout": footprint,
        },
        sys.argv[1:],
    )


if __name__ == "__main__":
    main()
