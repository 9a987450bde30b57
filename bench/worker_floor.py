"""The floor under a worker's CPU per rollout: the benchmark's mock agent in a bare asyncio loop, no rollq, no RQ.

Run: python bench/worker_floor.py [--in-flight 1000] [--seconds 15] [--rounds 1] [--with-rollq [--tasks-per-job 1,16]]

What CPython, the OpenTelemetry SDK and redis-py cost per rollout on this machine
with nothing of rollq around them: each of 2 processes (the mock-LLM setting of
``bench/mock_llm.py``, in flight / 2 each) is one uvloop loop that takes up to its
free slots of tasks with one BLMPOP, runs each as an asyncio task doing what
:class:`bench.agents.MockLLMAgent` does (3 turns, each an LLM-call span holding an
``asyncio.sleep`` of 0.1-0.5 s, then a reward span, all under a root span, the SDK
collecting the ended spans), and XADDs one entry per rollout to a results stream,
the rollouts that ended since its last write in one pipeline. Three forms, one run each:

- ``no-spans``: the three sleeps and the reward without any span (the loop, redis-py and JSON alone);
- ``bare``: the entry holds the rollout id, the final reward and the span count;
- ``trace``: the entry holds the spans too, as JSON dicts (name, ids, parent, times, attributes),
  a stand-in for the trace and triplets rollq publishes.

No claims, heartbeats, retries, hooks, time limits, RQ bookkeeping or
triplets: it is not a queue anyone could use, only the cost a worker cannot go
below with this agent in this language. ``--with-rollq`` measures rollq's 2
``RolloutWorker`` processes right after in each round, with the same settings
(``bench/mock_llm.py``'s run), at each ``--tasks-per-job`` pack size.
Writes bench/results/worker_floor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QUEUE = "floor"
QUEUE_KEY = f"rq:queue:{QUEUE}"  # the name bench.mock_llm's Feeder and Gauge look at
RESULTS_KEY = "floor:results"
REGISTERED_KEY = f"rq:workers:{QUEUE}"  # where bench.common.Workers.wait_registered looks
TURNS = 3
TURN_SECONDS = (0.1, 0.5)  # bench.agents.MockLLMAgent's
FORMS = ("no-spans", "bare", "trace")
"""What a floor worker does per rollout, see the module docstring."""


def child(url: str, concurrency: int, form: str) -> None:
    """One floor worker process: runs until killed."""
    import redis.asyncio as aredis
    import uvloop
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

    class Collect(SpanProcessor):
        """Keeps each trace's ended spans until its rollout takes them."""

        def __init__(self) -> None:
            self.spans: dict[int, list[ReadableSpan]] = {}

        def on_end(self, span: ReadableSpan) -> None:
            assert span.context is not None
            self.spans.setdefault(span.context.trace_id, []).append(span)

    collect = Collect()
    provider = TracerProvider()
    provider.add_span_processor(collect)
    tracer = provider.get_tracer("floor")

    def span_dict(span: ReadableSpan) -> dict[str, Any]:
        assert span.context is not None
        return {
            "name": span.name,
            "trace_id": f"0x{span.context.trace_id:032x}",
            "span_id": f"0x{span.context.span_id:016x}",
            "parent_id": f"0x{span.parent.span_id:016x}" if span.parent is not None else None,
            "start_time": span.start_time,
            "end_time": span.end_time,
            "attributes": dict(span.attributes or {}),
        }

    async def sleeps_only(task: bytes) -> dict[str, Any]:
        rollout_id = json.loads(task)["rollout_id"]
        reward = 0.0
        for turn in range(TURNS):
            await asyncio.sleep(random.uniform(*TURN_SECONDS))
            reward = 0.5 * turn
        return {"rollout_id": rollout_id, "final_reward": reward, "spans": 0}

    async def rollout(task: bytes) -> dict[str, Any]:
        rollout_id = json.loads(task)["rollout_id"]
        reward = 0.0
        with tracer.start_as_current_span("rollout", attributes={"rollout_id": rollout_id}) as root:
            for turn in range(TURNS):
                with tracer.start_as_current_span(
                    "llm.call", attributes={"gen_ai.request.model": "mock-llm", "gen_ai.prompt": f"turn {turn}"}
                ) as span:
                    await asyncio.sleep(random.uniform(*TURN_SECONDS))
                    span.set_attribute("gen_ai.completion", f"answer {turn}")
                reward = 0.5 * turn
                with tracer.start_as_current_span("reward", attributes={"reward": reward}):
                    pass
            trace_id = root.get_span_context().trace_id
        spans = collect.spans.pop(trace_id, [])
        entry: dict[str, Any] = {"rollout_id": rollout_id, "final_reward": reward, "spans": len(spans)}
        if form == "trace":
            entry["trace"] = [span_dict(s) for s in spans]
        return entry

    run = sleeps_only if form == "no-spans" else rollout

    async def serve() -> None:
        connection = aredis.from_url(url)
        await connection.sadd(REGISTERED_KEY, f"floor-{os.getpid()}")
        running: set[asyncio.Task[dict[str, Any]]] = set()
        ended: list[dict[str, Any]] = []
        slot_free, have_results = asyncio.Event(), asyncio.Event()

        def finished(task: asyncio.Task[dict[str, Any]]) -> None:
            running.discard(task)
            ended.append(task.result())
            slot_free.set()
            have_results.set()

        async def publish() -> None:
            while True:
                await have_results.wait()
                have_results.clear()
                batch = ended[:]
                ended.clear()
                async with connection.pipeline(transaction=False) as pipe:
                    for entry in batch:
                        pipe.xadd(RESULTS_KEY, {"rollout": json.dumps(entry)})
                    await pipe.execute()

        publisher = asyncio.create_task(publish())
        while not publisher.done():
            free = concurrency - len(running)
            if free == 0:
                slot_free.clear()
                await slot_free.wait()
                continue
            reply = await connection.execute_command("BLMPOP", 1, 1, QUEUE_KEY, "LEFT", "COUNT", free)
            if reply is None:
                continue
            for task_json in reply[1]:
                task = asyncio.create_task(run(task_json))
                running.add(task)
                task.add_done_callback(finished)
        publisher.result()

    trace.set_tracer_provider(provider)
    uvloop.run(serve())


def run_floor(server: Any, in_flight: int, window: float, log_dir: Path, form: str) -> dict[str, Any]:
    from bench.common import Workers, worker_env
    from bench.mock_llm import WORKER_PROCESSES, measure

    connection = server.client()
    connection.delete(QUEUE_KEY, RESULTS_KEY, REGISTERED_KEY)
    counter = iter(range(10**12))

    def enqueue(n: int) -> None:
        connection.rpush(QUEUE_KEY, *[json.dumps({"rollout_id": f"ro-{next(counter)}"}) for _ in range(n)])

    def completions() -> tuple[int, int]:
        return int(connection.xlen(RESULTS_KEY)), 0  # type: ignore[arg-type]

    command = [sys.executable, str(Path(__file__).resolve()), "--child", server.url, str(in_flight // WORKER_PROCESSES)]
    command.append(form)
    workers = Workers([command] * WORKER_PROCESSES, worker_env(), log_dir)
    row = measure(
        server,
        system=f"floor, {form}",
        in_flight=in_flight,
        processes=WORKER_PROCESSES,
        workers=workers,
        queue_name=QUEUE,
        running_key="floor:none",  # the floor keeps no running set: mean_running reads 0
        enqueue=enqueue,
        completions=completions,
        window=window,
    )
    connection.delete(QUEUE_KEY, RESULTS_KEY, REGISTERED_KEY)
    return row


def run_rollq_packed(server: Any, in_flight: int, window: float, log_dir: Path, tasks_per_job: int) -> dict[str, Any]:
    """bench/mock_llm.py's rollq run, its producer and workers with packs of ``tasks_per_job`` tasks."""
    from bench.mock_llm import run_rollq

    row = run_rollq(server, in_flight, window, log_dir, tasks_per_job=tasks_per_job)
    row["system"] = f"rollq, {tasks_per_job} task(s) per job"
    row["tasks_per_job"] = tasks_per_job
    return row


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=1, help="measure every form (and rollq) this many times")
    parser.add_argument("--with-rollq", action="store_true", help="measure rollq's workers too, in each round")
    parser.add_argument(
        "--tasks-per-job", default="1,16", help="with --with-rollq: the pack sizes to measure rollq with (comma list)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    args = parser.parse_args()

    from bench.common import private_redis, write_result

    packs = [int(k) for k in args.tasks_per_job.split(",")] if args.with_rollq else []
    rounds: list[list[dict[str, Any]]] = []
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-floor-") as tmp:
        for n in range(args.rounds):
            print(f"round {n + 1}", flush=True)
            rows = [run_floor(server, args.in_flight, args.seconds, Path(tmp), form) for form in FORMS]
            rows += [run_rollq_packed(server, args.in_flight, args.seconds, Path(tmp), k) for k in packs]
            rounds.append(rows)
    by_system: dict[str, dict[str, Any]] = {}
    for i, row in enumerate(rounds[0]):
        figures = [rows[i]["worker_cpu_ms_per_rollout"] for rows in rounds]
        by_system[row["system"]] = {"per_round": figures, "median": statistics.median(figures)}
    print("worker CPU ms per rollout, by round:")
    for system, found in by_system.items():
        print(f"  {system:28s} {' '.join(f'{f:5.2f}' for f in found['per_round'])}")
    if not args.no_write:
        result = {
            "worker_cpu_ms_per_rollout": by_system,
            "rows": [{"round": n + 1, **row} for n, rows in enumerate(rounds) for row in rows],
            "note": "the floor forms run no rollq code (bare asyncio + OpenTelemetry SDK + redis-py); mean_running "
            "reads 0 for them (they keep no running set)",
        }
        write_result("worker_floor", result, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
