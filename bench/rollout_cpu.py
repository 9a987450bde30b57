"""The worker's CPU per rollout on its agent side alone: tracer, executor, spans -> trace -> triplets -> JSON.

Run: python bench/rollout_cpu.py [--in-flight 500] [--seconds 10]
     python bench/rollout_cpu.py --base main [--rounds 6]   (before/after in one run)

One process, no Redis: keeps ``--in-flight`` MockLLMAgent rollouts (3 turns of
0.1-0.5 s, an LLM-call span and a reward span each) running on a real
:class:`AgentExecutor`, and finishes each the way the runner does: the
rollout's trace finished, :func:`to_rollout` (span_json, triplets) and
``model_dump_json``, on a thread of its own as the worker's bookkeeping thread
does. What it reports is the part of ``bench/profile.py``'s worker CPU that
does not depend on Redis or RQ, with far less noise: process CPU per rollout,
and how much of it the cyclic garbage collector took (it runs on whichever
thread allocates, so py-spy charges it to unrelated frames), at the young-generation threshold a worker sets
(``widen_young_generation``). Writes
bench/results/rollout_cpu.json.

With ``--base COMMIT`` it measures this tree and that commit (a temporary ``git
worktree``) taking turns, round after round (the first to go alternates), each
run in a process of its own with its tree's rollq and bench agents first on the
path, and writes the per-round figures and new/base ratios to
bench/results/rollout_cpu_before_after.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# A --base run measures another tree's rollq with this script: its root goes first on the path.
sys.path.insert(0, os.environ.get("ROLLQ_BENCH_TREE") or str(ROOT))

from bench.agents import MockLLMAgent  # noqa: E402
from bench.common import write_result  # noqa: E402
from rollq.worker.collector import widen_young_generation  # noqa: E402
from rollq.worker.executor import AgentExecutor  # noqa: E402
from rollq.worker.normalize import to_rollout  # noqa: E402
from rollq.worker.tracer import OtelTracer, RolloutTrace  # noqa: E402

WARMUP_SECONDS = 3.0


class GcClock:
    """Seconds spent in the cyclic garbage collector, by generation (from ``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            generation = info["generation"]
            self.seconds[generation] += time.thread_time() - self._started
            self.collections[generation] += 1

    def snapshot(self) -> tuple[list[float], list[int]]:
        return list(self.seconds), list(self.collections)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    parser.add_argument("--base", help="a commit measured in turns with this tree (before/after in one run)")
    parser.add_argument("--rounds", type=int, default=6, help="with --base: runs of each tree")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one run's figures, for --base
    args = parser.parse_args()
    if args.base:
        before_after(args)
        return

    widen_young_generation()  # as a worker's start-up does: Python's default would over-weight the collector here
    clock = GcClock()
    tracer = OtelTracer()
    agent = MockLLMAgent()
    executor = AgentExecutor()
    executor.start()
    finished: queue.SimpleQueue[tuple[RolloutTrace, str, Future[Any]]] = queue.SimpleQueue()
    done = 0
    counter = 0

    def start() -> None:
        nonlocal counter
        counter += 1
        rollout_id = f"r{counter}"
        rollout_trace = tracer.start_rollout(rollout_id, 1)
        rollout_trace.root.set_attributes({"rollq.namespace": "bench", "rollq.mode": "train", "rollq.resources_id": ""})
        future = executor.submit(
            agent.rollout_call("train"), ({"question": counter}, rollout_id, {}), rollout_trace.context, True, 60.0
        )
        future.add_done_callback(lambda f: finished.put((rollout_trace, rollout_id, f)))

    def finish_loop() -> None:
        nonlocal done
        while True:
            rollout_trace, rollout_id, future = finished.get()
            spans = rollout_trace.finish(reward=None)
            rollout = to_rollout(rollout_id, future.result(), spans)
            rollout.model_dump_json()
            done += 1
            start()

    for _ in range(args.in_flight):
        start()
    threading.Thread(target=finish_loop, name="finisher", daemon=True).start()
    time.sleep(WARMUP_SECONDS)
    gc0, n0, c0, t0, cpu0 = *clock.snapshot(), done, time.monotonic(), time.process_time()
    time.sleep(args.seconds)
    gc1, n1, c1, t1, cpu1 = *clock.snapshot(), done, time.monotonic(), time.process_time()
    executor.stop()

    rollouts = c1 - c0
    per = 1000 / rollouts
    result = {
        "in_flight": args.in_flight,
        "seconds": round(t1 - t0, 1),
        "rollouts": rollouts,
        "rollouts_per_s": round(rollouts / (t1 - t0), 1),
        "cpu_ms_per_rollout": round((cpu1 - cpu0) * per, 3),
        "gc_ms_per_rollout": round((sum(gc1) - sum(gc0)) * per, 3),
        "gc_ms_per_rollout_by_generation": [round((b - a) * per, 3) for a, b in zip(gc0, gc1, strict=True)],
        "gc_collections_per_rollout_by_generation": [round((b - a) / rollouts, 3) for a, b in zip(n0, n1, strict=True)],
        "gc_threshold": list(gc.get_threshold()),
        "note": "one process, no Redis: the agent-side part of the worker's CPU per rollout",
    }
    if args.json:
        print("RESULT " + json.dumps(result))
        return
    print(
        f"{result['rollouts_per_s']} rollouts/s at {args.in_flight} in flight; CPU {result['cpu_ms_per_rollout']} "
        f"ms/rollout, of which GC {result['gc_ms_per_rollout']} ms {result['gc_ms_per_rollout_by_generation']}"
    )
    if not args.no_write:
        write_result("rollout_cpu", result, sys.argv[1:], settings=vars(args))


FIGURES = ("cpu_ms_per_rollout", "gc_ms_per_rollout", "rollouts_per_s")
"""What a --base round records of each tree's run."""


def one_run(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement of ``tree``'s rollq, in a process of its own."""
    argv = [sys.executable, __file__, "--json", "--in-flight", str(args.in_flight), "--seconds", str(args.seconds)]
    env = {**os.environ, "ROLLQ_BENCH_TREE": str(tree)}
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True, timeout=600)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    found: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return found


def before_after(args: argparse.Namespace) -> None:
    # Imported here: a --json child runs with the base tree's bench first on its path, which may not have it.
    from bench.common import base_tree

    rounds = []
    with base_tree(args.base) as base:
        assert base is not None
        for n in range(args.rounds):
            trees = [("head", ROOT), ("base", base)]
            got = {name: one_run(tree, args) for name, tree in (trees if n % 2 == 0 else trees[::-1])}
            ratio = got["head"]["cpu_ms_per_rollout"] / got["base"]["cpu_ms_per_rollout"]
            rounds.append(
                {
                    "round": n + 1,
                    "first": "head" if n % 2 == 0 else "base",
                    **{f"{tree}_{key}": got[tree][key] for tree in ("base", "head") for key in FIGURES},
                    "ratio": round(ratio, 3),
                    "load_average_1min": round(os.getloadavg()[0], 2),
                }
            )
            print(
                f"round {n + 1}: base {got['base']['cpu_ms_per_rollout']} ms, head {got['head']['cpu_ms_per_rollout']} "
                f"ms CPU per rollout: head/base {ratio:.3f} (load {rounds[-1]['load_average_1min']})",
                flush=True,
            )
    ratios = [r["ratio"] for r in rounds]

    def median_of(tree: str, key: str) -> float:
        return round(statistics.median(r[f"{tree}_{key}"] for r in rounds), 3)

    result = {
        "base": args.base,
        "in_flight": args.in_flight,
        "seconds": args.seconds,
        "cpu_ms_per_rollout": {
            "base": median_of("base", "cpu_ms_per_rollout"),
            "head": median_of("head", "cpu_ms_per_rollout"),
        },
        "gc_ms_per_rollout": {
            "base": median_of("base", "gc_ms_per_rollout"),
            "head": median_of("head", "gc_ms_per_rollout"),
        },
        "ratio_median": round(statistics.median(ratios), 3),
        "ratios": ratios,
        "rounds": rounds,
        "note": "medians over rounds; ratio = head/base CPU per rollout within a round (the two runs taking turns)",
    }
    print(f"head/base CPU per rollout: median {result['ratio_median']} over {len(ratios)} rounds {ratios}")
    if not args.no_write:
        write_result("rollout_cpu_before_after", result, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
