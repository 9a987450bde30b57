"""CPU per LLM call by call rate: the capturing proxy, rollq's bare HTTP forwarder and a raw one, in one run.

Run: python bench/call_rate.py [--latencies 2.0 0.5 0.1 0.02] [--concurrency 256] [--seconds 8] [--rounds 2]

A forwarder's CPU per call is not one number on this machine kind: it depends on how often calls come. The same
Python code costs several times more CPU when it runs in short bursts between waits (each burst starts with cold
caches, after the kernel has woken the thread) than when it runs back to back. The proxy's CPU target (issue 24)
is measured at 256 calls in flight of 0.5 s each, about 500 calls a second: bursts about 1 ms apart.

This measures, in one run:

- **the same Python work, back to back and between sleeps**: a captured call's record made by the proxy's own
  functions (the chat request and the answer read, the span's attributes built and written) run 2,000 times back
  to back, then with a sleep of 0.5, 2 and 20 ms after each run; the thread's CPU per run (``time.thread_time``),
  less what the same sleeps cost the thread with no work between them (measured right after; medians of 5);
- **forwarders at several call rates**: bench/capture.py's harness (the demo's simulated LLM in a process of its
  own, latency uniform in 0.5-1.5 x the mean; ``--concurrency`` calls in flight from this process with aiohttp),
  for each mean latency in ``--latencies`` (from 2 s, about 130 calls a second, down to 0.02 s, as many as the 2
  cores carry), four forwarders each in a process of its own, taking turns (order rotated every round):
  ``capture`` (a worker's ``CaptureProxy``, as bench/capture.py runs it), ``rollq_http`` (its HTTP server and client
  with nothing captured), ``raw`` (bare asyncio protocols, no HTTP library: bench/proxy_floor.py's) and ``native``
  (bench/proxy_floor.py's compiled forwarder, its calls recorded in Python every 20 ms; it needs cargo and
  Debian's librust-hyper-dev and librust-tokio-dev). Per forwarder and rate: calls a second reached and its
  process's CPU (user + system, psutil; the native forwarder's binary included, and also given apart) per call.

The ratio that matters is within a row: the capture proxy over the raw forwarder at the same rate, and each
forwarder at the target's rate over itself when calls come as fast as it takes them.

Writes bench/results/call_rate.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capture import Child, _child, _round, _start  # noqa: E402
from bench.common import cpu_split, write_result  # noqa: E402
from rollq.worker.capture import answers, codec, spans, tokens  # noqa: E402
from rollq.worker.capture.calls import CallKind, CapturedCall  # noqa: E402

FORWARDERS = ("capture", "rollq_http", "raw", "native")
GAPS_MS = (0.0, 0.5, 2.0, 20.0)
MAX_CALLS = 16_000
"""Calls per forwarder and round at most (at the highest rates the cores, not the latency, set the pace)."""

_REQUEST = orjson.dumps(
    {"model": "sim", "messages": [{"role": "user", "content": "Compute 2 + 3. " * 8}], "temperature": 0.0}
)
_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "model": "sim",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "5"}, "finish_reason": "stop", "token_ids": [20]}
        ],
        "prompt_token_ids": list(range(40)),
        "usage": {"prompt_tokens": 40, "completion_tokens": 1},
    }
)


def call_like_work() -> bytes:
    """A captured call's record, with the proxy's own functions: the request read, the answer read into a
    :class:`CapturedCall`, the call's span attributes built and written (what the span and its JSON cost beyond
    that is not in it)."""
    body = codec.loads(_REQUEST)
    call = CapturedCall(
        kind=CallKind.CHAT,
        resource="main",
        path="chat/completions",
        start_ns=time.time_ns(),
        request_model=body["model"],
        messages=body["messages"],
    )
    if not answers.read_whole(call, _ANSWER):  # as the proxy reads a whole answer
        tokens.read_response(call, codec.loads(_ANSWER))
    call.end_ns, call.status = time.time_ns(), 200
    return codec.dumps(spans.attributes(call))


def _cpu_us_per_run(n: int, gap_ms: float, work: bool) -> float:
    started = time.thread_time()
    for _ in range(n):
        if work:
            call_like_work()
        if gap_ms:
            time.sleep(gap_ms / 1000)
    return (time.thread_time() - started) / n * 1e6


def work_between_sleeps(runs: int = 2000, repeats: int = 5) -> list[dict[str, Any]]:
    """CPU microseconds per :func:`call_like_work` run, back to back and with each gap; and the same sleeps with
    no work (the thread's own cost of going to sleep and being woken), so that the work's own cost between sleeps
    is the difference. Each repeat measures the two one after the other; medians of ``repeats``."""
    rows: list[dict[str, Any]] = []
    for gap_ms in GAPS_MS:
        n = runs if gap_ms < 10 else runs // 5  # 20 ms gaps: 400 runs already take 8 s
        pairs = [
            (_cpu_us_per_run(n, gap_ms, True), _cpu_us_per_run(n, gap_ms, False) if gap_ms else 0.0)
            for _ in range(repeats)
        ]
        rows.append(
            {
                "gap_ms": gap_ms,
                "runs": n,
                "cpu_us_per_run": round(statistics.median(w for w, _ in pairs), 1),
                "cpu_us_sleep_alone": round(statistics.median(s for _, s in pairs), 1),
                "cpu_us_work": round(statistics.median(w - s for w, s in pairs), 1),
            }
        )
    for row in rows:
        row["work_over_back_to_back"] = round(row["cpu_us_work"] / rows[0]["cpu_us_work"], 2)
    return rows


async def _rates(forwarders: dict[str, Child], latency: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per round, each forwarder in turn: calls a second and CPU per call."""
    calls = min(MAX_CALLS, max(4 * args.concurrency, int(args.concurrency / latency * args.seconds)))
    rows: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for child in forwarders.values():  # warm every path's connections
            await _round(session, child.line, args.concurrency, args.concurrency, token_ids=True)
        names = list(forwarders)
        for n in range(args.rounds):
            for name in names[n % len(names) :] + names[: n % len(names)]:
                process = psutil.Process(forwarders[name].proc.pid)
                before, started = cpu_split(process), time.perf_counter()
                values, _ = await _round(session, forwarders[name].line, calls, args.concurrency, token_ids=True)
                seconds = time.perf_counter() - started
                after = cpu_split(process)
                used, by_children = sum(after) - sum(before), after[1] - before[1]
                rows.append(
                    {
                        "round": n + 1,
                        "forwarder": name,
                        "calls": len(values),
                        "calls_per_s": round(len(values) / seconds, 1),
                        "cpu_ms_per_call": round(used * 1000 / len(values), 3),
                        "children_cpu_ms_per_call": round(by_children * 1000 / len(values), 3),
                    }
                )
    return rows


def at_latency(latency: float, args: argparse.Namespace) -> dict[str, Any]:
    """The forwarders against one backend of ``latency`` s (mean), rounds rotated."""
    backend, direct = _child("--serve", "backend", "--latency", str(latency))
    forwarders: dict[str, Child] = {}
    try:
        forwarders["capture"] = _start("--serve", "proxy", "--backend", direct)
        for name in FORWARDERS[1:]:
            forwarders[name] = _start("--serve", name, "--backend", direct, script="proxy_floor.py")
        rounds = asyncio.run(_rates(forwarders, latency, args))
    finally:
        for proc in [child.proc for child in forwarders.values()] + [backend]:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(10)
    row: dict[str, Any] = {"latency_s": latency}
    for name in FORWARDERS:
        mine = [r for r in rounds if r["forwarder"] == name]
        calls = sum(r["calls"] for r in mine)
        row[name] = {
            "calls_per_s": round(statistics.fmean(r["calls_per_s"] for r in mine), 1),
            "cpu_ms_per_call": round(sum(r["cpu_ms_per_call"] * r["calls"] for r in mine) / calls, 3),
            "per_round": [r["cpu_ms_per_call"] for r in mine],
        }
        if name == "native":  # its binary's share; the rest is the Python process recording the calls
            row[name]["binary_cpu_ms_per_call"] = round(
                sum(r["children_cpu_ms_per_call"] * r["calls"] for r in mine) / calls, 3
            )
    row["capture_over_raw"] = round(row["capture"]["cpu_ms_per_call"] / row["raw"]["cpu_ms_per_call"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--latencies",
        type=float,
        nargs="+",
        default=[2.0, 0.5, 0.1, 0.02],
        help="mean backend latencies per call, s: one call rate each (default 2.0 0.5 0.1 0.02)",
    )
    parser.add_argument("--concurrency", type=int, default=256, help="calls in flight (default 256)")
    parser.add_argument("--seconds", type=float, default=8.0, help="about how long each forwarder's turn runs")
    parser.add_argument("--rounds", type=int, default=2, help="turns per forwarder and rate (default 2)")
    parser.add_argument("--out", default="call_rate", help="results name: bench/results/<out>.json")
    args = parser.parse_args()
    work = work_between_sleeps()
    print(json.dumps(work, indent=2), flush=True)
    rates = []
    for latency in args.latencies:
        rates.append(at_latency(latency, args))
        print(json.dumps(rates[-1]), flush=True)
    fastest = max(rates, key=lambda r: r["capture"]["calls_per_s"])
    for row in rates:
        for name in FORWARDERS:
            row[name]["over_fastest_rate"] = round(row[name]["cpu_ms_per_call"] / fastest[name]["cpu_ms_per_call"], 2)
    argv = ["--latencies", *map(str, args.latencies), f"--concurrency={args.concurrency}"]
    argv += [f"--seconds={args.seconds}", f"--rounds={args.rounds}"]
    argv += [f"--out={args.out}"] if args.out != "call_rate" else []
    path = write_result(args.out, {"work_between_sleeps": work, "rates": rates}, argv, settings=vars(args))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
