"""LLM calls as the agents see them in a worker: capture off, and the capturing proxy on a thread of its own or on
the agents' loop, each called over its socket or handed the calls in memory.

Run: python bench/agent_calls.py [--in-flight 16 64 256] [--rounds 3] [--window 15] [--collector Y,M,O]
[--workers NAME ...] [--out NAME]

``bench/capture.py`` measures the proxy in a process of its own beside a stand-in for the agents' load. This one
measures it where it runs: sample-agent rollouts (``bench.agents:CallTimingSampleAgent``: rollq's sample agent, the
``openai`` client, 1-2 calls of 0.1-0.5 s to the demo's simulated LLM) on 2 stock worker processes, each call timed
by the agent's own HTTP client (request sent to answer read) less the generation time the simulated LLM reports:
what the path to the LLM costs the agent, its own client and loop included. Nine workers take turns at each
``--in-flight`` (order reversed every round, ``--window`` s measured each; ``--workers`` picks some of them):

- ``capture off`` (``ROLLQ_CAPTURE_LLM=0``): the agents call the LLM directly, nothing recorded;
- ``proxy thread, socket`` (``ROLLQ_CAPTURE_IN_MEMORY=0``): the capturing proxy on a thread and loop of its own,
  called over its socket (the default before calls were handed over in memory);
- ``proxy thread, in memory``: the same proxy, the agents' async ``openai`` clients handing their calls to it in
  memory, each served on the agents' loop that made it while that loop keeps up, else on the proxy's thread (the
  default; from commit 8648cf5 to the busy check, always on the agents' loop);
- ``proxy thread, in memory, always on the agents' loop`` (``ROLLQ_CAPTURE_AGENT_LOOP_BUSY_MS`` beyond reach): the
  same, without the busy check;
- ``proxy thread, in memory, served on its thread`` (``ROLLQ_CAPTURE_IN_MEMORY_ON_AGENT_LOOP=0``): the calls handed
  over in memory served on the proxy's thread and passed back (the default until this release);
- ``proxy thread, in memory, GIL switch interval always 1 ms`` (the bench agent's ``ROLLQ_BENCH_SWITCH_INTERVAL_MS``):
  the default with the process's switch interval at 1 ms throughout, as the proxy set it from its start until it
  lowered it only while its thread serves a call;
- ``proxy thread, in memory, GIL switch interval left at 5 ms`` (``ROLLQ_CAPTURE_SWITCH_INTERVAL_MS=0``);
- ``proxy on the agents' loop, socket`` (``ROLLQ_CAPTURE_ON_AGENT_LOOP=1``, ``ROLLQ_CAPTURE_IN_MEMORY=0``);
- ``proxy on the agents' loop, in memory`` (``ROLLQ_CAPTURE_ON_AGENT_LOOP=1``).

Added latency is each capture setting's p50 and p99 less capture off's in the same round; added CPU per call is its
worker CPU per rollout less capture off's, over its calls per rollout. Each worker process's garbage collections in
the window are recorded too (every one stops every thread), and how late the agents' loop's 100 ms ticks ran, on
average (what the worker reads to serve calls handed over in memory on the proxy's thread while its loop is busy),
with the share of those ticks that found the GIL switch interval below Python's 5 ms.
With ``--collector Y,M,O`` one more worker takes its turn: the proxy thread over its socket with the collector's
thresholds set to those. Writes bench/results/agent_calls.json (``--out NAME``: NAME.json).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capture import agents_taking_turns  # noqa: E402
from bench.common import write_result  # noqa: E402

AGENT = "bench.agents:CallTimingSampleAgent"
OFF = "capture off"
SYSTEMS: dict[str, dict[str, str]] = {
    OFF: {"ROLLQ_CAPTURE_LLM": "0"},
    "proxy thread, socket": {"ROLLQ_CAPTURE_IN_MEMORY": "0"},
    "proxy thread, in memory": {},
    "proxy thread, in memory, always on the agents' loop": {"ROLLQ_CAPTURE_AGENT_LOOP_BUSY_MS": "1000000"},
    "proxy thread, in memory, served on its thread": {"ROLLQ_CAPTURE_IN_MEMORY_ON_AGENT_LOOP": "0"},
    "proxy thread, in memory, GIL switch interval always 1 ms": {"ROLLQ_BENCH_SWITCH_INTERVAL_MS": "1"},
    "proxy thread, in memory, GIL switch interval left at 5 ms": {"ROLLQ_CAPTURE_SWITCH_INTERVAL_MS": "0"},
    "proxy on the agents' loop, socket": {"ROLLQ_CAPTURE_ON_AGENT_LOOP": "1", "ROLLQ_CAPTURE_IN_MEMORY": "0"},
    "proxy on the agents' loop, in memory": {"ROLLQ_CAPTURE_ON_AGENT_LOOP": "1"},
}
"""The workers taking turns, by name: the environment each runs with (written to the results file)."""


def _row(row: dict[str, Any], off: dict[str, Any] | None) -> dict[str, Any]:
    """One worker's round, its calls and collections in the window, and its added latency over capture off's."""
    window = row["in_window"]
    slim = {k: row[k] for k in ("round", "system", "rollouts", "failed", "rollouts_per_s", "worker_cpu_ms_per_rollout")}
    slim |= {
        "other_processes_cpu_cores": row["other_processes_cpu_cores"],
        "calls": window["calls"],
        "call_p50_ms": window["call_p50_ms"],
        "call_p99_ms": window["call_p99_ms"],
        "collections": window["collections"],
        "young_p50_ms": window["collection_p50_ms"][0],
        "young_longest_ms": window["collection_longest_ms"][0],
        "collector_share_of_wall_percent": window["collector_share_of_wall_percent"],
        "loop_lag_mean_ms": window.get("loop_lag_mean_ms"),
        "short_switch_interval_percent": window.get("short_switch_interval_percent"),
    }
    if off is not None and row is not off:
        slim["added_p50_ms"] = round(window["call_p50_ms"] - off["in_window"]["call_p50_ms"], 2)
        slim["added_p99_ms"] = round(window["call_p99_ms"] - off["in_window"]["call_p99_ms"], 2)
        slim["cpu_over_off"] = round(row["worker_cpu_ms_per_rollout"] / off["worker_cpu_ms_per_rollout"], 3)
        if window["calls"]:
            added = row["worker_cpu_ms_per_rollout"] - off["worker_cpu_ms_per_rollout"]
            slim["added_cpu_ms_per_call"] = round(added * row["rollouts"] / window["calls"], 3)
    return slim


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per worker: medians over its rounds."""
    summary = []
    for system in dict.fromkeys(r["system"] for r in rows):
        mine = [r for r in rows if r["system"] == system]

        def median(key: str, mine: list[dict[str, Any]] = mine) -> float | None:
            values = [r[key] for r in mine if r.get(key) is not None]
            return round(statistics.median(values), 2) if values else None

        summary.append({
            "system": system,
            "rounds": len(mine),
            **{
                key: median(key)
                for key in (
                    "rollouts_per_s", "worker_cpu_ms_per_rollout", "call_p50_ms", "call_p99_ms", "added_p50_ms",
                    "added_p99_ms", "cpu_over_off", "added_cpu_ms_per_call", "young_p50_ms", "young_longest_ms",
                    "loop_lag_mean_ms", "short_switch_interval_percent",
                )
            },
        })  # fmt: skip
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[16, 64, 256], help="rollouts in flight, over "
                        "2 worker processes, one level after another (default 16 64 256)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="rounds per level (default 3)")
    parser.add_argument("--window", type=float, default=15.0, help="seconds measured per worker and round (default 15)")
    parser.add_argument("--collector", help="one more worker: the proxy thread (socket) with gc thresholds Y,M,O")
    parser.add_argument("--workers", nargs="+", choices=list(SYSTEMS)[1:], metavar="NAME",
                        help="only these workers beside capture off (default: all)")  # fmt: skip
    parser.add_argument("--out", default="agent_calls", help="results name: bench/results/<out>.json")
    args = parser.parse_args()
    envs = {name: env for name, env in SYSTEMS.items() if name == OFF or not args.workers or name in args.workers}
    if args.collector:
        envs[f"proxy thread, collector {args.collector}"] = {
            "ROLLQ_BENCH_GC_THRESHOLDS": args.collector,
            "ROLLQ_CAPTURE_IN_MEMORY": "0",
        }
    levels = []
    for in_flight in args.in_flight:
        raw = agents_taking_turns(
            dict.fromkeys(envs, AGENT),
            rounds=args.rounds,
            window=args.window,
            in_flight=in_flight,
            prefix=f"agent-calls-{in_flight}",
            record_gc=True,
            envs=envs,
        )
        offs = {r["round"]: r for r in raw if r["system"] == OFF}
        rows = [_row(r, offs.get(r["round"])) for r in raw]
        levels.append({"in_flight": in_flight, "summary": _summary(rows), "rows": rows})
        for s in levels[-1]["summary"]:
            print(f"{in_flight:4d} in flight  {s['system']:40s} call p50 {s['call_p50_ms']} p99 {s['call_p99_ms']} ms"
                  f"  added {s['added_p50_ms']} / {s['added_p99_ms']}  CPU {s['worker_cpu_ms_per_rollout']} ms/rollout"
                  f" (added per call {s['added_cpu_ms_per_call']})",
                  flush=True)  # fmt: skip
    argv = ["--in-flight", *map(str, args.in_flight), f"--rounds={args.rounds}", f"--window={args.window}"]
    if args.collector:
        argv.append(f"--collector={args.collector}")
    if args.workers:
        argv += ["--workers", *map(shlex.quote, args.workers)]
    if args.out != "agent_calls":
        argv.append(f"--out={args.out}")
    path = write_result(args.out, {"workers": envs, "levels": levels}, argv, settings=vars(args))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
