"""Worker CPU and Redis round trips per rollout: this tree beside an earlier commit, in one run.

Run: python bench/before_after.py [--base 1c72b18] [--rounds 2] [--seconds 10]

The earlier commit (by default 1c72b18, rollq 0.2.0 as it landed, before the
batched job starts and ends and the tracer/GC work) is checked out into a
temporary git worktree, and each measurement runs once per tree, taking turns,
round after round, so drift hits both alike:

- ``bench/profile.py`` of each tree (2 worker processes, mock-LLM agents with
  spans, 1000 in flight): worker CPU per rollout (psutil) and rollouts/s;
- ``bench/noop.py``'s round-trip count of each tree (one worker in-process,
  no-op agent, burst): Redis round trips and commands per rollout at
  concurrency 1, 16 and 256.

Each tree runs with its own code only (``PYTHONPATH`` puts its root first, and
its bench scripts start their workers with it). Writes bench/results/before_after.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_result  # noqa: E402

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


def in_tree(tree: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help="the earlier commit to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=10, help="py-spy window per profile run")
    parser.add_argument("--jobs", type=int, default=1000, help="no-op jobs per round-trip count")
    args = parser.parse_args()
    if not (shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()):
        sys.exit("py-spy is not installed: pip install py-spy")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="rollq-base-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=ROOT, check=True)
        try:
            trees = {"before": base, "after": ROOT}
            profiles: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for r in range(args.rounds):
                for label, tree in trees.items():
                    run = profile(tree, args.seconds)
                    profiles[label].append(run)
                    print(
                        f"round {r + 1} {label:6s}: {run['worker_cpu_ms_per_rollout']:.3f} ms worker CPU/rollout,"
                        f" {run['rollouts_per_s']:.0f} rollouts/s at 1000 in flight",
                        flush=True,
                    )
            trips = {label: round_trips(tree, args.jobs) for label, tree in trees.items()}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    out: dict[str, Any] = {"base": args.base, "head": head.stdout.strip(), "rounds": args.rounds}
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
        }
    for label in ("before", "after"):
        o = out[label]
        print(f"{label:6s}: {o['worker_cpu_ms_per_rollout']:.3f} ms/rollout; round trips per rollout", end="")
        print(", ".join(f" {k.split(', ')[-1]}: {v['round_trips_per_job']}" for k, v in o["round_trips"].items()))
    write_result("before_after", out, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
