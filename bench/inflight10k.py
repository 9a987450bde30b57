"""10,000 rollouts in flight on 2 worker processes: slow agents (3 turns x U(3, 10) s), from a cold start.

Run: python bench/inflight10k.py [--tasks 20000] [--in-flight 10000] [--processes 2]

Each rollout waits 3 LLM calls of 3-10 s (uniform, drawn from the task's own seed, so the same task
list can be replayed), traced as spans like the mock-LLM agent (span capture on). The workers start
idle; all ``--tasks`` tasks are enqueued at once; the run ends when the trainer (a consumer-group
reader in this process) has received every rollout.

Measured:
- % of the zero-overhead simulation: the same task list run FIFO on ``--in-flight`` slots with no cost
  at all finishes in T_sim; rollq took T; the figure is T_sim / T;
- worker CPU per rollout (user + system of both processes over the whole run / tasks), Redis's, and the trainer
  side's (this process: the enqueue, the trainer thread reading every rollout, the sampler);
- worker memory per in-flight rollout: (RSS when the most rollouts were in flight - RSS idle before the
  run) / that many rollouts;
- time to fill the slots: from the start of the enqueue to the in-flight set holding 95% of ``--in-flight``;
- heartbeats and the reaper: attempts requeued or superseded (stats hash), tasks claimed more than
  once, and each heartbeat round's lag (the oldest in-flight deadline's distance from now, sampled);
- lost and duplicated rollouts (every task id must arrive exactly once).

Writes bench/results/inflight10k.json.
"""

from __future__ import annotations

import argparse
import heapq
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from bench.agents import slow_turns  # noqa: E402
from bench.al import Trainer  # noqa: E402
from bench.common import private_redis, rollq_workers, sum_over, write_result  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.store.keys import Keys  # noqa: E402

FULL = 0.95  # the slots count as filled at 95%: the last few free up and refill continuously


def simulate(inputs: list[dict[str, Any]], slots: int) -> float:
    """Seconds the task list takes FIFO on ``slots`` slots with zero overhead."""
    free = [0.0] * slots
    end = 0.0
    for task_input in inputs:
        start = heapq.heappop(free)
        finish = start + sum(slow_turns(task_input))
        end = max(end, finish)
        heapq.heappush(free, finish)
    return end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--heartbeat", type=float, default=5.0, help="ROLLQ_HEARTBEAT_SECONDS of the workers")
    args = parser.parse_args()
    inputs = [{"i": i} for i in range(args.tasks)]
    simulated = simulate(inputs, args.in_flight)
    namespace = "k10"
    keys = Keys(namespace)
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-bench-10k-") as logs:
        producer = Producer.from_url(server.url, namespace)
        connection = server.client()
        workers = rollq_workers(
            server.url,
            namespace,
            args.processes,
            agent="bench.agents:SlowLLMAgent",
            concurrency=args.in_flight // args.processes,
            log_dir=Path(logs),
            extra_env={"ROLLQ_HEARTBEAT_SECONDS": str(args.heartbeat)},
        )
        trainer = Trainer(Producer.from_url(server.url, namespace))
        samples: list[tuple[float, int, float]] = []  # (t, in flight, seconds to the earliest deadline)
        stop = threading.Event()
        try:
            workers.wait_registered(connection, namespace)
            time.sleep(1.0)
            idle_rss = sum_over(workers.ps, lambda p: p.memory_info().rss)
            cpu0 = sum_over(workers.ps, lambda p: sum(p.cpu_times()[:2]))
            redis_proc = psutil.Process(server.process.pid)  # type: ignore[union-attr]
            rcpu0 = sum(redis_proc.cpu_times()[:2])
            memory0 = int(connection.info("memory")["used_memory"])
            own0 = time.process_time()
            trainer.start()
            started = time.monotonic()
            ids = [t.rollout_id for t in producer.enqueue_many(inputs, mode="train")]
            enqueued = time.monotonic() - started

            def gauge() -> None:
                gauge_connection = server.client()
                while not stop.wait(0.5):
                    with gauge_connection.pipeline(transaction=False) as pipe:
                        pipe.zcard(keys.inflight)
                        pipe.zrange(keys.inflight, 0, 0, withscores=True)
                        running, oldest = pipe.execute()
                    # A deadline is the last heartbeat + unresponsive_seconds: its distance from now says how
                    # stale the stalest attempt's heartbeat is (30 s - its age).
                    slack = oldest[0][1] - time.time() if oldest else float("nan")
                    samples.append((time.monotonic() - started, int(running), slack))

            sampler = threading.Thread(target=gauge, daemon=True)
            sampler.start()
            peak_rss: float = 0.0
            peak_running = 0
            filled_at: float | None = None
            while trainer.received < args.tasks:
                workers.check_alive()
                if trainer.error:
                    raise trainer.error
                if samples and filled_at is None and samples[-1][1] >= FULL * args.in_flight:
                    filled_at = samples[-1][0]
                if samples and samples[-1][1] > peak_running:
                    # RSS when the most rollouts were in flight: what each of them holds.
                    peak_running = samples[-1][1]
                    peak_rss = sum_over(workers.ps, lambda p: p.memory_info().rss)
                if time.monotonic() - started > 20 * simulated:
                    raise RuntimeError(f"{trainer.received} of {args.tasks} rollouts after {20 * simulated:.0f} s")
                time.sleep(0.2)
            elapsed = time.monotonic() - started
            cpu = sum_over(workers.ps, lambda p: sum(p.cpu_times()[:2])) - cpu0
            rcpu = sum(redis_proc.cpu_times()[:2]) - rcpu0
            own = time.process_time() - own0
            memory1 = int(connection.info("memory")["used_memory"])
            stop.set()
            sampler.join()
            stats = {k.decode(): v.decode() for k, v in connection.hgetall(keys.stats).items()}  # type: ignore[union-attr]
            with connection.pipeline(transaction=False) as pipe:
                for rid in ids:
                    pipe.hget(keys.task(rid), "claims")
                claims = [int(c or 0) for c in pipe.execute()]
        finally:
            stop.set()
            workers.stop(timeout=60)
            trainer.stop()
    received = trainer.seen
    lost = len(set(ids) - received)
    full = [s for s in samples if s[1] >= 0.95 * args.in_flight]
    mean_running = sum(s[1] for s in full) / len(full) if full else 0.0
    row = {
        "tasks": args.tasks,
        "in_flight": args.in_flight,
        "worker_processes": args.processes,
        "heartbeat_seconds": args.heartbeat,
        "turn_seconds": [3.0, 10.0],
        "seconds": round(elapsed, 1),
        "simulated_seconds": round(simulated, 1),
        "percent_of_simulation": round(100 * simulated / elapsed, 1),
        "rollouts_per_s": round(args.tasks / elapsed, 1),
        "simulated_rollouts_per_s": round(args.tasks / simulated, 1),
        "enqueue_seconds": round(enqueued, 2),
        "seconds_to_fill_slots": round(filled_at, 1) if filled_at is not None else None,
        "worker_cpu_ms_per_rollout": round(1000 * cpu / args.tasks, 2),
        "redis_cpu_ms_per_rollout": round(1000 * rcpu / args.tasks, 3),
        # The trainer side runs on the same box: this process enqueues, reads every rollout (the trainer thread)
        # and samples the in-flight set twice a second.
        "trainer_side_cpu_ms_per_rollout": round(1000 * own / args.tasks, 3),
        "worker_rss_idle_mb": round(idle_rss / 2**20, 1),
        "worker_rss_full_mb": round(peak_rss / 2**20, 1),
        "in_flight_at_peak_rss": peak_running,
        "worker_kb_per_in_flight": round((peak_rss - idle_rss) / 1024 / peak_running, 1) if peak_running else None,
        "mean_running_while_full": round(mean_running, 1),
        # What the finished run left in Redis: task records (kept keep_seconds), the results stream, RQ's jobs.
        "redis_bytes_per_finished_rollout": round((memory1 - memory0) / args.tasks),
        "min_deadline_slack_seconds": round(min((s[2] for s in samples if s[2] == s[2]), default=0.0), 1),
        "requeued_or_superseded": {k: v for k, v in stats.items() if k.startswith(("requeued", "superseded"))},
        "tasks_claimed_more_than_once": sum(1 for c in claims if c > 1),
        "lost": lost,
        "duplicates": trainer.duplicates,
        "rows": [],
    }
    row["rows"] = [{"duplicates": trainer.duplicates}]  # for the report's duplicate count
    print({k: v for k, v in row.items() if k != "rows"}, flush=True)
    write_result("inflight10k", row, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
