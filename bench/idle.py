"""What idle workers cost Redis, and what a finished mock-LLM rollout leaves in it.

Run: python bench/idle.py [--workers 4] [--seconds 30]

1. Starts ``--workers`` ``RolloutWorker`` processes (concurrency 64, default heartbeat) on a private
   redis-server with an empty queue, then counts the commands Redis ran (INFO commandstats) and the
   connections it held over ``--seconds``: the floor a fleet pays before any rollout, which
   docs/scaling.md multiplies by 10,000. ``commands`` counts what Lua scripts run inside Redis too
   (INFO commandstats does); ``sent`` counts only the commands clients sent, read from ``MONITOR``
   (which marks a script's own commands as coming from ``lua``); a pipeline of several is one round trip.
2. Runs 20 mock-LLM rollouts (bench/agents.py: MockLLMAgent) through one in-process worker in burst
   mode and reports the rollout's JSON size and ``MEMORY USAGE`` of a task record and of the results
   stream per entry.

Writes bench/results/idle.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

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


class ClientCommands(threading.Thread):
    """Counts the commands clients send (not those a Lua script runs) from ``MONITOR`` until stopped."""

    def __init__(self, connection: redis.Redis) -> None:
        super().__init__(daemon=True)
        self.connection = connection
        self.counts: Counter[str] = Counter()
        self.start_at = float("inf")
        self._stop_at = float("inf")

    def run(self) -> None:
        with self.connection.monitor() as monitor:
            for entry in monitor.listen():
                if entry["time"] >= self._stop_at:
                    return
                if entry["time"] >= self.start_at and entry["client_type"] != "lua":
                    self.counts[entry["command"].split(" ", 1)[0].lower()] += 1

    def stop(self, at: float) -> None:
        """Count nothing sent at or after ``at`` (Redis's time); returns once a later command arrives."""
        self._stop_at = at
        self.join(timeout=30)


def _redis_time(connection: redis.Redis) -> float:
    seconds, micros = connection.time()  # type: ignore[misc]
    return float(seconds) + float(micros) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--out", default="idle", help="results name: bench/results/<out>.json (default idle)")
    args = parser.parse_args()
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-bench-idle-") as logs:
        workers = rollq_workers(
            server.url, "idle", args.workers, agent="bench.agents:MockLLMAgent", concurrency=64, log_dir=Path(logs)
        )
        try:
            probe = server.client()
            workers.wait_registered(probe, "idle")
            time.sleep(3.0)
            monitor = ClientCommands(server.client())
            monitor.start()
            time.sleep(0.5)
            before, t0 = commandstats(probe), time.monotonic()
            monitor.start_at = started = _redis_time(probe)
            time.sleep(args.seconds)
            ended = _redis_time(probe)
            after, t1 = commandstats(probe), time.monotonic()
            connections = int(probe.info("clients")["connected_clients"]) - 2  # less the probe and MONITOR
            monitor.stop(at=ended)
        finally:
            workers.stop()
    commands = commands_between(before, after)
    commands.pop("monitor", None)
    # The probe's own INFO and TIME calls are not the workers'.
    sent = {k: v for k, v in sorted(monitor.counts.items(), key=lambda kv: -kv[1]) if k not in ("info", "time")}
    sent_per_worker = sum(sent.values()) / (ended - started) / args.workers
    footprint = sizes()
    print(f"  a finished mock-LLM rollout: {footprint}")
    per_worker = sum(commands.values()) / (t1 - t0) / args.workers
    print(
        f"  {per_worker:.2f} commands/s ({sent_per_worker:.2f} sent by the worker, the rest run by its Lua scripts) "
        f"and {connections / args.workers:.1f} connections per idle worker process"
    )
    write_result(
        args.out,
        {
            "workers": args.workers,
            "seconds": round(t1 - t0, 1),
            "commands_per_s_per_idle_worker": round(per_worker, 2),
            "commands_sent_per_s_per_idle_worker": round(sent_per_worker, 2),
            "connections_per_idle_worker": round(connections / args.workers, 1),
            "commands": commands,
            "sent_by_clients": sent,
            "mock_llm_rollout": footprint,
        },
        sys.argv[1:],
        settings=vars(args),
    )


if __name__ == "__main__":
    main()
