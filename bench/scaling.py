"""How cost grows: rollouts/s and CPU per rollout as worker processes go 1 -> 8 and in flight 32 -> 10,000.

Run: python bench/scaling.py [--window 8] [--processes 1,2,4,8] [--in-flight 32,256,1000,3000,10000]

The mock-LLM workload of bench/al.py (3 turns x U(0.1, 0.5) s with spans; ideal = in flight / 0.9 s),
measured the same way (warm-up, then ``--window`` seconds of steady state, a trainer thread reading
every rollout). Two sweeps: worker processes at 1000 in flight in all (concurrency 1000 / processes),
and in flight at 2 processes. On 2 shared cores the machine, not rollq, sets the ceiling: the rows
report the workers' and Redis's CPU per rollout, which is what a bigger machine would divide by.
Writes bench/results/scaling.json and docs/scaling.png.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.al import run_rollq  # noqa: E402
from bench.common import ROOT, write_result  # noqa: E402
from bench.mock_llm import add_ideal  # noqa: E402

PLOT = ROOT / "docs" / "scaling.png"
PROCESS_SWEEP_IN_FLIGHT = 1000
IN_FLIGHT_SWEEP_PROCESSES = 2


def plot(rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), dpi=110)
    for ax, sweep, key, label in (
        (axes[0], "processes", "worker_processes", "worker processes (1000 in flight in all)"),
        (axes[1], "in_flight", "in_flight", "rollouts in flight (2 worker processes)"),
    ):
        mine = sorted((r for r in rows if r["sweep"] == sweep), key=lambda r: r[key])
        xs = [r[key] for r in mine]
        ax.plot(xs, [r["rollouts_per_s"] for r in mine], "o-", color="C0", label="rollouts/s")
        ax.plot(xs, [r["ideal_rollouts_per_s"] for r in mine], "--", color="grey", label="ideal (in flight / 0.9 s)")
        ax.set_xscale("log", base=2 if sweep == "processes" else 10)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel(label)
        ax.set_ylabel("rollouts / s")
        if sweep == "in_flight":
            ax.set_yscale("log")
        cpu = ax.twinx()
        cpu.plot(xs, [r["worker_cpu_ms_per_rollout"] for r in mine], "s:", color="C3", label="worker CPU ms/rollout")
        cpu.plot(
            xs, [r["coordinator_cpu_ms_per_rollout"] for r in mine], "^:", color="C2", label="Redis CPU ms/rollout"
        )
        cpu.set_ylabel("CPU ms per rollout")
        cpu.set_ylim(bottom=0)
        lines = ax.get_legend_handles_labels()
        more = cpu.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("rollq on 2 shared cores: mock LLM rollouts (3 turns x 0.1-0.5 s)", fontsize=11)
    fig.tight_layout()
    fig.savefig(PLOT)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--processes", default="1,2,4,8")
    parser.add_argument("--in-flight", default="32,256,1000,3000,10000")
    args = parser.parse_args()
    settings = [("processes", int(n), PROCESS_SWEEP_IN_FLIGHT) for n in args.processes.split(",")]
    settings += [
        ("in_flight", IN_FLIGHT_SWEEP_PROCESSES, int(n))
        for n in args.in_flight.split(",")
        if not (int(n) == PROCESS_SWEEP_IN_FLIGHT and IN_FLIGHT_SWEEP_PROCESSES in [s[1] for s in settings])
    ]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rollq-bench-scaling-") as logs:
        for sweep, processes, in_flight in settings:
            row: dict[str, Any] = {"sweep": sweep, "worker_processes": processes, "in_flight": in_flight}
            row.update(run_rollq("mock", in_flight, args.window, Path(logs), processes=processes))
            add_ideal(row, in_flight)
            print(
                f"  {processes} processes, {in_flight:5d} in flight: {row['rollouts_per_s']:7.1f}/s "
                f"({row['percent_of_ideal']:.0f}%), worker CPU {row['worker_cpu_ms_per_rollout']:.2f} ms, "
                f"Redis {row['coordinator_cpu_ms_per_rollout']:.2f} ms per rollout, RSS {row['worker_rss_mb']} MB, "
                f"other processes {row['other_processes_cpu_cores']:.2f} cores",
                flush=True,
            )
            rows.append(row)
    # The 1000-in-flight, 2-process point belongs to both sweeps.
    shared = next((r for r in rows if r["worker_processes"] == 2 and r["in_flight"] == PROCESS_SWEEP_IN_FLIGHT), None)
    if shared:
        rows.append({**shared, "sweep": "in_flight"})
    write_result("scaling", {"window_seconds": args.window, "rows": rows}, sys.argv[1:], settings=vars(args))
    plot(rows)


if __name__ == "__main__":
    main()
