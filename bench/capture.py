"""What the LLM-capturing proxy adds: the same calls straight to a backend and through the proxy, in one run.

Three processes: a backend (the demo's simulated OpenAI-compatible LLM, latency
uniform in 0.5-1.5 x ``--latency``, token ids on), the capturing proxy alone (a worker's ``CaptureProxy``
with one open attempt, spans recorded into a rollout trace as in a worker), and
this process as the load: ``--concurrency`` calls in flight with aiohttp,
rounds alternating direct / through the proxy so drift hits both alike.

Latency here is each call's time at the client less the generation time the
backend reports (``X-Sim-Seconds``): the time the path itself costs, free of the
backend's random latency. Reports it per path at p50/p99, the added latency
(proxy minus direct, per percentile) and the proxy process's CPU per call (user
+ system, from psutil, over the proxied rounds only).

Then the same at rollout level: sample-agent rollouts (the ``openai`` client
against the simulated LLM, 1-2 calls of 0.1-0.5 s each) at ``--concurrency`` in
flight on 2 stock worker processes, capture off and on in alternating rounds,
rollouts/s compared (``bench/mock_llm.py``'s measurement window).

    python bench/capture.py [--calls 2048] [--concurrency 256] [--rounds 4] [--latency 0.5]
                            [--rollout-rounds 2] [--window 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result  # noqa: E402


def serve_backend(latency: float) -> None:
    from rollq.ops.sim_llm import SimulatedLLM

    # Spread like real generations, so calls do not arrive at the proxy in lock-step bursts.
    with SimulatedLLM(latency=(0.5 * latency, 1.5 * latency)) as llm:
        print(llm.url, flush=True)
        sys.stdin.read()  # until the parent closes our stdin


def serve_proxy(backend: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from rollq.models.contract import LLM
    from rollq.worker.capture import CaptureProxy
    from rollq.worker.tracer import OtelTracer

    tracer = OtelTracer(TracerProvider())
    proxy = CaptureProxy().start()
    rollout = tracer.start_rollout("bench", 1)
    resources, _ = proxy.open_attempt(
        {"llm": LLM(endpoint=backend, model="sim")}, trace.set_span_in_context(rollout.root), tracer.capture_tracer()
    )
    llm = resources["llm"]
    assert isinstance(llm, LLM)
    print(llm.endpoint, flush=True)
    sys.stdin.read()
    print(len(rollout.finish()), file=sys.stderr)
    proxy.stop()


def _child(*args: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def _round(session: aiohttp.ClientSession, base: str, calls: int, concurrency: int) -> list[float]:
    gate = asyncio.Semaphore(concurrency)
    body = {"model": "sim", "messages": [{"role": "user", "content": "Compute 2 + 3."}], "temperature": 0.0}
    latencies: list[float] = []

    async def one() -> None:
        async with gate:
            started = time.perf_counter()
            async with session.post(f"{base}/chat/completions", json=body) as response:
                data = await response.json()
                assert response.status == 200, data
            # The path's own time: the call's latency less the backend's (reported) generation time.
            latencies.append(time.perf_counter() - started - float(response.headers["X-Sim-Seconds"]))

    await asyncio.gather(*(one() for _ in range(calls)))
    return latencies


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(direct: str, proxied: str, proxy_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    proxy = psutil.Process(proxy_pid)
    results: dict[str, list[float]] = {"direct": [], "proxy": []}
    cpu = 0.0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _round(session, direct, args.concurrency, args.concurrency)  # warm both paths' connections
        await _round(session, proxied, args.concurrency, args.concurrency)
        per_round = args.calls // args.rounds
        for _ in range(args.rounds):
            results["direct"] += await _round(session, direct, per_round, args.concurrency)
            before = sum(proxy.cpu_times()[:2])
            results["proxy"] += await _round(session, proxied, per_round, args.concurrency)
            cpu += sum(proxy.cpu_times()[:2]) - before
    summary: dict[str, Any] = {}
    for path, values in results.items():
        summary[path] = {
            "calls": len(values),
            "p50_ms": round(_pct(values, 0.50) * 1000, 3),
            "p99_ms": round(_pct(values, 0.99) * 1000, 3),
            "mean_ms": round(statistics.fmean(values) * 1000, 3),
        }
    summary["added_p50_ms"] = round(summary["proxy"]["p50_ms"] - summary["direct"]["p50_ms"], 3)
    summary["added_p99_ms"] = round(summary["proxy"]["p99_ms"] - summary["direct"]["p99_ms"], 3)
    summary["proxy_cpu_ms_per_call"] = round(cpu * 1000 / len(results["proxy"]), 3)
    return summary


def rollouts_on_and_off(args: argparse.Namespace) -> dict[str, Any]:
    """Sample-agent rollouts (the ``openai`` client against the simulated LLM), capture off vs on, interleaved."""
    import tempfile

    from bench.common import outcomes, private_redis, rollq_workers
    from bench.mock_llm import WORKER_PROCESSES, measure
    from rollq.ops.sim_llm import SimulatedLLM
    from rollq.producer import Producer
    from rollq.store.keys import Keys
    from rollq.worker.sample_agent import sample_inputs, sample_resources

    rows: list[dict[str, Any]] = []
    with private_redis() as server, SimulatedLLM(latency=(0.1, 0.5)) as llm:
        log_dir = Path(tempfile.mkdtemp(prefix="rollq-bench-capture-"))
        for round_ in range(args.rollout_rounds):
            for capture in ("0", "1"):
                namespace = f"capture-{capture}-{round_}"
                producer = Producer.from_url(server.url, namespace)
                producer.update_resources(sample_resources(temperature=0.5, endpoint=llm.url))
                connection = server.client()

                def enqueue(n: int, producer: Producer = producer) -> None:
                    producer.enqueue_many(sample_inputs(n), mode="train")

                def completions(namespace: str = namespace, connection: Any = connection) -> tuple[int, int]:
                    return outcomes(connection, namespace)

                workers = rollq_workers(
                    server.url,
                    namespace,
                    WORKER_PROCESSES,
                    agent="rollq.worker.sample_agent:SampleAgent",
                    concurrency=args.concurrency // WORKER_PROCESSES,
                    log_dir=log_dir,
                    extra_env={"ROLLQ_CAPTURE_LLM": capture},
                )
                row = measure(
                    server,
                    system=f"capture {'on' if capture == '1' else 'off'}",
                    in_flight=args.concurrency,
                    processes=WORKER_PROCESSES,
                    workers=workers,
                    queue_name=namespace,
                    running_key=Keys(namespace).inflight,
                    enqueue=enqueue,
                    completions=completions,
                    window=args.window,
                )
                rows.append({k: row[k] for k in ("system", "rollouts", "failed", "seconds", "rollouts_per_s")})
                rows[-1]["worker_cpu_ms_per_rollout"] = row["worker_cpu_ms_per_rollout"]
                rows[-1]["other_processes_cpu_cores"] = row["other_processes_cpu_cores"]
    on = sum(r["rollouts"] for r in rows if r["system"] == "capture on")
    on_s = sum(r["seconds"] for r in rows if r["system"] == "capture on")
    off = sum(r["rollouts"] for r in rows if r["system"] == "capture off")
    off_s = sum(r["seconds"] for r in rows if r["system"] == "capture off")
    return {"rows": rows, "on_vs_off_percent": round(100 * (on / on_s) / (off / off_s), 1) if off else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2048, help="calls per path (default 2048)")
    parser.add_argument("--concurrency", type=int, default=256, help="calls in flight (default 256)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4)")
    parser.add_argument("--latency", type=float, default=0.5, help="mean backend latency per call, s (default 0.5)")
    parser.add_argument(
        "--rollout-rounds", type=int, default=2, help="rounds of sample-agent rollouts, capture off then on (default 2)"
    )
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per rollout round (default 20)")
    parser.add_argument("--serve", choices=("backend", "proxy"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "backend":
        return serve_backend(args.latency)
    if args.serve == "proxy":
        return serve_proxy(args.backend)
    backend, direct = _child("--serve", "backend", "--latency", str(args.latency))
    proxy, proxied = _child("--serve", "proxy", "--backend", direct)
    try:
        summary = measure(direct, proxied, proxy.pid, args)
        data = asyncio.run(summary)
    finally:
        for proc in (proxy, backend):
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(10)
    argv = [f"--calls={args.calls}", f"--concurrency={args.concurrency}", f"--rounds={args.rounds}"]
    argv += [f"--latency={args.latency}", f"--rollout-rounds={args.rollout_rounds}", f"--window={args.window}"]
    if args.rollout_rounds:
        data["rollouts"] = rollouts_on_and_off(args)
        print(json.dumps(data["rollouts"], indent=2))
    settings = {k: v for k, v in vars(args).items() if k not in ("serve", "backend")}
    path = write_result("capture", data, argv, settings=settings)
    print(json.dumps(data, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
