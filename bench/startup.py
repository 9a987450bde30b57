"""Worker start-up: a fresh process from exec to its first claim, rollq's RolloutWorker beside a stock RQ worker.

Run: python bench/startup.py [--rounds 5]

On one private redis-server, each round starts, one after the other (the order flips every round):
- a stock ``rq worker`` (JSON serializer) with one plain no-op job (``bench.rq_jobs.noop``) already queued;
  its first claim is the job's ``started_at`` as RQ records it;
- ``rq worker -w rollq.worker.RolloutWorker`` with one no-op task (``bench.agents:NoopAgent``) already
  queued; its first claim is the task record's ``last_claim`` (claim.lua).
Both count from just before ``exec`` (``subprocess.Popen``); each also reports when the first result was
there (the job finished / the rollout counted in the namespace's stats). Then the worker is stopped.

rollq's modules (and bench's) are byte-compiled first, as installing a wheel does: RQ's modules come compiled
by pip, while an editable checkout under ``PYTHONDONTWRITEBYTECODE`` (set on this machine) would compile
rollq's from source in every new process.

With ``--base COMMIT``, rollq as of that commit (a temporary ``git worktree`` put first on the workers'
PYTHONPATH) takes its turn too, so that before and after are measured in one run, under the same load.

Also: ``python -X importtime -c "import <module>"`` in fresh processes for the worker modules (and at
``--base``), the sum of the top-level imports' cumulative times (median of ``--import-rounds``).
Writes bench/results/<--out>.json (startup.json by default).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
from rq import Queue  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from bench.common import (  # noqa: E402
    ROOT,
    RQ,
    RQ_JSON,
    Workers,
    base_tree,
    outcomes,
    private_redis,
    worker_env,
    write_result,
)
from rollq.producer import Producer  # noqa: E402
from rollq.store.keys import Keys  # noqa: E402

IMPORTS = ["rq.worker", "rollq.worker", "rollq.worker.rq_worker"]
POLL = 0.005


def tree_env(tree: Path | None, **extra: str) -> dict[str, str]:
    """A worker's environment; with ``tree``, that checkout's rollq (and bench) imported before this one's."""
    env = worker_env(**extra)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env["PYTHONPATH"]])
    return env


def import_seconds(module: str, tree: Path | None = None) -> float:
    """Seconds of ``import module`` in a fresh interpreter, by ``-X importtime``: its top-level imports summed."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                         capture_output=True, text=True, check=True, env=tree_env(tree)).stderr  # fmt: skip
    total = 0
    for line in err.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit() and not parts[2].startswith("  "):
            total += int(parts[1])
    return total / 1e6


def wait_for(check: Any, workers: Workers, timeout: float = 120) -> float:
    """Poll ``check()`` until it returns a time; the worker must stay alive meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return float(found)
        workers.check_alive()
        time.sleep(POLL)
    raise RuntimeError(f"no first claim within {timeout} s; logs: {workers.logs}")


def plain_rq(connection: redis.Redis, url: str, logs: Path, n: int) -> tuple[float, float]:
    """(exec -> first claim, exec -> first result) of a stock ``rq worker`` on a plain job."""
    queue = Queue(f"startup-rq-{n}", connection=connection, serializer=JSONSerializer)
    job = queue.enqueue("bench.rq_jobs.noop")
    command = [RQ, "worker", "-S", RQ_JSON, "--url", url, "--quiet", queue.name]
    began = time.time()
    workers = Workers([command], worker_env(), logs)
    try:

        def started() -> float | None:
            fetched = Job.fetch(job.id, connection=connection, serializer=JSONSerializer)
            return fetched.started_at.timestamp() if fetched.started_at else None

        claim = wait_for(started, workers)
        wait_for(lambda: time.time() if job.get_status(refresh=True) == "finished" else None, workers)
        return claim - began, time.time() - began
    finally:
        workers.stop()


def rollq_worker(
    connection: redis.Redis, url: str, logs: Path, n: int, tree: Path | None = None
) -> tuple[float, float]:
    """(exec -> first claim, exec -> first result) of ``rq worker -w rollq.worker.RolloutWorker`` on a task,
    with rollq from ``tree`` when given."""
    namespace = f"startup-rollq-{n}-{'base' if tree else 'head'}"
    (task,) = Producer(connection, namespace).enqueue_many([{"i": 0}], mode="train")
    command = [RQ, "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, "--quiet", namespace]
    env = tree_env(tree, ROLLQ_AGENT="bench.agents:NoopAgent", ROLLQ_CONCURRENCY="1")
    began = time.time()
    workers = Workers([command], env, logs)
    try:
        last_claim = Keys(namespace).task(task.rollout_id)
        claim = wait_for(lambda: connection.hget(last_claim, "last_claim"), workers)
        wait_for(lambda: time.time() if outcomes(connection, namespace)[0] else None, workers)
        return claim - began, time.time() - began
    finally:
        workers.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="worker starts of each kind (default 5)")
    parser.add_argument("--import-rounds", type=int, default=5, help="fresh interpreters per import (default 5)")
    parser.add_argument("--out", default="startup", help="results name: bench/results/<out>.json")
    parser.add_argument("--base", help="a commit whose rollq takes its turn too (before/after in one run)")
    args = parser.parse_args()
    kinds: dict[str, Any] = {"stock rq worker, plain job": plain_rq, "rollq RolloutWorker, no-op task": rollq_worker}
    with base_tree(args.base) as tree_at_base:
        if tree_at_base is not None:
            label = f"rollq RolloutWorker, no-op task (at {args.base})"
            kinds[label] = functools.partial(rollq_worker, tree=tree_at_base)
        for tree in [ROOT] + ([tree_at_base] if tree_at_base else []):
            compile_all = [sys.executable, "-m", "compileall", "-q", str(tree / "rollq"), str(tree / "bench")]
            subprocess.run(compile_all, check=True)
        data = measure(kinds, args, tree_at_base)
    print(write_result(args.out, data, sys.argv[1:], settings=vars(args)))


def measure(kinds: dict[str, Any], args: argparse.Namespace, tree_at_base: Path | None) -> dict[str, Any]:
    """The interleaved rounds and the import times."""
    claims: dict[str, list[float]] = {k: [] for k in kinds}
    results: dict[str, list[float]] = {k: [] for k in kinds}
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-startup-") as logs:
        connection = server.client()
        for n in range(args.rounds):
            order = list(kinds) if n % 2 == 0 else list(reversed(kinds))
            for label in order:
                claim, result = kinds[label](connection, server.url, Path(logs), n)
                claims[label].append(round(claim, 3))
                results[label].append(round(result, 3))
                print(f"round {n + 1} {label}: first claim {claim:.2f} s, first result {result:.2f} s", flush=True)
    imports = {}
    trees = [("", None)] + ([(f" (at {args.base})", tree_at_base)] if tree_at_base else [])
    for module in IMPORTS:
        for suffix, tree in trees if module.startswith("rollq") else [("", None)]:
            times = [import_seconds(module, tree) for _ in range(args.import_rounds)]
            imports[module + suffix] = round(statistics.median(times), 3)
            print(f"import {module}{suffix}: {imports[module + suffix]:.3f} s", flush=True)
    rq_label = next(iter(kinds))
    rows = []
    for label in kinds:
        rows.append(
            {
                "label": label,
                "rounds_seconds": claims[label],
                "median_seconds": round(statistics.median(claims[label]), 3),
                "first_result_median_seconds": round(statistics.median(results[label]), 3),
                "vs_rq": round(statistics.median(claims[label]) / statistics.median(claims[rq_label]), 2),
                "vs_rq_per_round": [round(a / b, 2) for a, b in zip(claims[label], claims[rq_label], strict=True)],
            }
        )
    return {"rounds": args.rounds, "import_rounds": args.import_rounds, "rows": rows, "imports": imports}


if __name__ == "__main__":
    main()
