"""What idle workers cost Redis: commands/s and connections per worker process with nothing to do.

Run: python bench/idle.py [--workers 4] [--seconds 30]

Starts ``--workers`` ``RolloutWorker`` processes (concurrency 64, default heartbeat) on a private
redis-server with an empty queue, then counts the commands Redis ran (INFO commandstats) and the
connections it held over ``--seconds``. This is the floor a fleet pays before any rollout: the figure
docs/scaling.md multiplies by 10,000. Writes bench/results/idle.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import commands_between, commandstats, private_redis, rollq_workers, write_result  # noqa: E402


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
        },
        sys.argv[1:],
    )


if __name__ == "__main__":
    main()
