"""No-op rollouts end to end, rollq beside plain RQ, on one private redis-server.

Run: python bench/noop.py [--jobs 2000] [--fork-jobs 300] [--rounds 3]

Part 1, end to end with 2 worker processes each, beside the floor of a minimal Redis queue doing the same work
(bench/minimal_queue.py: BRPOP a task, XADD its result): the producer enqueues a batch
(one pipelined ``enqueue_many``), the workers run it, and the producer receives
every result (rollq: ``Producer.wait``; RQ: poll the finished registry, then read
every job's return value in one pipeline). Compared: RQ's default ``Worker``
(a fork per job), RQ's ``SimpleWorker``, and ``RolloutWorker`` with a no-op async
agent at concurrency 1 and 16 and a no-op sync agent at concurrency 1. All
workers are up at once and the configurations take turns, round after round,
so drift hits them alike; the median round counts. Reports jobs/s, worker CPU
per job and Redis commands per job (INFO commandstats, Lua-internal commands
included), in total and by command name.

Part 2, one worker in-process in burst mode on a client that counts round
trips (every packed send: a pipeline or a Lua call is one): the worker's round
trips and commands per job, taken as the difference between a run of
``--jobs`` and a run of 100 jobs so startup and shutdown cancel out.

Writes bench/results/noop.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from base64 import b64decode
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
from rq import Queue, SimpleWorker  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from bench import minimal_queue  # noqa: E402
from bench.common import (  # noqa: E402
    CountingConnection,
    RedisServer,
    Workers,
    commands_between,
    commandstats,
    counting_client,
    private_redis,
    rate,
    rollq_workers,
    rq_workers,
    worker_env,
    write_result,
)
from rollq.producer import Producer  # noqa: E402
from rollq.worker import RolloutWorker, WorkerSettings  # noqa: E402

WARMUP = 100
# The floor: a minimal Redis queue doing the same work (bench/minimal_queue.py), one task at a time and batched.
MINIMAL_WORKER = [sys.executable, "-m", "bench.minimal_queue"]
MINIMAL_QUEUES = [
    ("a minimal Redis queue (BRPOP, XADD)", "floor-1", 1),
    ("a minimal Redis queue, batched (BLMPOP 16, pipelined XADD)", "floor-16", 16),
]
NOOP_AGENT = "bench.agents:NoopAgent"
SYNC_NOOP_AGENT = "bench.agents:SyncNoopAgent"
RQ_NOOP = "bench.rq_jobs.noop"


def rq_wait(connection: redis.Redis, queue: Queue, job_ids: list[str], timeout: float = 600) -> list[Any]:
    """Wait for every job to finish, then read back every return value: RQ's closest thing to ``Producer.wait``."""
    deadline = time.monotonic() + timeout
    registries = (queue.finished_job_registry.key, queue.failed_job_registry.key)
    while True:
        with connection.pipeline(transaction=False) as pipe:
            for key in registries:
                pipe.zcard(key)
            finished, failed = pipe.execute()
        if finished + failed >= len(job_ids):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{finished}+{failed} of {len(job_ids)} RQ jobs done after {timeout}s")
        time.sleep(0.005)
    if failed:
        raise RuntimeError(f"{failed} RQ no-op jobs failed")
    jobs = [Job(job_id, connection=connection, serializer=JSONSerializer) for job_id in job_ids]
    with connection.pipeline(transaction=False) as pipe:
        for job in jobs:
            pipe.xrevrange(f"rq:results:{job.id}", count=1)
        replies = pipe.execute()
    values = [
        JSONSerializer.loads(b64decode(entries[0][1][b"return_value"])) if entries else None for entries in replies
    ]
    if any(v is None for v in values):
        raise RuntimeError("some RQ return values are missing")
    return values


PACK = 16
"""Tasks per RQ job of the packs configuration (``tasks_per_job``, docs/rq.md "Packs")."""


@dataclass
class Setup:
    """One configuration of the end-to-end run: its workers, its queue, how its producer talks to it."""

    label: str
    queue_name: str
    workers: Workers
    kind: Literal["rq", "rollq", "minimal"]
    jobs: int
    tasks_per_job: int | None = None  # rollq's packs (None: ROLLQ_TASKS_PER_JOB, 1 unless set)
    rounds: list[dict[str, float]] = field(default_factory=list)
    commands: dict[str, int] = field(default_factory=dict)

    def batch(self, server: RedisServer, n: int) -> None:
        connection = server.client()
        if self.kind == "minimal":
            minimal_queue.run_batch(connection, self.queue_name, n)
        elif self.kind == "rollq":
            producer = Producer(connection, self.queue_name, tasks_per_job=self.tasks_per_job)
            tasks = producer.enqueue_many([{"i": i} for i in range(n)], mode="train")
            producer.wait([t.rollout_id for t in tasks], timeout=600)
        else:
            queue = Queue(self.queue_name, connection=connection, serializer=JSONSerializer)
            connection.delete(queue.finished_job_registry.key)  # rq_wait counts this registry from zero
            enqueued = queue.enqueue_many([Queue.prepare_data(RQ_NOOP) for _ in range(n)])
            rq_wait(connection, queue, [j.id for j in enqueued])
        connection.close()

    def measure(self, server: RedisServer) -> None:
        connection = server.client()
        before, cpu_before = commandstats(connection), self.workers.cpu_seconds()
        started = time.perf_counter()
        self.batch(server, self.jobs)
        elapsed = time.perf_counter() - started
        after, cpu_after = commandstats(connection), self.workers.cpu_seconds()
        connection.close()
        for name, calls in commands_between(before, after).items():
            self.commands[name] = self.commands.get(name, 0) + calls
        self.rounds.append(
            {
                "seconds": round(elapsed, 3),
                "jobs_per_s": rate(self.jobs, elapsed),
                "worker_cpu_ms_per_job": round(1000 * (cpu_after - cpu_before) / self.jobs, 3),
            }
        )

    def summary(self) -> dict[str, Any]:
        total = self.jobs * len(self.rounds)
        commands = sorted(self.commands.items(), key=lambda kv: -kv[1])
        return {
            "label": self.label,
            "jobs_per_round": self.jobs,
            "rounds": self.rounds,
            "jobs_per_s": statistics.median(r["jobs_per_s"] for r in self.rounds),
            "worker_cpu_ms_per_job": statistics.median(r["worker_cpu_ms_per_job"] for r in self.rounds),
            "commands_per_job": round(sum(self.commands.values()) / total, 1),
            "top_commands_per_job": {k: round(v / total, 2) for k, v in commands[:12]},
            # Every command by name (issue 24 asks which of them each party needs).
            "commands_per_job_by_name": {k: round(v / total, 3) for k, v in commands},
            "worker_rss_mb": round(self.workers.rss_bytes() / 2**20, 1),
        }


def run_end_to_end(
    server: RedisServer, jobs: int, fork_jobs: int, rounds: int, concurrencies: list[int], log_dir: Path
) -> list[dict[str, Any]]:
    """All configurations' workers up at once, measured in interleaved rounds so drift hits them alike."""
    url = server.url
    setups = [
        *(
            Setup(
                label,
                queue,
                Workers([[*MINIMAL_WORKER, url, queue, str(batch)]] * 2, worker_env(), log_dir),
                kind="minimal",
                jobs=jobs,
            )
            for label, queue, batch in MINIMAL_QUEUES
        ),
        Setup(
            "RQ Worker (fork per job)",
            "rq-fork",
            rq_workers(url, "rq-fork", 2, worker_class="rq.worker.Worker", log_dir=log_dir),
            kind="rq",
            jobs=fork_jobs,
        ),
        Setup(
            "RQ SimpleWorker",
            "rq-simple",
            rq_workers(url, "rq-simple", 2, worker_class="rq.worker.SimpleWorker", log_dir=log_dir),
            kind="rq",
            jobs=jobs,
        ),
        *(
            Setup(
                f"rollq, concurrency {c}",
                f"rollq-c{c}",
                rollq_workers(url, f"rollq-c{c}", 2, agent=NOOP_AGENT, concurrency=c, log_dir=log_dir),
                kind="rollq",
                jobs=jobs,
            )
            for c in concurrencies
        ),
        Setup(
            f"rollq, concurrency 16, packs of {PACK}",
            "rollq-c16-packs",
            rollq_workers(
                url,
                "rollq-c16-packs",
                2,
                agent=NOOP_AGENT,
                concurrency=16,
                log_dir=log_dir,
                extra_env={"ROLLQ_TASKS_PER_JOB": str(PACK)},
            ),
            kind="rollq",
            jobs=jobs,
            tasks_per_job=PACK,
        ),
        Setup(
            "rollq, sync agent, concurrency 1",
            "rollq-sync",
            rollq_workers(url, "rollq-sync", 2, agent=SYNC_NOOP_AGENT, concurrency=1, log_dir=log_dir),
            kind="rollq",
            jobs=jobs,
        ),
    ]
    try:
        connection = server.client()
        for setup in setups:
            registry = minimal_queue.ready_key(setup.queue_name) if setup.kind == "minimal" else None
            setup.workers.wait_registered(connection, setup.queue_name, registry_key=registry)
            setup.batch(server, WARMUP)  # imports, caches and connections warm before the clock starts
        print(f"end to end, 2 worker processes each, median of {rounds} interleaved rounds:")
        for i in range(rounds):
            for setup in setups:
                setup.measure(server)
                r = setup.rounds[-1]
                print(
                    f"  round {i + 1}  {setup.label:34s} {r['jobs_per_s']:8.1f} jobs/s  "
                    f"{r['worker_cpu_ms_per_job']:6.2f} ms CPU/job"
                )
        return [setup.summary() for setup in setups]
    finally:
        for setup in setups:
            setup.workers.stop()


def burst_round_trips(server: RedisServer, kind: str, jobs: int, concurrency: int) -> tuple[int, int, Counter[str]]:
    """Round trips and commands of one in-process worker draining ``jobs`` queued jobs in burst mode."""
    setup = server.client()
    name = f"rt-{kind}-{concurrency}-{jobs}-{time.monotonic_ns()}"
    if kind == "rq":
        queue = Queue(name, connection=setup, serializer=JSONSerializer)
        queue.enqueue_many([Queue.prepare_data(RQ_NOOP) for _ in range(jobs)])
    else:
        Producer(setup, name).enqueue_many([{"i": i} for i in range(jobs)], mode="train")
    client = counting_client(server.port)
    if kind == "rq":
        worker: SimpleWorker = SimpleWorker([name], connection=client, serializer=JSONSerializer)
    else:
        settings = WorkerSettings(agent=NOOP_AGENT, concurrency=concurrency)
        worker = RolloutWorker([name], connection=client, settings=settings)
    before = commandstats(setup)
    CountingConnection.reset()
    worker.work(burst=True, logging_level="WARNING")
    trips, labels = CountingConnection.round_trips, CountingConnection.by_label
    commands = sum(commands_between(before, commandstats(setup)).values())
    client.close()
    return trips, commands, labels


def run_round_trips(server: RedisServer, jobs: int, concurrencies: list[int]) -> list[dict[str, Any]]:
    rows = []
    print(f"one worker in-process, burst; per job = (run of {jobs} - run of {WARMUP}) / {jobs - WARMUP}:")
    cases = [("RQ SimpleWorker", "rq", 1)] + [(f"rollq, concurrency {c}", "rollq", c) for c in concurrencies]
    for label, kind, c in cases:
        small = burst_round_trips(server, kind, WARMUP, c)
        big = burst_round_trips(server, kind, jobs, c)
        n = jobs - WARMUP
        row = {
            "label": label,
            "round_trips_per_job": round((big[0] - small[0]) / n, 2),
            "commands_per_job": round((big[1] - small[1]) / n, 2),
            "round_trips_per_job_by_command": {
                label: round((calls - small[2][label]) / n, 2)
                for label, calls in big[2].most_common()
                if round((calls - small[2][label]) / n, 2) > 0
            },
        }
        print(
            f"  {label:34s} {row['round_trips_per_job']:6.2f} round trips/job  "
            f"{row['commands_per_job']:6.2f} commands/job"
        )
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs", type=int, default=2000, help="jobs per round and configuration (RQ SimpleWorker and rollq)"
    )
    parser.add_argument("--fork-jobs", type=int, default=300, help="jobs per round for RQ's fork-per-job Worker (slow)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16", help="rollq worker concurrencies to run, comma-separated")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-bench-logs-") as logs:
        e2e = run_end_to_end(server, args.jobs, args.fork_jobs, args.rounds, concurrencies, Path(logs))
        trip_jobs = min(args.jobs, 2000)
        trips = run_round_trips(server, trip_jobs, concurrencies)

    simple = next(r for r in e2e if r["label"] == "RQ SimpleWorker")
    simple_rt = next(r for r in trips if r["label"] == "RQ SimpleWorker")
    floor = next(r for r in e2e if r["label"] == MINIMAL_QUEUES[-1][0])  # the faster floor, batched as rollq is
    for row in e2e:
        row["percent_of_minimal_queue"] = round(100 * row["jobs_per_s"] / floor["jobs_per_s"], 1)
        row["percent_of_minimal_queue_per_round"] = [
            round(100 * a["jobs_per_s"] / b["jobs_per_s"], 1)
            for a, b in zip(row["rounds"], floor["rounds"], strict=True)
        ]
        row["time_per_job_vs_simpleworker"] = round(simple["jobs_per_s"] / row["jobs_per_s"], 2)
        row["cpu_per_job_vs_simpleworker"] = round(row["worker_cpu_ms_per_job"] / simple["worker_cpu_ms_per_job"], 2)
    for row in trips:
        row["round_trips_vs_simpleworker"] = round(row["round_trips_per_job"] / simple_rt["round_trips_per_job"], 2)
    write_result(
        "noop",
        {
            "workers": 2,
            "end_to_end": e2e,
            "round_trips": trips,
            "round_trip_jobs": [WARMUP, trip_jobs],
            "target": "no-op rollouts at concurrency 16 at least 10% of a minimal Redis queue's rate, at most 15 Redis "
            "commands each",
        },
        sys.argv[1:],
        settings=vars(args),
    )


if __name__ == "__main__":
    main()
