"""Regenerate docs/benchmarks.md and docs/throughput.png from bench/results/*.json.

Run: python bench/report.py   (bench/run_all.py runs it after the benchmarks)

Every figure in the page comes from a results file; the notes on a target
that was missed are written only when the figures say it was missed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT  # noqa: E402
from bench.report_more import sections  # noqa: E402
from bench.report_util import fmt, load, table, verdict  # noqa: E402

DOCS = ROOT / "docs"
PAGE = DOCS / "benchmarks.md"
PLOT = DOCS / "throughput.png"


def plot(mock: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = mock["rows"]
    levels = sorted({r["in_flight"] for r in rows})
    span = [min(levels) * 0.8, max(levels) * 1.25]
    systems = (
        ("rollq", "o-", "C0", "rollq: 2 worker processes, concurrency = in flight / 2", (8, -12)),
        ("rq", "s-", "C1", "plain RQ: one SimpleWorker process per rollout in flight", (-28, 8)),
    )
    fig, (rate_ax, rss_ax) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=110)
    rate_ax.plot(
        span,
        [x / mock["mean_rollout_seconds"] for x in span],
        "--",
        color="grey",
        label=f"ideal (in flight / {mock['mean_rollout_seconds']:g} s)",
    )
    for system, style, color, label, offset in systems:
        mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["in_flight"])
        if not mine:
            continue
        xs = [r["in_flight"] for r in mine]
        rate_ax.plot(xs, [r["rollouts_per_s"] for r in mine], style, color=color, label=label)
        for r in mine:
            rate_ax.annotate(
                f"{r['rollouts_per_s']:.0f}",
                (r["in_flight"], r["rollouts_per_s"]),
                color=color,
                textcoords="offset points",
                xytext=offset,
                fontsize=8,
            )
        rss_ax.plot(xs, [r["worker_rss_mb"] for r in mine], style, color=color, label=f"{system}: RSS sum")
        rss_ax.plot(
            xs,
            [r["worker_uss_mb"] for r in mine],
            style.replace("-", ":"),
            color=color,
            alpha=0.6,
            label=f"{system}: USS sum (not shared)",
        )
        for r in mine:
            rss_ax.annotate(
                f"{r['worker_rss_mb']:,.0f} MB",
                (r["in_flight"], r["worker_rss_mb"]),
                color=color,
                textcoords="offset points",
                xytext=offset,
                fontsize=8,
            )
    rq_max = max((r["in_flight"] for r in rows if r["system"] == "rq"), default=0)
    if rq_max and rq_max < max(levels):
        note = f"plain RQ beyond {rq_max}:\nnot run (memory)"
        rate_ax.annotate(
            note, (max(levels), min(r["rollouts_per_s"] for r in rows)), color="C1", fontsize=8, ha="right"
        )
    rate_ax.plot([1000], [500], "r*", markersize=10, label="target at 1000 in flight: 500/s")
    rate_ax.set_ylabel("rollouts / s (steady state)")
    rate_ax.set_title("Throughput")
    rss_ax.set_ylabel("worker memory, MB")
    rss_ax.set_title("Worker memory while running")
    for ax in (rate_ax, rss_ax):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("rollouts in flight")
        ax.set_xticks(levels)
        ax.set_xticklabels([str(x) for x in levels])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    # After the log scale is set: limits set on a linear axis would carry a bottom of 0 over.
    rss_ax.set_ylim(bottom=10, top=max(r["worker_rss_mb"] for r in rows) * 3)
    fig.suptitle("Mock LLM rollouts (3 turns of 0.1-0.5 s) on 2 cores: rollq beside plain RQ", fontsize=11)
    fig.tight_layout()
    fig.savefig(PLOT)
    plt.close(fig)


def machine_section(docs: list[dict[str, Any]]) -> str:
    m = docs[0]["machine"]
    dates = sorted(d["date"] for d in docs)
    when = dates[0][:10] if dates[0][:10] == dates[-1][:10] else f"{dates[0][:10]} to {dates[-1][:10]}"
    return (
        f"Measured {when} on {m['cores']} cores ({m['cpu']}), {m['memory_gb']} GB RAM, {m['os']}; "
        f"Python {m['python']}, redis-server {m['redis_server']} on loopback (no persistence), "
        f"RQ {m['rq']}, redis-py {m['redis_py']} with hiredis. Every benchmark starts its own redis-server "
        "on a free port; the workers, Redis and the producer all share the same 2 cores."
    )


def noop_section(noop: dict[str, Any]) -> str:
    e2e = noop["end_to_end"]
    rows = [
        [
            r["label"],
            fmt(r["jobs_per_s"]),
            f"{r['time_per_job_vs_simpleworker']:.2f}x",
            f"{r['worker_cpu_ms_per_job']:.2f}",
            f"{r['cpu_per_job_vs_simpleworker']:.2f}x",
            fmt(r["commands_per_job"]),
            fmt(r["worker_rss_mb"]),
        ]
        for r in e2e
    ]
    trips = noop["round_trips"]
    trip_rows = [
        [
            r["label"],
            f"{r['round_trips_per_job']:.1f}",
            f"{r['round_trips_vs_simpleworker']:.2f}x",
            f"{r['commands_per_job']:.1f}",
            ", ".join(f"{k} {v:g}" for k, v in r["round_trips_per_job_by_command"].items()),
        ]
        for r in trips
    ]
    rounds = len(e2e[0]["rounds"])
    text = f"""## 1. No-op rollouts end to end

`{noop["command"]}`

Each configuration has 2 worker processes on the same redis-server; all of
them are up at once and take turns, {rounds} rounds, so that drift and other
load on the machine hit them alike (the median round is shown). A round is:
enqueue a batch in one pipelined call, run it, and receive every result in the
producer (rollq: `Producer.wait`; RQ: poll the finished registry, then read each
return value in one pipeline). "CPU" is the worker processes' user + system
time (for RQ's fork-per-job `Worker`, its work horses' too). Commands are
counted by Redis (`INFO commandstats`, commands run inside Lua included) over
the whole round, producer side too.

{
        table(
            [
                "configuration",
                "jobs/s",
                "time per job vs SimpleWorker",
                "worker CPU ms/job",
                "CPU vs SimpleWorker",
                "Redis commands/job",
                "worker RSS MB",
            ],
            rows,
        )
    }

Redis round trips per job, worker side, counted in the client (each packed
send is one; a pipeline or a Lua call is one): one worker in-process in burst
mode, (run of {noop["round_trip_jobs"][1]} jobs - run of {noop["round_trip_jobs"][0]}) / {
        noop["round_trip_jobs"][1] - noop["round_trip_jobs"][0]
    }, so start-up and
shutdown cancel out.

{table(["worker", "round trips/job", "vs SimpleWorker", "commands/job", "round trips by command"], trip_rows)}
"""
    return text


def mock_section(mock: dict[str, Any]) -> str:
    rows = []
    for r in sorted(mock["rows"], key=lambda r: (r["system"] != "rollq", r["in_flight"])):
        rows.append(
            [
                "rollq" if r["system"] == "rollq" else "plain RQ",
                r["in_flight"],
                r["worker_processes"],
                fmt(r["rollouts_per_s"]),
                f"{r['percent_of_ideal']:.1f}%",
                fmt(r["mean_running"]),
                r["min_queued"],
                fmt(r["worker_rss_mb"]),
                fmt(r["worker_uss_mb"]),
                f"{r['worker_cpu_ms_per_rollout']:.2f}",
                f"{r['redis_cpu_ms_per_rollout']:.2f}",
                f"{r['other_processes_cpu_cores']:.2f}",
            ]
        )
    comparison = [
        [
            c["in_flight"],
            fmt(c["rollq_rollouts_per_s"]),
            c["rq_processes"],
            fmt(c["rq_rollouts_per_s"]),
            f"{c['throughput_ratio']:.2f}x",
            f"{c['rss_ratio']:.3f}x",
            f"{c['cpu_per_rollout_ratio']:.2f}x",
        ]
        for c in mock["comparison"]
    ]
    cap = mock["rq_max_processes"]
    rq_rows = sorted((r for r in mock["rows"] if r["system"] == "rq"), key=lambda r: r["worker_processes"])
    if rq_rows:
        big = rq_rows[-1]
        per_process = big["worker_rss_mb"] / big["worker_processes"]
        cost = (
            f"{big['worker_processes']} forked RQ workers took {fmt(big['worker_rss_mb'] / 1024)} GB of RSS "
            f"({fmt(big['worker_uss_mb'] / 1024)} GB not shared); 1000 would need about "
            f"{fmt(per_process * 1000 / 1024, 0)} GB of RSS on this {rq_machine_gb(mock)} GB machine, so RQ's figure "
            f"at 1000 in flight is its {big['worker_processes']}-process figure."
        )
    else:
        cost = "RQ was not run (`--rq-max-processes 0`)."
    return f"""## 2. Mock LLM agents: 32, 256 and 1000 rollouts in flight

`{mock["command"]}`

A rollout is 3 turns; a turn is an LLM call that sleeps 0.1-0.5 s (uniform)
inside an LLM-call span, then a reward span, so a rollout takes
{mock["mean_rollout_seconds"]:g} s on average and the ideal rate is in-flight / {
        mock["mean_rollout_seconds"]:g} s. rollq runs 2
worker processes with concurrency in-flight / 2 and an async agent
(`bench/agents.py: MockLLMAgent`). Plain RQ runs one job per process, so it
needs one SimpleWorker process per rollout in flight: `rq worker-pool -n N -w
rq.worker.SimpleWorker` running the sync twin (`bench/rq_jobs.py: mock_llm`,
same sleeps, same spans), at most {cap} processes. {cost}
The producer keeps at least in-flight tasks queued ("queued (min)" is the
fewest seen). After a warm-up, completions are counted over {mock["window_seconds"]:g} s of steady
state; "running (mean)" is how many rollouts were actually running (rollq's
in-flight set, RQ's started registry), sampled four times a second.
"Other processes" is CPU that neither the workers, Redis nor the benchmark's
producer used: other work on the machine during the run.

{
        table(
            [
                "system",
                "in flight",
                "worker processes",
                "rollouts/s",
                "of ideal",
                "running (mean)",
                "queued (min)",
                "worker RSS MB (sum)",
                "worker USS MB (sum)",
                "worker CPU ms/rollout",
                "Redis CPU ms/rollout",
                "other processes, cores",
            ],
            rows,
        )
    }

rollq against plain RQ (RQ at min(in flight, {cap}) processes):

{
        table(
            [
                "in flight",
                "rollq rollouts/s",
                "RQ processes",
                "RQ rollouts/s",
                "rollq / RQ throughput",
                "rollq / RQ RSS",
                "rollq / RQ CPU per rollout",
            ],
            comparison,
        )
    }

![rollouts/s against rollouts in flight](throughput.png)
"""


def rq_machine_gb(mock: dict[str, Any]) -> str:
    return f"{mock['machine']['memory_gb']:.0f}"


def enqueue_section(enq: dict[str, Any]) -> str:
    rows = [
        [
            r["label"],
            fmt(r["tasks"], 0),
            fmt(r["tasks_per_s"], 0),
            f"{r['producer_cpu_us_per_task']:.1f}",
            f"{r['redis_cpu_us_per_task']:.1f}",
            f"{r['commands_per_task']:.1f}",
        ]
        for r in enq["rows"]
    ]
    return f"""## 3. Enqueue 100k tasks

`{enq["command"]}`

One call each, median of {len(enq["rows"][0]["rounds"])} rounds, same redis-server (flushed between rounds).
rollq writes, per task, the task record and an RQ job hash and pushes the job,
all in one Lua call (2000 calls per pipelined round trip); RQ's `enqueue_many`
pipelines its own commands.

{table(["producer", "tasks", "tasks/s", "producer CPU us/task", "Redis CPU us/task", "Redis commands/task"], rows)}
"""


def memory_section(mem: dict[str, Any]) -> str:
    rss = mem["rss_mb"]
    warm_key = next(k for k in rss if k.startswith("after_"))
    growth_key = next(k for k in mem if k.startswith("growth_mb_after_first_"))
    reached = (
        ""
        if mem["reached_target"]
        else (
            f"\n\n**The run stopped at {mem['rollouts']:,} rollouts**, short of {mem['rollouts_target']:,}, "
            "when its time limit passed."
        )
    )
    return f"""## 4. One worker's memory over {mem["rollouts"]:,} rollouts

`{mem["command"]}`

One `RolloutWorker` process, concurrency {mem["concurrency"]}, {mem["agent"]}; RSS sampled
every second. {mem["rollouts"]:,} rollouts in {mem["seconds"]:.0f} s ({fmt(mem["rollouts_per_s"])}/s), {
        mem["failed"]
    } failed.{reached}

{
        table(
            [
                "RSS before the first rollout",
                f"after {warm_key.removeprefix('after_')} rollouts",
                "peak",
                "end",
                "growth from start",
                f"growth after the first {warm_key.removeprefix('after_')}",
            ],
            [
                [
                    f"{rss['start']} MB",
                    f"{rss[warm_key]} MB",
                    f"{rss['peak']} MB",
                    f"{rss['end']} MB",
                    f"{mem['growth_mb_from_start']} MB",
                    f"{mem[growth_key]} MB",
                ]
            ],
        )
    }
"""


def profile_section(prof: dict[str, Any]) -> str:
    rows = [[name, f"{ms:.3f}"] for name, ms in prof["buckets_ms_per_rollout"].items()]
    return f"""## Where a worker's time goes at {prof["in_flight"]} in flight

`{prof["command"]}` (needs `pip install py-spy`)

Both workers of the mock-LLM setting sampled with `py-spy record --gil` (stacks
holding the GIL, i.e. Python CPU) for {prof["seconds"]:g} s: {fmt(prof["rollouts_per_s"])} rollouts/s while
sampled, {prof["worker_cpu_ms_per_rollout"]:.2f} ms of worker CPU per rollout (psutil), of which
{prof["gil_held_ms_per_rollout"]:.2f} ms with the GIL held; each process held the GIL
{100 * prof["gil_held_fraction_per_process"]:.0f}% of the time. CPU ms per rollout by where the sample was
(innermost matching frame; `bench/profile.py` lists the rules):

{table(["where", "GIL-held CPU ms per rollout"], rows)}
"""


def soak_section(soak: dict[str, Any]) -> str:
    """The kill storm: workers SIGKILLed under load, and what was lost or delivered twice (bench/soak.py)."""
    p = soak["parameters"]
    rows = [
        ["tasks in", soak["tasks_in"]],
        ["delivered (exactly once)", soak["delivered"]],
        ["lost", soak["lost"]],
        ["delivered twice", soak["duplicated"]],
        ["succeeded / failed", f"{soak['succeeded']} / {soak['failed']}"],
        ["superseded results (kept aside, not delivered)", soak["superseded"]],
        ["requeues by reason", ", ".join(f"{k} {v}" for k, v in sorted(soak["requeued"].items())) or "none"],
        ["SIGKILLs (with rollouts in flight)", f"{soak['kills']} ({soak['kills_with_tasks_in_flight']})"],
        [
            "kill to requeue of its last attempt, mean / max",
            f"{soak['kill_to_requeue_mean_s']} s / {soak['kill_to_requeue_max_s']} s",
        ],
        ["wall time, rollouts/s", f"{soak['elapsed_s']} s, {soak['rollouts_per_s']}"],
    ]
    settings = (
        f"{p['workers']} workers x concurrency {p['concurrency']}, a random worker SIGKILLed and replaced every "
        f"{p['kill_every']} s for {p['duration']:g} s, agent sleeping {p.get('sleep', '0.05-0.3')} s per task, "
        f"unresponsive_seconds {p['unresponsive']:g}, heartbeat {p['heartbeat']:g} s, max_attempts {p['max_attempts']}"
    )
    return "\n\n".join(
        [
            "## Soak: a kill storm",
            f"`{soak['command']}` ({soak['when']}, {soak['cpus']} CPUs): {settings}. Every task in must come out "
            "exactly once; the script exits 1 otherwise.",
            table(["measure", "value"], rows),
            "Kill to requeue runs from a SIGKILL to the requeue of the last attempt the killed worker had in "
            "flight: unresponsive_seconds, plus the wait for a reaper. Only the workers reap in this script (no "
            "producer waits), and in a storm each lives a few seconds, part of it starting up, so stretches pass "
            "with no reaper running; a trainer waiting on its rollouts reaps every 5 s as well. `stranded` "
            "requeues are jobs a killed worker had taken off the queue (taken ahead) but not yet claimed.",
        ]
    )


def capture_section(cap: dict[str, Any]) -> str:
    rows = [
        [path, cap[path]["calls"], fmt(cap[path]["p50_ms"]), fmt(cap[path]["p99_ms"]), fmt(cap[path]["mean_ms"])]
        for path in ("direct", "proxy")
    ]
    settings = cap["settings"]
    return f"""## LLM capture: calls through the capturing proxy vs straight to the backend

`{cap["command"]}`

{settings["concurrency"]} calls in flight against the demo's simulated LLM ({1000 * settings["latency"]:g} ms per
call on average, uniform in 0.5-1.5x, token ids on), in {settings["rounds"]} rounds alternating direct and
through a worker's `CaptureProxy` (its own process, recording a span per call as in a worker). Latency is
each call's time at the client less the generation time the backend reports: what the path itself costs.

{table(["path", "calls", "p50 ms (path only)", "p99 ms (path only)", "mean ms (path only)"], rows)}

Added latency: p50 {cap["added_p50_ms"]:+.1f} ms, p99 {cap["added_p99_ms"]:+.1f} ms (targets <= 1 ms and <= 5 ms);
proxy CPU per call {cap["proxy_cpu_ms_per_call"]:.2f} ms (target <= 0.5 ms). Load average (1, 5, 15 min) at the
end of the call rounds: {cap.get("load_average", "not recorded")}. The proxy is one Python thread per worker
process: at 256 calls in flight of about 0.5 s it must serve about 500 calls/s, i.e. that many times its CPU per
call of one core, and when the machine leaves it less, calls queue in it; that queue, not the hop itself, is most
of the added latency measured on this shared machine.
""" + _capture_rollouts(cap.get("rollouts"))


def _capture_rollouts(rollouts: dict[str, Any] | None) -> str:
    if not rollouts:
        return ""
    rows = [
        [r["system"], r["rollouts"], r["failed"], fmt(r["rollouts_per_s"]), fmt(r["worker_cpu_ms_per_rollout"], 2),
         fmt(r["other_processes_cpu_cores"], 2)]
        for r in rollouts["rows"]
    ]  # fmt: skip
    headers = ["capture", "rollouts", "failed", "rollouts/s", "worker CPU ms/rollout", "other processes' cores"]
    return f"""
Sample-agent rollouts (the `openai` client, 1-2 calls of 0.1-0.5 s) on 2 worker processes, capture off and on in
alternating rounds: with capture on, {rollouts["on_vs_off_percent"]}% of the rollouts/s with it off (target >= 95%).

{table(headers, rows)}
"""


def targets_section(
    noop: dict[str, Any] | None, mock: dict[str, Any] | None, enq: dict[str, Any] | None, mem: dict[str, Any] | None
) -> tuple[str, list[str]]:
    rows: list[list[str]] = []
    notes: list[str] = []
    if noop:
        simple = next(r for r in noop["end_to_end"] if r["label"] == "RQ SimpleWorker")
        rq_trips = next(r for r in noop["round_trips"] if r["label"] == "RQ SimpleWorker")
        for r in (r for r in noop["end_to_end"] if r["label"].startswith("rollq")):
            worst = max(r["time_per_job_vs_simpleworker"], r["cpu_per_job_vs_simpleworker"])
            rows.append(
                [
                    f"no-op cost vs RQ SimpleWorker ({r['label']})",
                    "at most 1.5x",
                    f"time {r['time_per_job_vs_simpleworker']:.2f}x, "
                    f"worker CPU {r['cpu_per_job_vs_simpleworker']:.2f}x",
                    verdict(worst <= 1.5),
                ]
            )
            if worst > 1.5:
                notes.append(
                    f"{r['label']}: a no-op rollout costs {worst:.2f}x an RQ SimpleWorker job "
                    f"({fmt(r['jobs_per_s'])} vs {fmt(simple['jobs_per_s'])} jobs/s)."
                )
        for r in (r for r in noop["round_trips"] if r["label"].startswith("rollq")):
            rows.append(
                [
                    f"worker round trips per job ({r['label']})",
                    "at most 1.5x SimpleWorker",
                    f"{r['round_trips_per_job']:.1f} vs {rq_trips['round_trips_per_job']:.1f} "
                    f"({r['round_trips_vs_simpleworker']:.2f}x)",
                    verdict(r["round_trips_vs_simpleworker"] <= 1.5),
                ]
            )
    if mock:
        by_level = {r["in_flight"]: r for r in mock["rows"] if r["system"] == "rollq"}
        if 256 in by_level:
            r = by_level[256]
            rows.append(
                [
                    "256 in flight, 2 worker processes",
                    "at least 90% of ideal",
                    f"{r['percent_of_ideal']:.1f}%",
                    verdict(r["percent_of_ideal"] >= 90),
                ]
            )
            if r["percent_of_ideal"] < 90:
                notes.append(
                    f"256 in flight reached {r['percent_of_ideal']:.1f}% of the ideal "
                    f"({fmt(r['rollouts_per_s'])} of {fmt(r['ideal_rollouts_per_s'])} rollouts/s)."
                )
        if 1000 in by_level:
            r = by_level[1000]
            rows.append(
                [
                    "1000 in flight, 2 worker processes",
                    "at least 500 rollouts/s",
                    fmt(r["rollouts_per_s"]),
                    verdict(r["rollouts_per_s"] >= 500),
                ]
            )
            if r["rollouts_per_s"] < 500:
                busy = r["worker_cpu_cores"] + r["redis_cpu_cores"] + r["producer_cpu_cores"]
                per_rollout = r["worker_cpu_ms_per_rollout"] + r["redis_cpu_ms_per_rollout"]
                notes.append(
                    f"1000 in flight reached {fmt(r['rollouts_per_s'])} rollouts/s, not 500 "
                    f"({r['percent_of_ideal']:.1f}% of the ideal {fmt(r['ideal_rollouts_per_s'])}/s). "
                    f"Each rollout cost {r['worker_cpu_ms_per_rollout']:.2f} ms of worker CPU and "
                    f"{r['redis_cpu_ms_per_rollout']:.2f} ms of "
                    f"Redis CPU, {per_rollout * 500 / 1000:.2f} of the 2 cores at 500/s. During the run the workers, "
                    f"Redis and the producer used {busy:.2f} cores and other processes "
                    f"{r['other_processes_cpu_cores']:.2f}. "
                    'See "Where a worker\'s time goes" below.'
                )
    if enq:
        r = enq["rows"][0]
        rows.append(
            [
                "enqueue (Producer.enqueue_many)",
                "at least 20,000 tasks/s",
                fmt(r["tasks_per_s"], 0),
                verdict(r["tasks_per_s"] >= 20_000),
            ]
        )
        if r["tasks_per_s"] < 20_000:
            notes.append(
                f"Enqueue reached {fmt(r['tasks_per_s'], 0)} tasks/s, not 20,000: the producer spends "
                f"{r['producer_cpu_us_per_task']:.0f} us of CPU per task (building the task, the RQ job hash "
                f"and the Lua call's arguments) and Redis {r['redis_cpu_us_per_task']:.0f} us running the Lua "
                "call, one after the other for each 2000-task chunk."
            )
    if mem:
        growth_key = next(k for k in mem if k.startswith("growth_mb_after_first_"))
        growth = mem["growth_mb_from_start"]
        label = f"{mem['rollouts']:,} rollouts" + ("" if mem["reached_target"] else " (run cut short)")
        rows.append(
            [
                f"worker RSS growth over {label}",
                "less than 20 MB",
                f"{growth} MB from start ({mem[growth_key]} MB after warm-up)",
                verdict(growth < 20),
            ]
        )
        if growth >= 20:
            notes.append(f"The worker's RSS grew {growth} MB over {mem['rollouts']:,} rollouts.")
        if not mem["reached_target"]:
            notes.append(f"The memory run reached {mem['rollouts']:,} of {mem['rollouts_target']:,} rollouts.")
    return table(["target", "asked", "measured", ""], rows), notes


def main() -> None:
    noop, mock, enq, mem, prof = (load(n) for n in ("noop", "mock_llm", "enqueue", "memory", "profile"))
    soak = load("soak")
    present = [d for d in (noop, mock, enq, mem, prof) if d]
    if not present:
        sys.exit("no results in bench/results/: run python bench/run_all.py")
    if mock:
        plot(mock)
    summary, notes = targets_section(noop, mock, enq, mem)
    parts = [
        "# Benchmarks: rollq beside Agent Lightning 0.1.2 and plain RQ",
        "<!-- Generated by bench/report.py from bench/results/*.json; edit those scripts, not this file. -->",
        machine_section(present),
        "Reproduce everything (about 20 minutes): `nice -n 10 python bench/run_all.py` (as root, or with "
        "`--skip-cluster`: `bench/cluster.py` builds network namespaces), which runs each benchmark below with "
        "short windows, writes `bench/results/<name>.json`, then regenerates this page, `docs/throughput.png` "
        "and `docs/scaling.png`; the sizing guide built on these figures is [scaling.md](scaling.md). "
        "Each benchmark also runs on its own with the command shown in its section. The machine was shared "
        "with other work while these ran; every benchmark reports what it could of that (the interleaved "
        'rounds, the "other processes" CPU column), and figures move by 10-30% between runs.',
        *sections(mock),
        "## Earlier targets (plain RQ comparison)\n\n" + summary,
    ]
    if notes:
        parts.append("Shortfalls, as measured:\n\n" + "\n".join(f"- {n}" for n in notes))
    if mock:
        starved = [r for r in mock["rows"] if r["system"] == "rollq" and r["mean_running"] < 0.9 * r["in_flight"]]
        for r in starved:
            parts.append(
                f"At {r['in_flight']} in flight only {fmt(r['mean_running'])} rollouts were running on average, "
                f"although at least {r['min_queued']} tasks were queued throughout: the 2 workers took jobs off the "
                f"queue more slowly than their {r['in_flight']} slots freed up, so the rate is "
                f"{r['percent_of_ideal']:.0f}% of the ideal whatever the target says. The profile below shows where "
                "the workers' CPU goes."
            )
    if noop:
        parts.append(noop_section(noop))
    if mock:
        parts.append(mock_section(mock))
    if enq:
        parts.append(enqueue_section(enq))
    if mem:
        parts.append(memory_section(mem))
    if prof:
        parts.append(profile_section(prof))
    if soak:
        parts.append(soak_section(soak))
    cap = load("capture")
    if cap:
        parts.append(capture_section(cap))
    DOCS.mkdir(exist_ok=True)
    PAGE.write_text("\n\n".join(p.strip() for p in parts) + "\n")
    print(f"wrote {PAGE.relative_to(ROOT)}" + (f" and {PLOT.relative_to(ROOT)}" if mock else ""))


if __name__ == "__main__":
    main()
