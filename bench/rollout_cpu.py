"""The worker's CPU per rollout on its agent side alone: tracer, executor, spans -> trace -> triplets -> JSON.

Run: python bench/rollout_cpu.py [--in-flight 500] [--seconds 10]

One process, no Redis: keeps ``--in-flight`` MockLLMAgent rollouts (3 turns of
0.1-0.5 s, an LLM-call span and a reward span each) running on a real
:class:`AgentExecutor`, and finishes each the way the runner does: the
rollout's trace finished, :func:`to_rollout` (span_json, triplets) and
``model_dump_json``, on a thread of its own as the worker's bookkeeping thread
does. What it reports is the part of ``bench/profile.py``'s worker CPU that
does not depend on Redis or RQ, with far less noise: process CPU per rollout,
and how much of it the cyclic garbage collector took (it runs on whichever
thread allocates, so py-spy charges it to unrelated frames). Writes
bench/results/rollout_cpu.json.
"""

from __future__ import annotations

import argparse
import gc
import queue
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agents import MockLLMAgent  # noqa: E402
from bench.common import write_result  # noqa: E402
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
    args = parser.parse_args()

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
    print(
        f"{result['rollouts_per_s']} rollouts/s at {args.in_flight} in flight; CPU {result['cpu_ms_per_rollout']} "
        f"ms/rollout, of which GC {result['gc_ms_per_rollout']} ms {result['gc_ms_per_rollout_by_generation']}"
    )
    if not args.no_write:
        write_result("rollout_cpu", result, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
