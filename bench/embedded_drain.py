"""How fast one stock ``rq worker`` subprocess (SimpleWorker, JSON serializer) drains no-op jobs from EmbeddedRedis.

Run: python bench/embedded_drain.py [--jobs 500]

Prints jobs/s and writes bench/results/embedded_drain.json. Two figures:
- ``jobs_per_s``: jobs / (worker process start -> worker exits on an empty queue), startup included;
- ``steady_jobs_per_s``: from the first job's start to the last job's end, as RQ recorded them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_result  # noqa: E402
from rollq.store.embedded import EmbeddedRedis  # noqa: E402

QUEUE = "bench-embedded-drain"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    args = parser.parse_args()

    with EmbeddedRedis() as embedded:
        connection = redis.Redis.from_url(embedded.url)
        queue = Queue(QUEUE, connection=connection, serializer=JSONSerializer)
        jobs = queue.enqueue_many([Queue.prepare_data("embedded_jobs.noop") for _ in range(args.jobs)])

        command = [
            sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", embedded.url,
            "-S", "rq.serializers.JSONSerializer", "-w", "rq.worker.SimpleWorker", "--quiet", QUEUE,
        ]  # fmt: skip
        # The job function lives in tests/support/embedded_jobs.py; that folder goes on the worker's PYTHONPATH.
        path = [str(ROOT / "tests" / "support"), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True, timeout=600)
        elapsed = time.perf_counter() - started

        fetched = Job.fetch_many([job.id for job in jobs], connection=connection, serializer=JSONSerializer)
        finished = [job for job in fetched if job is not None and job.is_finished]
        if len(finished) != args.jobs or queue.count != 0:
            sys.exit(f"only {len(finished)} of {args.jobs} jobs finished; {queue.count} still queued")
        first_start = min(job.started_at for job in finished if job.started_at is not None)
        last_end = max(job.ended_at for job in finished if job.ended_at is not None)
        steady = (last_end - first_start).total_seconds()

    result = {
        "jobs": args.jobs,
        "jobs_per_s": round(args.jobs / elapsed, 1),
        "steady_jobs_per_s": round(args.jobs / steady, 1),
        "seconds": round(elapsed, 3),
        "worker": "rq.worker.SimpleWorker, JSONSerializer, one `rq worker --burst` subprocess",
        "worker_command": " ".join(command[:6] + ["redis://127.0.0.1:<port>/0"] + command[7:]),
    }
    path = write_result("embedded_drain", result, sys.argv[1:], settings=vars(args))
    print(f"{result['jobs_per_s']} jobs/s ({args.jobs} jobs in {elapsed:.2f} s, worker startup included); "
          f"steady state {result['steady_jobs_per_s']} jobs/s -> {path.relative_to(ROOT)}")  # fmt: skip


if __name__ == "__main__":
    main()
