"""Worker CPU and Redis round trips per rollout: this tree beside an earlier commit, in one run.

Run: python bench/before_after.py [--base 1c72b18] [--rounds 2] [--seconds 10]

The earlier commit (by default 1c72b18, rollq 0.2.0 as it landed, before the
batched job starts and ends and the tracer/GC work) is checked out into a
temporary git worktree, and each measurement runs once per tree, taking turns,
round after round, so drift hits both alike:

- ``bench/profile.py`` of each tree (2 worker processes, mock-LLM agents with
  spans, 1000 in flight): worker CPU per rollout (psutil) and rollouts/s;
- ``bench/noop.py``'s end-to-end round of each tree at concurrency 16 (2 worker
  processes, a producer enqueueing and waiting for ``--e2e-jobs`` no-op
  rollouts): Redis commands per rollout counted by Redis over the whole round,
  producer side and Lua's inner calls included, by command name, and the
  workers' CPU per rollout (issue 24's measure);
- ``bench/noop.py``'s round-trip count of each tree (one worker in-process,
  no-op agent, burst): Redis round trips and commands per rollout at
  concurrency 1, 16 and 256.

``--tasks-per-job K`` (or ``ROLLQ_TASKS_PER_JOB``) runs this tree's producers and workers with packs of K tasks
per RQ job; the base runs without (it ignores the setting anyway).

Each tree runs with its own code only (``PYTHONPATH`` puts its root first, and
its bench scripts start their workers with it). Writes bench/results/before_after.json (``--name`` for another
file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import base_tree, commit_of, write_result  # noqa: E402

DEFAULT_BASE = "1c72b18"
CONCURRENCIES = [1, 16, 256]

# Run inside a tree: its own bench.noop counts its own worker's round trips.
ROUND_TRIPS = """
import json, sys
from bench.common import private_redis
from bench.noop import run_round_trips
with private_redis() as server:
    rows = run_round_trips(server, {jobs}, {concurrencies})
print("ROWS " + json.dumps(rows))
"""

# Run inside a tree: one end-to-end no-op round at concurrency 16 with its own producer and workers (only names
# bench.noop has had since 1c72b18, so that any base can run it; Setup's kind was a flag before ee34158).
END_TO_END = """
import json, tempfile
from pathlib import Path
from bench.common import private_redis, rollq_workers
from bench.noop import NOOP_AGENT, WARMUP, Setup
with private_redis() as server, tempfile.TemporaryDirectory() as logs:
    workers = rollq_workers(server.url, "rollq-c16", 2, agent=NOOP_AGENT, concurrency=16, log_dir=Path(logs))
    kind = {{"kind": "rollq"}} if "kind" in Setup.__dataclass_fields__ else {{"rollq": True}}  # noop.py of ee34158 on
    setup = Setup("rollq, concurrency 16", "rollq-c16", workers, jobs={jobs}, **kind)
    try:
        workers.wait_registered(server.client(), setup.queue_name)
        setup.batch(server, WARMUP)
        setup.measure(server)
    finally:
        workers.stop()
row = dict(setup.rounds[-1], commands=setup.commands)
print("ROW " + json.dumps(row))
"""


# ROLLQ_TASKS_PER_JOB (packs, docs/rq.md) for this tree's producers and workers only: the other tree runs without it.
TREE_ENV: dict[Path, dict[str, str]] = {}


def in_tree(tree: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "ROLLQ_TASKS_PER_JOB"}
    env = {**base, **TREE_ENV.get(tree, {}), "PYTHONPATH": str(tree)}
    return subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True, timeout=900)


def profile(tree: Path, seconds: int) -> dict[str, Any]:
    in_tree(tree, [sys.executable, str(tree / "bench" / "profile.py"), "--seconds", str(seconds)])
    doc = json.loads((tree / "bench" / "results" / "profile.json").read_text())
    return {
        "worker_cpu_ms_per_rollout": doc["worker_cpu_ms_per_rollout"],
        "rollouts_per_s": doc["rollouts_per_s"],
        "buckets_ms_per_rollout": doc["buckets_ms_per_rollout"],
    }


def round_trips(tree: Path, jobs: int) -> list[dict[str, Any]]:
    code = ROUND_TRIPS.format(jobs=jobs, concurrencies=CONCURRENCIES)
    out = in_tree(tree, [sys.executable, "-c", code]).stdout
    rows: list[dict[str, Any]] = json.loads(out.split("ROWS ", 1)[1])
    return [r for r in rows if r["label"].startswith("rollq")]


def end_to_end(tree: Path, jobs: int) -> dict[str, Any]:
    out = in_tree(tree, [sys.executable, "-c", END_TO_END.format(jobs=jobs)]).stdout
    row: dict[str, Any] = json.loads(out.split("ROW ", 1)[1])
    commands: dict[str, int] = row.pop("commands")
    row["commands_per_rollout"] = round(sum(commands.values()) / jobs, 2)
    row["commands_per_rollout_by_name"] = {
        name: round(calls / jobs, 2) for name, calls in sorted(commands.items(), key=lambda kv: -kv[1])
    }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help="the earlier commit to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=10, help="py-spy window per profile run")
    parser.add_argument("--jobs", type=int, default=1000, help="no-op jobs per round-trip count")
    parser.add_argument("--e2e-jobs", type=int, default=1000, help="no-op rollouts per end-to-end round")
    parser.add_argument("--name", default="before_after", help="results file name (bench/results/NAME.json)")
    parser.add_argument(
        "--tasks-per-job",
        type=int,
        default=None,
        help="tasks per RQ job (packs) for this tree only; default ROLLQ_TASKS_PER_JOB if set, else 1",
    )
    args = parser.parse_args()
    packs = args.tasks_per_job or int(os.environ.get("ROLLQ_TASKS_PER_JOB", "1"))
    if packs > 1:
        TREE_ENV[ROOT] = {"ROLLQ_TASKS_PER_JOB": str(packs)}
        args.tasks_per_job = packs
    if not (shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()):
        sys.exit("py-spy is not installed: pip install py-spy")
    with base_tree(args.base) as base:
        assert base is not None
        trees = {"before": base, "after": ROOT}
        profiles: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        e2e: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for r in range(args.rounds):
            for label, tree in trees.items():
                row = end_to_end(tree, args.e2e_jobs)
                e2e[label].append(row)
                print(
                    f"round {r + 1} {label:6s}: {row['commands_per_rollout']:.2f} Redis commands/rollout,"
                    f" {row['worker_cpu_ms_per_job']:.3f} ms worker CPU/rollout, {row['jobs_per_s']:.0f}"
                    " rollouts/s (no-op, concurrency 16, end to end)",
                    flush=True,
                )
            for label, tree in trees.items():
                run = profile(tree, args.seconds)
                profiles[label].append(run)
                print(
                    f"round {r + 1} {label:6s}: {run['worker_cpu_ms_per_rollout']:.3f} ms worker CPU/rollout,"
                    f" {run['rollouts_per_s']:.0f} rollouts/s at 1000 in flight",
                    flush=True,
                )
        trips = {label: round_trips(tree, args.jobs) for label, tree in trees.items()}
    # A branch name (--base main) moves: the results name the commit it stood at.
    out: dict[str, Any] = {
        "base": commit_of(args.base),
        "head": commit_of("HEAD"),
        "rounds": args.rounds,
    }
    for label in ("before", "after"):
        runs = profiles[label]
        out[label] = {
            "worker_cpu_ms_per_rollout": round(statistics.median(r["worker_cpu_ms_per_rollout"] for r in runs), 3),
            "worker_cpu_ms_per_rollout_rounds": [r["worker_cpu_ms_per_rollout"] for r in runs],
            "rollouts_per_s_1000_in_flight": round(statistics.median(r["rollouts_per_s"] for r in runs), 1),
            "buckets_ms_per_rollout": runs[-1]["buckets_ms_per_rollout"],
            "round_trips": {
                row["label"]: {k: row[k] for k in ("round_trips_per_job", "commands_per_job")} for row in trips[label]
            },
            "noop_c16_end_to_end": {
                "commands_per_rollout": statistics.median(r["commands_per_rollout"] for r in e2e[label]),
                "commands_per_rollout_rounds": [r["commands_per_rollout"] for r in e2e[label]],
                "worker_cpu_ms_per_rollout_rounds": [r["worker_cpu_ms_per_job"] for r in e2e[label]],
                "rollouts_per_s_rounds": [r["jobs_per_s"] for r in e2e[label]],
                "commands_per_rollout_by_name": e2e[label][-1]["commands_per_rollout_by_name"],
            },
        }
    out["after_over_before_per_round"] = {
        key: [round(a[key] / b[key], 3) if b[key] else None for b, a in zip(e2e["before"], e2e["after"], strict=True)]
        for key in ("commands_per_rollout", "worker_cpu_ms_per_job")
    }
    out["after_over_before_per_round"]["profile_worker_cpu_ms_per_rollout"] = [
        round(a["worker_cpu_ms_per_rollout"] / b["worker_cpu_ms_per_rollout"], 3)
        for b, a in zip(profiles["before"], profiles["after"], strict=True)
    ]
    for label in ("before", "after"):
        o = out[label]
        print(f"{label:6s}: {o['worker_cpu_ms_per_rollout']:.3f} ms/rollout; round trips per rollout", end="")
        print(", ".join(f" {k.split(', ')[-1]}: {v['round_trips_per_job']}" for k, v in o["round_trips"].items()))
    print("after / before per round:", out["after_over_before_per_round"])
    write_result(args.name, out, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
