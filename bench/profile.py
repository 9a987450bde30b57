"""Where a rollq worker's CPU goes per rollout: py-spy on both workers of the mock-LLM run.

Run: python bench/profile.py [--in-flight 1000] [--seconds 20] [--tasks-per-job 16 --out profile_packs]
     (needs py-spy: pip install py-spy)

Runs the mock-LLM setting of ``bench/mock_llm.py`` (2 ``RolloutWorker``
processes, concurrency in-flight / 2), and once it is warm samples both
workers with ``py-spy record --gil`` (only stacks holding the GIL, i.e. Python
CPU time). Each sample is put in the most specific bucket its stack matches
(the list below, checked from the innermost frame out), and the buckets are
reported as CPU milliseconds per rollout beside the workers' total CPU per
rollout from psutil (which also counts time outside the GIL: socket I/O,
hiredis parsing), and beside each thread's own CPU per rollout (psutil's
per-thread times over the same window, the threads named as ``py-spy dump``
names them, summed over both workers). The per-thread figures are exact; the
GIL-held samples are not: py-spy reads a running process without stopping it
(``--nonblocking``) at 100 Hz, and on 2026-12-05 they covered 0.55 ms of a
0.89 ms rollout with packs (``profile_packs.json``), where ``perf record`` of the
same setting put three quarters of the workers' CPU in the interpreter's own
code (libpython). Writes bench/results/profile.json (``--out``: another name).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import outcomes, private_redis, rollq_workers, write_result  # noqa: E402
from bench.mock_llm import Feeder  # noqa: E402
from rollq.producer import Producer  # noqa: E402

RATE_HZ = 100
WARMUP_SECONDS = 8.0

# (bucket, substrings of a frame that put a sample in it); the innermost matching frame wins.
BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("RQ dequeue: Job.fetch (HGETALL + parse)", ("Job.fetch ",)),
    ("RQ dequeue: worker state HSET per job", ("set_state ",)),
    ("RQ dequeue: BLMOVE", ("Queue.lmove ", "blmove ")),
    (
        "rollq claim (claim.lua)",
        ("Lifecycle.claim ", "Lifecycle.claim_call ", "Lifecycle.claim_many_call ", "read_claim ", "read_claims "),
    ),
    (
        "rollq publish (finish.lua)",
        (
            "Lifecycle.finish ",
            "Lifecycle.finish_call ",
            "Lifecycle.finish_many_call ",
            "read_finish ",
            "read_finishes ",
        ),
    ),
    ("rollout -> JSON (model_dump_json)", ("model_dump_json ",)),
    ("spans -> trace dicts (span_json)", ("span_json ",)),
    ("trace -> triplets", ("triplets_from_trace ",)),
    ("normalize, other", ("to_rollout ",)),
    ("RQ start-of-job bookkeeping", ("prepare_execution ", "prepare_job_execution ", "RqLifecycle._rq_start ")),
    ("RQ end-of-job bookkeeping", ("handle_job_success ", "handle_job_failure ", "RqLifecycle._rq_end ")),
    # The batches' pipelines (claims with RQ's start writes; publications; RQ's end writes): packing and
    # sending the commands, reading the replies.
    ("start batch: the pipeline (claims + RQ start)", ("RqLifecycle._start_batch ",)),
    ("finish batch: the pipelines (publications, RQ end)", ("RqLifecycle._finish_batch ", "_end_jobs ")),
    ("rollq per-rollout tracer (root span, context)", ("OtelTracer.start_rollout ", "RolloutTrace.finish ")),
    ("agent code incl. its LLM/reward spans", ("training_rollout_async ", "validation_rollout_async ")),
    ("heartbeat + reaper thread", ("Heartbeat.",)),
    ("thread-pool hand-offs", ("ThreadPoolExecutor.submit ", "_WorkItem.run ")),
    # uvloop's loop runs in C: its own time (timers, handles) is sampled with the loop thread's outermost frame.
    ("event loop scheduling", ("AgentExecutor.start.<locals>.serve ",)),
    ("executor hand-offs (futures, call_soon_threadsafe)", ("AgentExecutor.", "_settle ")),
    ("rollq runner, other", ("AgentRunner.",)),
    ("RQ main loop, other", ("BaseWorker.work ",)),
    ("event loop scheduling", ("BaseEventLoop.",)),
]


def bucket_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, needles in BUCKETS:
            if any(needle in frame for needle in needles):
                return name
    return "other"


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of process ``pid``, by its OS thread id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


_DUMPED_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \([^)]*\): "([^"]*)"')


def thread_names(py_spy: str, pid: int) -> dict[int, str]:
    """The Python name of each thread of process ``pid``, by its OS thread id (``py-spy dump`` prints both)."""
    dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60).stdout
    names = {}
    for line in dump.splitlines():
        found = _DUMPED_THREAD.match(line)
        if found:
            names[int(found.group(1), 0)] = found.group(2)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--keep", type=Path, help="copy py-spy's raw stacks (one file per worker) into this folder")
    parser.add_argument(
        "--tasks-per-job", type=int, help="packs of this many tasks per RQ job (docs/rq.md), producer and workers"
    )
    parser.add_argument("--out", default="profile", help="results name: bench/results/<out>.json (default profile)")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        sys.exit("py-spy is not installed: pip install py-spy")

    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-profile-") as tmp:
        namespace = "profile"
        producer = Producer.from_url(server.url, namespace, tasks_per_job=args.tasks_per_job)
        connection = server.client()
        workers = rollq_workers(
            server.url,
            namespace,
            2,
            agent="bench.agents:MockLLMAgent",
            concurrency=args.in_flight // 2,
            log_dir=Path(tmp),
            extra_env={"ROLLQ_TASKS_PER_JOB": str(args.tasks_per_job)} if args.tasks_per_job else None,
        )
        workers.wait_registered(connection, namespace)
        feeder = Feeder(
            server.client(),
            f"rq:queue:{namespace}",
            args.in_flight,
            lambda n: producer.enqueue_many([{"question": i} for i in range(n)], mode="train"),
        )
        feeder.start()

        def done() -> int:
            return sum(outcomes(connection, namespace))

        try:
            time.sleep(WARMUP_SECONDS)
            outputs = [Path(tmp) / f"spy-{p.pid}.txt" for p in workers.processes]
            c0, cpu0, t0 = done(), workers.cpu_seconds(), time.monotonic()
            threads0 = [thread_cpu(p.pid) for p in workers.processes]
            spies = [
                subprocess.Popen(
                    [
                        py_spy,
                        "record",
                        "--gil",
                        "--nonblocking",
                        "-r",
                        str(RATE_HZ),
                        "-d",
                        str(args.seconds),
                        "-f",
                        "raw",
                        "-o",
                        str(out),
                        "-p",
                        str(p.pid),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for p, out in zip(workers.processes, outputs, strict=True)
            ]
            for spy in spies:
                spy.wait(timeout=args.seconds + 60)
            c1, cpu1, t1 = done(), workers.cpu_seconds(), time.monotonic()
            threads1 = [thread_cpu(p.pid) for p in workers.processes]
            names = [thread_names(py_spy, p.pid) for p in workers.processes]
            workers.check_alive()
        finally:
            feeder.stop()
            workers.stop()
        samples: Counter[str] = Counter()
        unmatched: Counter[str] = Counter()
        for out in outputs:
            for line in out.read_text().splitlines():
                if line.strip():
                    stack, count = line.rsplit(" ", 1)
                    frames = stack.split(";")
                    bucket = bucket_of(frames)
                    samples[bucket] += int(count)
                    if bucket == "other":
                        unmatched[frames[-1]] += int(count)

        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for out in outputs:
                shutil.copy(out, args.keep / out.name)

    rollouts = c1 - c0
    seconds = t1 - t0
    to_ms = 1000 / RATE_HZ / rollouts
    buckets = {name: round(count * to_ms, 3) for name, count in samples.most_common()}
    by_thread: Counter[str] = Counter()
    for before, after, named in zip(threads0, threads1, names, strict=True):
        for tid, used in after.items():
            by_thread[named.get(tid, "(unnamed)")] += used - before.get(tid, 0.0)
    threads = {name: round(1000 * used / rollouts, 3) for name, used in by_thread.most_common() if used > 0}
    result = {
        "in_flight": args.in_flight,
        "worker_processes": 2,
        "seconds": round(seconds, 1),
        "rollouts": rollouts,
        "rollouts_per_s": round(rollouts / seconds, 1),
        "worker_cpu_ms_per_rollout": round(1000 * (cpu1 - cpu0) / rollouts, 3),
        "gil_held_ms_per_rollout": round(sum(samples.values()) * to_ms, 3),
        "gil_held_fraction_per_process": round(sum(samples.values()) / RATE_HZ / seconds / 2, 2),
        "buckets_ms_per_rollout": buckets,
        "cpu_ms_per_rollout_by_thread": threads,
        "other_innermost_frames_ms_per_rollout": {f: round(c * to_ms, 3) for f, c in unmatched.most_common(8)},
        "note": "py-spy --gil samples at 100 Hz, --nonblocking; profiling itself slows the workers somewhat",
    }
    print(
        f"{result['rollouts_per_s']} rollouts/s while sampled; "
        f"worker CPU {result['worker_cpu_ms_per_rollout']} ms/rollout, "
        f"of which GIL held {result['gil_held_ms_per_rollout']} ms; each process held the GIL "
        f"{100 * result['gil_held_fraction_per_process']:.0f}% of the time"
    )
    for name, ms in buckets.items():
        print(f"  {ms:7.3f} ms  {name}")
    print("CPU per rollout by thread (both workers, psutil):")
    for name, ms in threads.items():
        print(f"  {ms:7.3f} ms  {name}")
    if result["gil_held_ms_per_rollout"] > result["worker_cpu_ms_per_rollout"]:
        # A thread that holds the GIL while it waits for a core is sampled as holding it: on an oversubscribed
        # machine the buckets count that waiting too, at whatever line the thread was, and only the CPU is exact.
        result["oversubscribed"] = True
        print("  GIL held > CPU used: the machine was oversubscribed; the buckets include waits for a core")
    write_result(args.out, result, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
