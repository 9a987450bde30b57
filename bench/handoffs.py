"""Thread hand-offs: what one costs on this machine, and how many a no-op rollout makes, beside RQ's SimpleWorker.

Run: python bench/handoffs.py [--jobs 4000] [--rounds 2]

A rollq worker passes each rollout between threads (RQ's loop dequeues it, the start batcher claims it, the
agents' loop runs it, the finish batcher publishes it); RQ's SimpleWorker runs a job on its one thread. Machines of
the same kind differ in what waking a thread costs, so this measures both setups of it in one run:

- the round trip between two Python threads: one thread puts an item on a ``queue.SimpleQueue``, another takes it
  and puts it back on a second one (median of 5 runs of 20,000);
- per no-op job, for one rollq worker (concurrency 16) and one RQ ``SimpleWorker`` on a private redis-server,
  after a warm-up batch, one batch of ``--jobs`` enqueued at once and waited for: the worker process's CPU (user +
  system) and its voluntary and involuntary context switches, summed over all its threads
  (``/proc/<pid>/task/*/status``). The two take turns, ``--rounds`` times.

The share of the machine's CPU time the hypervisor gave other guests meanwhile (steal, ``/proc/stat``) is
recorded: this machine kind runs under a hypervisor, and what it takes moves every figure here.

A voluntary switch is a thread that blocked (on a lock, a queue, the GIL, a socket) and was woken again; an
involuntary one, a thread the kernel put aside for another that was ready: which of the two a wake-up counts as
depends on the race between the threads and Redis for the 2 cores, so their sum is the figure to compare.
Writes bench/results/handoffs.json.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RedisServer,
    cpu_ticks,
    private_redis,
    rollq_workers,
    rq_workers,
    steal_percent,
    write_result,
)
from bench.noop import NOOP_AGENT, Setup  # noqa: E402

PING_PONGS = 20_000
WARMUP = 300


def round_trip_us() -> float:
    """Median microseconds for one item to go to another thread and back."""
    runs = []
    for _ in range(5):
        there: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        back: queue.SimpleQueue[int] = queue.SimpleQueue()

        def echo(there: queue.SimpleQueue[int | None] = there, back: queue.SimpleQueue[int] = back) -> None:
            while (item := there.get()) is not None:
                back.put(item)

        thread = threading.Thread(target=echo)
        thread.start()
        started = time.perf_counter()
        for i in range(PING_PONGS):
            there.put(i)
            back.get()
        runs.append((time.perf_counter() - started) / PING_PONGS * 1e6)
        there.put(None)
        thread.join()
    return round(statistics.median(runs), 1)


def thread_counts(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of ``pid`` so far."""
    voluntary = involuntary = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        voluntary += int(fields["voluntary_ctxt_switches"])
        involuntary += int(fields["nonvoluntary_ctxt_switches"])
    return voluntary, involuntary


SWITCHES = ("switches_per_job", "voluntary_per_job", "involuntary_per_job")


def measure(server: RedisServer, setup: Setup) -> None:
    """One round of ``setup`` (``bench/noop.py``'s: rate, worker CPU, Redis commands), with its worker's context
    switches added to the round."""
    process = setup.workers.ps[0]
    before = thread_counts(process.pid)
    setup.measure(server)
    after = thread_counts(process.pid)
    voluntary, involuntary = after[0] - before[0], after[1] - before[1]
    last = setup.rounds[-1]
    last.update(
        voluntary_per_job=round(voluntary / setup.jobs, 2),
        involuntary_per_job=round(involuntary / setup.jobs, 2),
        switches_per_job=round((voluntary + involuntary) / setup.jobs, 2),
        threads=process.num_threads(),
    )
    print(
        f"  {setup.label:<28} {last['jobs_per_s']:8.1f} jobs/s  {last['worker_cpu_ms_per_job']:.3f} ms CPU/job  "
        f"{last['voluntary_per_job']:.2f} voluntary + {last['involuntary_per_job']:.2f} involuntary switches/job"
        f"  ({last['threads']} threads)"
    )


def summary(setup: Setup) -> dict[str, Any]:
    return setup.summary() | {key: statistics.median(r[key] for r in setup.rounds) for key in SWITCHES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000, help="no-op jobs per round and worker")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the two workers taking turns")
    args = parser.parse_args()

    ticks0 = cpu_ticks()
    trip = round_trip_us()
    print(f"round trip between two Python threads (SimpleQueue): {trip} us")
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-bench-logs-") as logs:
        log_dir = Path(logs)
        setups = [
            Setup(
                "rollq, concurrency 16",
                "h-rollq",
                rollq_workers(server.url, "h-rollq", 1, agent=NOOP_AGENT, concurrency=16, log_dir=log_dir),
                kind="rollq",
                jobs=args.jobs,
            ),
            Setup(
                "RQ SimpleWorker",
                "h-rq",
                rq_workers(server.url, "h-rq", 1, worker_class="rq.worker.SimpleWorker", log_dir=log_dir),
                kind="rq",
                jobs=args.jobs,
            ),
        ]
        try:
            for setup in setups:
                setup.workers.wait_registered(server.client(), setup.queue_name)
                setup.batch(server, WARMUP)
            for number in range(1, args.rounds + 1):
                print(f"round {number}")
                for setup in setups if number % 2 else reversed(setups):
                    measure(server, setup)
            results = [summary(setup) for setup in setups]  # while the workers run: it reads their memory
        finally:
            for setup in setups:
                setup.workers.stop()
    ticks1 = cpu_ticks()
    steal = steal_percent(ticks0, ticks1)
    print(f"CPU time stolen by the hypervisor during the run: {steal}%")
    path = write_result(
        "handoffs",
        {"round_trip_us": trip, "steal_percent": steal, "workers": results},
        sys.argv[1:],
        settings=vars(args),
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
