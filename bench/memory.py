"""One worker's memory over 100k rollouts.

Run: python bench/memory.py [--rollouts 100000] [--concurrency 64] [--max-seconds 540]

One ``RolloutWorker`` subprocess (concurrency 64, the no-op async agent) runs
``--rollouts`` rollouts while the producer keeps 2000 tasks queued. Its RSS
(psutil) is sampled every second with the number of rollouts done so far.
Reported: RSS before the first rollout, after the first 1000 (caches, thread
pools and allocator arenas warm), the peak, at the end, and the growth. If
``--max-seconds`` passes first, the run stops there and says how many rollouts
it reached. Writes bench/results/memory.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import outcomes, private_redis, rate, rollq_workers, write_result  # noqa: E402
from bench.mock_llm import Feeder  # noqa: E402
from rollq.producer import Producer  # noqa: E402

WARM_ROLLOUTS = 1000
QUEUED = 2000
MB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-seconds", type=float, default=540.0)
    args = parser.parse_args()

    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-bench-logs-") as logs:
        namespace = "memory"
        connection = server.client()
        producer = Producer.from_url(server.url, namespace)
        workers = rollq_workers(
            server.url, namespace, 1, agent="bench.agents:NoopAgent", concurrency=args.concurrency, log_dir=Path(logs)
        )
        process = workers.ps[0]

        def done() -> int:
            return sum(outcomes(connection, namespace))

        workers.wait_registered(connection, namespace)
        time.sleep(1.0)  # bootstrap finishes (heartbeat thread, event loop) after registering
        start_rss = process.memory_info().rss
        samples: list[tuple[int, float, int]] = []
        feeder = Feeder(
            server.client(),
            f"rq:queue:{namespace}",
            QUEUED,
            lambda n: producer.enqueue_many([{"i": i} for i in range(n)], mode="train"),
        )
        started = time.monotonic()
        feeder.start()
        try:
            while True:
                time.sleep(1.0)
                workers.check_alive()
                if feeder.error:
                    raise feeder.error
                n, elapsed = done(), time.monotonic() - started
                samples.append((n, round(elapsed, 1), process.memory_info().rss))
                if n >= args.rollouts or elapsed >= args.max_seconds:
                    break
                if len(samples) % 30 == 0:
                    print(f"  {n:7d} rollouts, {elapsed:5.0f} s, RSS {samples[-1][2] / MB:6.1f} MB", flush=True)
        finally:
            feeder.stop()
            workers.stop()
        failures = outcomes(connection, namespace)[1]
        redis_memory = connection.info("memory")["used_memory"]

    rollouts, seconds, end_rss = samples[-1]
    warm_rss = next(rss for n, _, rss in samples if n >= WARM_ROLLOUTS)
    peak_rss = max(rss for _, _, rss in samples)
    step = max(1, len(samples) // 120)
    result = {
        "concurrency": args.concurrency,
        "agent": "bench.agents:NoopAgent (async)",
        "rollouts_target": args.rollouts,
        "rollouts": rollouts,
        "reached_target": rollouts >= args.rollouts,
        "failed": failures,
        "seconds": seconds,
        "rollouts_per_s": rate(rollouts, seconds),
        "rss_mb": {
            "start": round(start_rss / MB, 1),
            f"after_{WARM_ROLLOUTS}": round(warm_rss / MB, 1),
            "peak": round(peak_rss / MB, 1),
            "end": round(end_rss / MB, 1),
        },
        "growth_mb_from_start": round((end_rss - start_rss) / MB, 1),
        f"growth_mb_after_first_{WARM_ROLLOUTS}": round((end_rss - warm_rss) / MB, 1),
        "redis_used_memory_mb_at_end": round(redis_memory / MB, 1),
        "samples": [{"rollouts": n, "seconds": s, "rss_mb": round(rss / MB, 2)} for n, s, rss in samples[::step]],
        "target": "worker RSS grows less than 20 MB over 100k rollouts",
    }
    print(
        f"{rollouts} rollouts in {seconds:.0f} s ({result['rollouts_per_s']}/s); RSS MB {result['rss_mb']}; "
        f"growth {result['growth_mb_from_start']} MB from start, "
        f"{result[f'growth_mb_after_first_{WARM_ROLLOUTS}']} MB after the first {WARM_ROLLOUTS}"
    )
    write_result("memory", result, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
