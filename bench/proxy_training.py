"""The capturing proxy's cost per call with the training features on, beside the plain proxy, in one run.

bench/capture.py's harness: simulated backends (the demo's OpenAI-compatible LLM, latency uniform in 0.5-1.5 x
``--latency``) in processes of their own, proxies in processes of their own, this process as the load
(``--concurrency`` calls in flight, aiohttp). Rounds alternate three paths so drift hits all alike:

- ``direct``: straight to a backend;
- ``plain``: a worker's ``CaptureProxy`` with one open attempt on one backend, as bench/capture.py measures;
- ``training``: a ``CaptureProxy`` whose LLM resource names two backends (sticky rendezvous routing, retries and
  ejection armed), enforces ``temperature`` for ``train`` mode and asks for logprobs (which the backend returns and
  the proxy parses), every call admitted through the weight-sync gate, whose follower reports to a private Redis
  every second as a worker's heartbeat would; the calls spread over 8 attempts (rollouts), so both backends serve.

Every proxy's process collects garbage as a worker process does (rollq.worker.collector's young-generation
threshold). Reports per path the path's own latency (client time less the backend's reported generation time) at p50/p99
and the proxy process's CPU per call (user + system, psutil, over that path's rounds only).

With ``--base COMMIT`` the plain and training proxies of rollq as of that commit (a temporary ``git worktree``)
take their turns in every round too (``plain_base``, ``training_base``; the base's paths go first every other
round): before and after in one run, per round.

    python bench/proxy_training.py [--calls 4096] [--concurrency 256] [--rounds 4] [--latency 0.5] [--base COMMIT]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capture import _pct, _start, serve_backend, serve_proxy  # noqa: E402
from bench.common import base_tree, commit_of, private_redis, write_result  # noqa: E402

ATTEMPTS = 8


def _cprofile() -> Any:
    """The standard library's cProfile: bench/profile.py, on the path as the script's directory, shadows the
    ``profile`` module cProfile imports."""
    here = str(Path(__file__).resolve().parent)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import cProfile
    finally:
        sys.path[:] = saved
    return cProfile


def serve_training_proxy(backends: list[str], redis_url: str, profile: str | None = None) -> None:
    import redis
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from rollq.models.contract import LLM
    from rollq.models.llm_options import with_options
    from rollq.store.keys import Keys
    from rollq.store.llm_gate import GateReporter
    from rollq.worker.capture import CaptureProxy
    from rollq.worker.capture.gate import CallGate
    from rollq.worker.capture.pause import PauseFollower
    from rollq.worker.tracer import OtelTracer

    tracer = OtelTracer(TracerProvider())
    proxy = CaptureProxy(gate=CallGate(60.0)).start()
    connection = redis.Redis.from_url(redis_url)
    follower = PauseFollower(GateReporter(connection, Keys("bench"), "bench-proxy", 1.0), proxy.gate)
    follower.start()
    stop = threading.Event()

    def heartbeat() -> None:  # the worker's heartbeat piggyback, once a second
        while not stop.wait(1.0):
            pipe = connection.pipeline(transaction=False)
            read = follower.queue(pipe)
            read(pipe.execute(raise_on_error=False)[0])

    threading.Thread(target=heartbeat, daemon=True).start()
    llm = with_options(
        LLM(endpoint=backends[0], model="sim"), endpoints=backends, modes={"train": {"temperature": 1.0}}
    )
    endpoints, rollouts = [], []
    for i in range(ATTEMPTS):
        rollout = tracer.start_rollout(f"bench-{i}", 1)
        resources, _ = proxy.open_attempt(
            {"llm": llm},
            trace.set_span_in_context(rollout.root),
            tracer.capture_tracer(),
            rollout_id=f"bench-{i}",
            mode="train",
            resources_id="v1",
        )
        rewritten = resources["llm"]
        assert isinstance(rewritten, LLM)
        endpoints.append(rewritten.endpoint)
        rollouts.append(rollout)
    profiler = _cprofile().Profile(time.process_time)  # CPU time: this process does nothing but proxy
    if profile:
        assert proxy._loop is not None
        proxy._loop.call_soon_threadsafe(profiler.enable)  # the proxy's own thread
    print(" ".join(endpoints), flush=True)
    sys.stdin.read()
    if profile:
        done = threading.Event()
        assert proxy._loop is not None
        proxy._loop.call_soon_threadsafe(lambda: (profiler.disable(), done.set()))
        done.wait(10)
        profiler.dump_stats(profile)
    stop.set()
    print(sum(len(r.finish()) for r in rollouts), file=sys.stderr)
    follower.stop()
    proxy.stop()


def _child(*args: str, tree: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """This script (or ``tree``'s copy of it, with ``tree``'s rollq) in a process of its own, its garbage collector
    set as in a worker process (bench/capture.py's ``_start``); its first line."""
    child = _start(*args, tree=tree, script=Path(__file__).name)
    return child.proc, child.line


async def _round(session: aiohttp.ClientSession, bases: list[str], calls: int, concurrency: int) -> list[float]:
    gate = asyncio.Semaphore(concurrency)
    body = {"model": "sim", "messages": [{"role": "user", "content": "Compute 2 + 3."}], "temperature": 0.0}
    latencies: list[float] = []
    cycle = itertools.cycle(bases)

    async def one(base: str) -> None:
        async with gate:
            started = time.perf_counter()
            async with session.post(f"{base}/chat/completions", json=body) as response:
                data = await response.json()
                assert response.status == 200, data
            latencies.append(time.perf_counter() - started - float(response.headers["X-Sim-Seconds"]))

    await asyncio.gather(*(one(next(cycle)) for _ in range(calls)))
    return latencies


async def measure(paths: dict[str, tuple[list[str], int | None]], args: argparse.Namespace) -> dict[str, Any]:
    processes = {name: psutil.Process(pid) for name, (_, pid) in paths.items() if pid is not None}
    latencies: dict[str, list[float]] = {name: [] for name in paths}
    cpu = dict.fromkeys(paths, 0.0)
    rounds: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for bases, _ in paths.values():  # warm every path's connections
            await _round(session, bases, args.concurrency, args.concurrency)
        per_round = args.calls // args.rounds
        for n in range(args.rounds):
            row: dict[str, Any] = {"round": n + 1}
            names = list(paths)
            if n % 2:  # with --base, the base's paths go first every other round
                names = (
                    [names[0]]
                    + [m for m in names[1:] if m.endswith("_base")]
                    + [m for m in names[1:] if not m.endswith("_base")]
                )
            for name in names:
                bases = paths[name][0]
                process = processes.get(name)
                before = sum(process.cpu_times()[:2]) if process else 0.0
                values = await _round(session, bases, per_round, args.concurrency)
                latencies[name] += values
                row[f"{name}_p50_ms"] = round(_pct(values, 0.50) * 1000, 3)
                if process:
                    used = sum(process.cpu_times()[:2]) - before
                    cpu[name] += used
                    row[f"{name}_cpu_ms_per_call"] = round(used * 1000 / len(values), 3)
            for name in ("plain", "training"):
                if f"{name}_base_cpu_ms_per_call" in row:
                    base_cpu = row[f"{name}_base_cpu_ms_per_call"]
                    row[f"{name}_cpu_new_over_base"] = round(row[f"{name}_cpu_ms_per_call"] / base_cpu, 3)
            row["load_1min"] = round(os.getloadavg()[0], 1)
            rounds.append(row)
    summary: dict[str, Any] = {}
    for name, values in latencies.items():
        summary[name] = {
            "calls": len(values),
            "p50_ms": round(_pct(values, 0.50) * 1000, 3),
            "p99_ms": round(_pct(values, 0.99) * 1000, 3),
            "mean_ms": round(statistics.fmean(values) * 1000, 3),
        }
        if name in processes:
            summary[name]["proxy_cpu_ms_per_call"] = round(cpu[name] * 1000 / len(values), 3)
    plain, training = summary["plain"]["proxy_cpu_ms_per_call"], summary["training"]["proxy_cpu_ms_per_call"]
    summary["training_minus_plain_cpu_ms_per_call"] = round(training - plain, 3)
    summary["rounds"] = rounds
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4096, help="calls per path (default 4096)")
    parser.add_argument("--concurrency", type=int, default=256, help="calls in flight (default 256)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4)")
    parser.add_argument("--latency", type=float, default=0.5, help="mean backend latency per call, s (default 0.5)")
    parser.add_argument("--base", help="a commit whose proxies take their turn in every round too (before/after)")
    parser.add_argument("--serve", choices=("backend", "proxy", "training"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    parser.add_argument("--profile", help="write a cProfile (CPU time) of the training proxy's thread to this file")
    args = parser.parse_args()
    if args.serve == "backend":
        return serve_backend(args.latency)
    if args.serve == "proxy":
        return serve_proxy(args.backend)
    if args.serve == "training":
        return serve_training_proxy(args.backend.split(","), args.redis, args.profile)
    children: list[subprocess.Popen[str]] = []
    with private_redis() as server, base_tree(args.base) as tree:
        try:
            first, b1 = _child("--serve", "backend", "--latency", str(args.latency))
            second, b2 = _child("--serve", "backend", "--latency", str(args.latency))
            plain, plain_url = _child("--serve", "proxy", "--backend", b1)
            profile = ["--profile", str(Path(args.profile).resolve())] if args.profile else []
            training, training_urls = _child(
                "--serve", "training", "--backend", f"{b1},{b2}", "--redis", server.url, *profile
            )
            children = [first, second, plain, training]
            paths = {
                "direct": ([b1, b2], None),
                "plain": ([plain_url], plain.pid),
                "training": (training_urls.split(), training.pid),
            }
            if tree is not None:
                plain_base, plain_base_url = _child("--serve", "proxy", "--backend", b1, tree=tree)
                children.append(plain_base)
                training_base, training_base_urls = _child(
                    "--serve", "training", "--backend", f"{b1},{b2}", "--redis", server.url, tree=tree
                )
                children.append(training_base)
                paths["plain_base"] = ([plain_base_url], plain_base.pid)
                paths["training_base"] = (training_base_urls.split(), training_base.pid)
            data = asyncio.run(measure(paths, args))
        finally:
            for proc in reversed(children):
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(10)
    argv = [f"--calls={args.calls}", f"--concurrency={args.concurrency}", f"--rounds={args.rounds}"]
    argv += [f"--latency={args.latency}"] + ([f"--base={args.base}"] if args.base else [])
    if args.base:
        data["base_commit"] = commit_of(args.base)
    settings = {k: v for k, v in vars(args).items() if k not in ("serve", "backend", "redis", "profile", "base")}
    if args.profile:  # a profiled run costs more CPU per call: not a result
        print(json.dumps(data, indent=2))
        return
    path = write_result("proxy_training", {"settings": settings, **data}, argv)
    print(json.dumps(data, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
