"""What finished rollouts leave in Redis, and what that comes to at 100 rollouts/s.

Run: python bench/retained.py [--rollouts 2000] [--concurrency 64] [--rate 100] [--config default --config ...]

Runs ``--rollouts`` mock-LLM rollouts (bench/agents.py: MockLLMAgent, 3 traced LLM calls and rewards each)
through one stock ``rq worker -w rollq.worker.RolloutWorker`` at the default settings, then reads
``MEMORY USAGE`` of every key Redis holds for them, by kind:

- RQ's finished job: its hash (``rq:job:<id>``), its results stream (``rq:results:<id>``), its execution
  records and its share of the finished registry; kept ``result_ttl`` (``ROLLQ_RESULT_TTL``, an hour);
- rollq's task record (``{ns}:task:<id>``), kept ``keep_seconds`` (``ROLLQ_KEEP_SECONDS``, an hour);
- the results stream and the summaries stream beside it, per entry (kept until ``results_maxlen`` /
  ``results_max_bytes`` push them out).

It also reports ``used_memory`` before and after, per rollout. The steady state at ``--rate`` rollouts/s is
``rate x retention x bytes`` for each kind.

RQ's results stream is most of its finished job: Redis gives a new stream a listpack node of
``stream-node-max-bytes`` (4096 by default), however small its one entry. And a hash with a value longer than
``hash-max-listpack-value`` (64 by default) is a hash table instead of a listpack: RQ's job hash (its description and
data) and rollq's task record (the task and policy JSON) are. ``--config`` runs the whole measurement once per value,
each on a redis-server of its own given those settings (``CONFIG SET``): ``default``, or
``name=value[,name=value...]``. The first run's figures are the file's top-level ones; every run's are in
``by_config``, with Redis's CPU per rollout over the run. Writes bench/results/retained.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from bench.common import outcomes, private_redis, redis_settings, rollq_workers, write_result  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.store.keys import Keys  # noqa: E402
from rollq.worker import WorkerSettings  # noqa: E402

NAMESPACE = "retained"
KB = 1000


def kind_of(key: str, keys: Keys) -> str:
    if key.startswith(keys.task("")):
        return "task_record"
    if key == keys.results:
        return "results_stream"
    if key == keys.summaries:
        return "summaries_stream"
    if key.startswith("rq:job:"):
        return "rq_job_hash"
    if key.startswith("rq:results:"):
        return "rq_job_results"
    if key.startswith("rq:execution"):
        return "rq_job_executions"
    if key.startswith("rq:finished:") or key.startswith("rq:registry:finished:"):
        return "rq_finished_registry"
    return "other"


def measure(args: argparse.Namespace, config: str) -> dict[str, Any]:
    """One run of ``--rollouts`` on a redis-server of its own, ``config``'s settings set (see the module)."""
    settings = WorkerSettings()
    keys = Keys(NAMESPACE)
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-bench-logs-") as logs:
        connection = server.client()
        for name, value in redis_settings(config).items():
            connection.config_set(name, value)
        redis_process = psutil.Process(server.process.pid)  # type: ignore[union-attr]
        before = int(connection.info("memory")["used_memory"])
        cpu_before = sum(redis_process.cpu_times()[:2])
        producer = Producer(connection, NAMESPACE)
        ids = [t.rollout_id for t in producer.enqueue_many([{"question": i} for i in range(args.rollouts)])]
        fleet = rollq_workers(
            server.url,
            NAMESPACE,
            1,
            agent="bench.agents:MockLLMAgent",
            concurrency=args.concurrency,
            log_dir=Path(logs),
        )
        try:
            deadline = time.monotonic() + 600
            while sum(outcomes(connection, NAMESPACE)) < args.rollouts and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(2)  # the last RQ end-of-job bookkeeping
        finally:
            fleet.stop()
        done = sum(outcomes(connection, NAMESPACE))
        redis_cpu = sum(redis_process.cpu_times()[:2]) - cpu_before
        after = int(connection.info("memory")["used_memory"])
        totals: dict[str, int] = defaultdict(int)
        counts: dict[str, int] = defaultdict(int)
        for raw in connection.scan_iter(count=1000):
            key = raw.decode()
            kind = kind_of(key, keys)
            totals[kind] += int(connection.memory_usage(key, samples=0) or 0)
            counts[kind] += 1
        ttl_sample = connection.ttl(f"rq:job:{next(iter(connection.scan_iter(match='rq:job:*'))).decode()[7:]}")

    rq_parts = ("rq_job_hash", "rq_job_results", "rq_job_executions", "rq_finished_registry")
    per_rollout = {kind: round(totals[kind] / done) for kind in totals}
    rq_job = sum(per_rollout.get(kind, 0) for kind in rq_parts)
    record = per_rollout.get("task_record", 0)
    stream_entry = per_rollout.get("results_stream", 0)
    rq_retained = args.rate * settings.result_ttl * rq_job
    records_retained = args.rate * settings.keep_seconds * record
    result = {
        "redis_config": config,
        "redis_cpu_ms_per_rollout": round(1000 * redis_cpu / max(1, done), 3),
        "rollouts": done,
        "of": len(ids),
        "used_memory_per_rollout_bytes": round((after - before) / done),
        "bytes_per_rollout": per_rollout,
        "keys": dict(counts),
        "rq_finished_job_bytes": rq_job,
        "rq_job_ttl_seconds_sampled": ttl_sample,
        "task_record_bytes": record,
        "results_stream_entry_bytes": stream_entry,
        "summaries_stream_entry_bytes": per_rollout.get("summaries_stream", 0),
        "at_rate": {
            "rollouts_per_second": args.rate,
            "rq_finished_jobs_gb": round(rq_retained / 1e9, 2),
            "rq_result_ttl_seconds": settings.result_ttl,
            "task_records_gb": round(records_retained / 1e9, 2),
            "keep_seconds": settings.keep_seconds,
        },
    }
    print(
        f"{config}: {done} rollouts: RQ finished job {rq_job / KB:.1f} kB "
        f"(its results stream {per_rollout.get('rq_job_results', 0) / KB:.1f} kB; kept {settings.result_ttl} s), "
        f"task record {record / KB:.2f} kB (kept {settings.keep_seconds} s), results entry {stream_entry / KB:.1f} "
        f"kB, summaries entry {result['summaries_stream_entry_bytes'] / KB:.2f} kB; used_memory "
        f"{result['used_memory_per_rollout_bytes'] / KB:.1f} kB per rollout; Redis CPU "
        f"{result['redis_cpu_ms_per_rollout']:.3f} ms per rollout",
        flush=True,
    )
    print(
        f"  at {args.rate:g}/s: RQ finished jobs {rq_retained / 1e9:.2f} GB, task records {records_retained / 1e9:.2f} "
        "GB",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=float, default=100.0, help="rollouts/s to extrapolate to")
    parser.add_argument(
        "--config",
        action="append",
        help="Redis settings of one run: default, or name=value[,name=value...]; repeat for more runs",
    )
    args = parser.parse_args()
    runs = [measure(args, config) for config in args.config or ["default"]]
    result = dict(runs[0])
    if len(runs) > 1:
        result["by_config"] = [
            {k: r[k] for k in ("redis_config", "used_memory_per_rollout_bytes", "rq_finished_job_bytes",
                               "task_record_bytes", "results_stream_entry_bytes", "summaries_stream_entry_bytes",
                               "redis_cpu_ms_per_rollout")}
            | {"rq_job_hash_bytes": r["bytes_per_rollout"].get("rq_job_hash", 0),
               "rq_job_results_bytes": r["bytes_per_rollout"].get("rq_job_results", 0)}
            for r in runs
        ]  # fmt: skip
    print(write_result("retained", result, sys.argv[1:], settings=vars(args)))


if __name__ == "__main__":
    main()
