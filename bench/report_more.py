"""The sections of docs/benchmarks.md for Agent Lightning, big rollouts, 10,000 in flight, scaling, cluster, failover.

bench/report.py calls :func:`sections`; every figure comes from a results file, and a target's verdict
is computed from the measured value, never written by hand.
"""

from __future__ import annotations

from typing import Any

from bench.report_util import fmt, load, table, verdict


def _rows(doc: dict[str, Any] | None, **match: Any) -> list[dict[str, Any]]:
    if not doc:
        return []
    return [r for r in doc["rows"] if all(r.get(k) == v for k, v in match.items())]


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def targets(al: dict[str, Any] | None, big: dict[str, Any] | None, k10: dict[str, Any] | None) -> str:
    """Issue 15's targets, each with the value measured (or 'not measured')."""
    rows: list[list[str]] = []

    def add(name: str, asked: str, value: Any, ok: Any) -> None:
        rows.append([name, asked, value or "not measured", "" if ok is None else verdict(bool(ok))])

    comparison = {(c["scenario"], c["in_flight"]): c for c in (al or {}).get("comparison", [])}
    noop = next((c for (s, _), c in comparison.items() if s == "noop"), None)
    add(
        "no-op rollouts/s vs Agent Lightning 0.1.2",
        ">= 2.0x",
        noop
        and f"{noop['rollq_over_al']:.2f}x ({fmt(noop['rollq_rollouts_per_s'])} vs {fmt(noop['al_rollouts_per_s'])}/s)",
        noop and noop["rollq_over_al"] >= 2.0,
    )
    for level, floor in ((256, 98.0), (1000, 80.0)):
        mine = _rows(al, system="rollq", scenario="mock", in_flight=level)
        pct, cpu = _mean(mine, "percent_of_ideal"), _mean(mine, "worker_cpu_ms_per_rollout")
        theirs = _mean(_rows(al, system="agentlightning", scenario="mock", in_flight=level), "percent_of_ideal")
        value = None
        if pct is not None:
            value = f"{pct:.1f}% (AL {theirs:.1f}%)" if theirs is not None else f"{pct:.1f}%"
        add(f"{level} in flight, % of the zero-overhead simulation", f">= {floor:g}%", value, pct and pct >= floor)
        if level == 1000:
            add(
                "1000 in flight, worker CPU per rollout (span capture on)",
                "<= 1.5 ms",
                cpu and f"{cpu:.2f} ms",
                cpu and cpu <= 1.5,
            )
    if k10:
        add(
            "10,000 in flight, % of the simulation",
            ">= 95%",
            f"{k10['percent_of_simulation']:.1f}%",
            k10["percent_of_simulation"] >= 95,
        )
        kb = k10["worker_kb_per_in_flight"]
        add(
            "10,000 in flight, worker memory per in-flight rollout",
            "<= 30 KB",
            kb is not None and f"{kb:.1f} KB",
            None if kb is None else kb <= 30,
        )
    else:
        add("10,000 in flight, % of the simulation", ">= 95%", None, None)
        add("10,000 in flight, worker memory per in-flight rollout", "<= 30 KB", None, None)
    if big:
        ratio = big["rollq_over_raw"]
        add(
            "0.23 MB token-id rollouts vs a raw single-process XADD/XREAD pipe",
            ">= 1.0x",
            f"{ratio:.2f}x ({fmt(big['rollq']['rollouts_per_s'])} vs {fmt(big['raw']['rollouts_per_s'])}/s)",
            ratio >= 1.0,
        )
    else:
        add("0.23 MB token-id rollouts vs a raw single-process XADD/XREAD pipe", ">= 1.0x", None, None)
    dups = sum(r.get("duplicates", 0) for d in (al, k10) for r in (d or {}).get("rows", []))
    lost = (k10 or {}).get("lost", 0)
    add(
        "nothing lost or duplicated in these runs",
        "0 and 0",
        f"{dups} duplicated, {lost} lost (10,000 in flight counts losses)",
        dups == 0 and lost == 0,
    )
    return "## Issue 15 targets\n\n" + table(["target", "asked", "measured", ""], rows)


def _per_round(al: dict[str, Any], scenario: str, in_flight: int) -> str:
    """ " (1.31x, 2.05x)": the ratio in each round, when there were several."""
    ratios = []
    for round_ in sorted({r["round"] for r in al["rows"]}):
        rates = {
            r["system"]: r["rollouts_per_s"] for r in _rows(al, scenario=scenario, in_flight=in_flight, round=round_)
        }
        if rates.get("agentlightning"):
            ratios.append(rates.get("rollq", 0.0) / rates["agentlightning"])
    return " (" + ", ".join(f"{x:.2f}x" for x in ratios) + ")" if len(ratios) > 1 else ""


def al_section(al: dict[str, Any], mock: dict[str, Any] | None) -> str:
    rq_rates = {r["in_flight"]: r for r in (mock or {}).get("rows", []) if r["system"] == "rq"}
    rows = []
    for c in al["comparison"]:
        rq = None
        if c["scenario"] == "mock" and rq_rates:
            rq = rq_rates.get(c["in_flight"]) or rq_rates[max(rq_rates)]
        pct = {
            s: _mean(_rows(al, system=s, scenario=c["scenario"], in_flight=c["in_flight"]), "percent_of_ideal")
            for s in ("rollq", "agentlightning")
        }
        cpu = {
            s: _mean(_rows(al, system=s, scenario=c["scenario"], in_flight=c["in_flight"]), "worker_cpu_ms_per_rollout")
            for s in ("rollq", "agentlightning")
        }
        coord = {
            s: _mean(
                _rows(al, system=s, scenario=c["scenario"], in_flight=c["in_flight"]), "coordinator_cpu_ms_per_rollout"
            )
            for s in ("rollq", "agentlightning")
        }

        def pct_of(s: str, pct: dict[str, float | None] = pct) -> str:
            return f" ({pct[s]:.0f}%)" if pct[s] is not None else ""

        rows.append(
            [
                c["scenario"],
                c["in_flight"],
                fmt(c["rollq_rollouts_per_s"]) + pct_of("rollq"),
                fmt(c["al_rollouts_per_s"]) + pct_of("agentlightning"),
                f"{c['rollq_over_al']:.2f}x" + _per_round(al, c["scenario"], c["in_flight"]),
                (f"{fmt(rq['rollouts_per_s'])} ({rq['percent_of_ideal']:.0f}%, {rq['worker_processes']} proc.)")
                if rq
                else "-",
                f"{cpu['rollq']:.2f} / {cpu['agentlightning']:.2f}",
                f"{coord['rollq']:.2f} / {coord['agentlightning']:.2f}",
            ]
        )
    dups = sum(r["duplicates"] for r in al["rows"])
    other = _mean(al["rows"], "other_processes_cpu_cores") or 0.0
    return f"""## rollq beside Agent Lightning {al["agentlightning"]} and plain RQ

`{al["command"]}`

Interleaved in one run (rollq, then AL, per setting; the order flips every round), {al["worker_processes"]} worker
processes each; rates are means over the rounds, the ratio of each round in brackets,
{al["window_seconds"]:g} s of steady state after a {
        al["warmup_seconds"]:g} s warm-up. Agent Lightning runs in its own venv
(`bench/.venv-al`, made by the script): its `AgentLightningServer` with the trainer's feeding and taking in the
same process, and 2 client processes of `AgentRunner` loops (in-flight / 2 each) over one `AgentLightningClient`;
AgentOps is replaced by a no-op tracer (the agent builds the same spans and triplets itself), which spares AL
its tracing cost. rollq: `rq worker -w rollq.worker.RolloutWorker` at concurrency in-flight / 2, a producer thread
and a trainer thread reading results through a consumer group. Rates count rollouts the trainer side received;
percentages are of the zero-overhead simulation (in-flight / {al["mean_rollout_seconds"]:g} s). Plain RQ is from
the mock-LLM benchmark of the same run (one SimpleWorker process per rollout in flight, capped). "Coordinator" is
redis-server for rollq, AL's server process (its trainer side included) for AL. Duplicates seen: {dups}.
Other processes on the shared machine used {other:.2f} cores on average during these settings.

{
        table(
            [
                "scenario",
                "in flight",
                "rollq/s",
                "AL 0.1.2/s",
                "rollq / AL",
                "plain RQ/s",
                "worker CPU ms/rollout rollq / AL",
                "coordinator CPU ms/rollout rollq / AL",
            ],
            rows,
        )
    }
"""


def sections(mock: dict[str, Any] | None) -> list[str]:
    al, big, k10 = load("al"), load("big"), load("inflight10k")
    parts = [targets(al, big, k10)]
    if al:
        parts.append(al_section(al, mock))
    return parts + more_sections()


def big_section(big: dict[str, Any]) -> str:
    rows = [
        [
            f"{r['mb_per_rollout']:.2f} MB ({r['turns']} turns)",
            f"{fmt(r['raw']['rollouts_per_s'])} ({r['raw']['mb_per_s']} MB/s)",
            f"{fmt(r['rollq']['rollouts_per_s'])} ({r['rollq']['mb_per_s']} MB/s)",
            f"{r['rollq_over_raw']:.2f}x",
            f"{r['raw']['process_cpu_ms_per_rollout']:.2f}",
            f"{r['rollq']['worker_cpu_ms_per_rollout']:.2f} + {r['rollq']['coordinator_cpu_ms_per_rollout']:.2f}",
        ]
        for r in big["rows"]
    ]
    steps = [
        [f"{r['mb_per_rollout']:.2f} MB", *(f"{v:.2f}" for v in r["replay"]["steps_ms_per_rollout"].values())]
        + [f"{r['replay']['total_ms_per_rollout']:.2f}"]
        for r in big["rows"]
    ]
    step_names = list(big["rows"][0]["replay"]["steps_ms_per_rollout"])
    top = [
        [t["function"].replace("|", "/"), t["calls_per_rollout"], f"{t['own_ms_per_rollout']:.3f}"]
        for t in big["rows"][0]["replay"]["top_own_time"][:10]
    ]
    return f"""## Big token-id rollouts beside a raw redis-py pipe

`{big["command"]}`

A rollout carries 8 (or 35) triplets of 4096 prompt + 512 response token ids. The anchor is one process
moving the same JSON through a stream with redis-py and the standard `json` module (`json.dumps`, `XADD
MAXLEN ~ {big["results_maxlen"]}`, `XREAD`, `json.loads`); rollq runs {big["worker_processes"]} worker
processes at {big["in_flight"] // big["worker_processes"]} in flight each, and a trainer thread reading every
rollout through a consumer group; the two alternate in one run, {big["window_seconds"]:g} s each.

{
        table(
            [
                "rollout",
                "raw pipe/s",
                "rollq/s",
                "rollq / raw",
                "raw pipe CPU ms/rollout",
                "rollq CPU ms/rollout (workers + Redis)",
            ],
            rows,
        )
    }

Where the time goes: the functions a rollout passes through, one after the other in one thread under
cProfile on a private redis-server (ms per rollout, wall clock; cProfile's own overhead included):

{table(["rollout", *step_names, "total"], steps)}

Most own time, 0.23 MB rollouts (cProfile):

{table(["function", "calls/rollout", "own ms/rollout"], top)}

Reading: pydantic's Rust serializer and validator (`model_dump_json`, `model_validate_json`) cost less
than `json.dumps`/`json.loads` of the same ids as Python lists, and the rest is bytes through sockets
(`sendall`, `recv_into`) and Redis copying the argument into the stream. Nothing serialises twice and
nothing re-validates: the agent's triplets are taken as they are (`to_rollout`, `stamp` are copies of
references). rollq beats the single-process pipe because its work is spread over 2 worker processes and
the trainer; per rollout it is not cheaper in Redis than the pipe.
"""


def k10_section(k10: dict[str, Any]) -> str:
    fill = k10["seconds_to_fill_slots"]
    rows = [
        [
            "tasks / in flight / worker processes",
            f"{k10['tasks']:,} / {k10['in_flight']:,} / {k10['worker_processes']}",
        ],
        ["wall time, zero-overhead simulation", f"{k10['seconds']} s, {k10['simulated_seconds']} s"],
        ["% of the simulation", f"{k10['percent_of_simulation']}%"],
        ["rollouts/s (simulation)", f"{k10['rollouts_per_s']} ({k10['simulated_rollouts_per_s']})"],
        [
            "worker CPU per rollout",
            f"{k10['worker_cpu_ms_per_rollout']} ms (Redis {k10['redis_cpu_ms_per_rollout']} ms)",
        ],
        ["worker RSS idle / at the most in flight", f"{k10['worker_rss_idle_mb']} MB / {k10['worker_rss_full_mb']} MB"],
        [
            "worker memory per in-flight rollout",
            f"{k10['worker_kb_per_in_flight']} KB" if k10["worker_kb_per_in_flight"] is not None else "not measured",
        ],
        ["enqueue of every task (one call)", f"{k10['enqueue_seconds']} s"],
        [
            "Redis memory left per finished rollout (record, stream entry, RQ job)",
            f"{fmt(k10['redis_bytes_per_finished_rollout'] / 1024)} KB"
            if "redis_bytes_per_finished_rollout" in k10
            else "not measured",
        ],
        ["time to fill 95% of the slots from the enqueue", f"{fill} s" if fill is not None else "never reached 95%"],
        ["mean running while >= 95% full", fmt(k10["mean_running_while_full"])],
        ["least slack of the stalest heartbeat deadline", f"{k10['min_deadline_slack_seconds']} s"],
        ["attempts requeued or superseded", str(k10["requeued_or_superseded"] or "none")],
        ["tasks claimed more than once", k10["tasks_claimed_more_than_once"]],
        ["lost / duplicated", f"{k10['lost']} / {k10['duplicates']}"],
    ]
    return f"""## 10,000 rollouts in flight

`{k10["command"]}`

Slow agents: 3 LLM calls of 3-10 s each (drawn from the task's seed), traced as spans. The workers start
idle; every task is enqueued in one call; the run ends when the trainer has received every rollout. The
simulation runs the same task list FIFO on {k10["in_flight"]:,} slots at zero cost. Heartbeats every
{k10["heartbeat_seconds"]:g} s; `unresponsive_seconds` 30 (the default): a "slack" near 0 would mean an
attempt about to be reaped for want of a heartbeat.

{table(["measure", "value"], rows)}

At ~{k10["simulated_rollouts_per_s"]:.0f} rollouts/s the ideal needs about
{k10["simulated_rollouts_per_s"] * (k10["worker_cpu_ms_per_rollout"] + k10["redis_cpu_ms_per_rollout"]) / 1000:.1f}
cores at the measured CPU per rollout: on 2 cores shared with other work the run is CPU-bound, which is
what the % of the simulation shows.
"""


def scaling_section(sc: dict[str, Any]) -> str:
    rows = [
        [
            r["worker_processes"],
            r["in_flight"],
            fmt(r["rollouts_per_s"]),
            f"{r['percent_of_ideal']:.0f}%",
            f"{r['worker_cpu_ms_per_rollout']:.2f}",
            f"{r['coordinator_cpu_ms_per_rollout']:.2f}",
            fmt(r["worker_rss_mb"]),
            f"{r['other_processes_cpu_cores']:.2f}",
        ]
        for r in sc["rows"]
        if not (r["sweep"] == "in_flight" and r["in_flight"] == 1000)
    ]
    return f"""## How cost grows with worker processes and in-flight rollouts

`{sc["command"]}`

Mock-LLM rollouts (3 turns x 0.1-0.5 s, spans on); {sc["window_seconds"]:g} s of steady state each. First
sweep: 1000 in flight split over 1-8 processes; second: 2 processes, 32 to 10,000 in flight.

{
        table(
            [
                "worker processes",
                "in flight",
                "rollouts/s",
                "of ideal",
                "worker CPU ms/rollout",
                "Redis CPU ms/rollout",
                "worker RSS MB",
                "other processes, cores",
            ],
            rows,
        )
    }

![rollouts/s and CPU per rollout against processes and in flight](scaling.png)

Per-rollout CPU falls as batches grow (more jobs per dequeue, per heartbeat round) and rises a little with
more processes (each runs its own loop, heartbeat and reaper); on 2 cores the total is capped by the cores,
not by Redis (Redis used well under half a core throughout).
"""


def cluster_section(cl: dict[str, Any]) -> str:
    rows = []
    settings = list(dict.fromkeys(r["rtt_setting"] for r in cl["rows"]))
    for setting in settings:
        mine = [r for r in cl["rows"] if r["rtt_setting"] == setting]

        def mean(key: str, mine: list[dict[str, Any]] = mine) -> float | None:
            values = [r[key] for r in mine if r.get(key) is not None]
            return sum(values) / len(values) if values else None

        pct = [r["percent_of_ideal"] for r in mine]
        first = sorted(r["seconds_to_first_claim"]["median"] for r in mine if r["seconds_to_first_claim"]["median"])
        writes, proxy = mean("client_writes_per_rollout"), mean("proxy_cpu_ms_per_rollout")
        rows.append(
            [
                setting + ("" if setting == "direct" else " ms"),
                f"{mean('ping_rtt_ms_measured'):.2f}",
                fmt(mean("rollouts_per_s") or 0),
                f"{sum(pct) / len(pct):.0f}%" + (f" ({min(pct):.0f}-{max(pct):.0f})" if len(pct) > 1 else ""),
                f"{mean('redis_connections'):.0f}",
                fmt(mean("redis_commands_per_s") or 0, 0),
                f"{mean('redis_commands_per_rollout'):.1f}",
                "-" if writes is None else f"{writes:.1f}",
                f"{mean('redis_cpu_ms_per_rollout'):.2f}",
                f"{mean('worker_cpu_ms_per_rollout'):.2f}",
                "-" if proxy is None else f"{proxy:.2f}",
                f"{first[len(first) // 2]}" if first else "-",
            ]
        )
    rounds = max((r.get("round", 1) for r in cl["rows"]), default=1)
    dead = cl.get("dead_host")
    dead_text = "The dead-host case was not run."
    if dead:
        alive = all(all(v) for v in dead["workers_alive_at_end"].values())
        dead_text = f"""Dead host (`--outage`): host 0's link went down for {dead["down_for_seconds"]} s (tasks'
`unresponsive_seconds` 6, heartbeats 1 s) at the {dead["rtt_setting"]} ms setting, then came back.
{dead["tasks"]} tasks: {dead["received"]} received, **{dead["lost"]} lost, {dead["duplicates"]} duplicated**;
{dead["tasks_claimed_more_than_once"]} tasks ran more than once; requeued/superseded counters on Redis:
`{dead["requeued_or_superseded"]}`; host 0's workers claimed {dead["tasks_last_claimed_by_host0_after_restore"]}
tasks after the link came back and {"all" if alive else "**not all**"} of them were still running at the end."""
    return f"""## A simulated cluster: hosts in network namespaces, latency to Redis, a dead host

`sudo {cl["command"]}`

{cl["hosts"]} hosts (network namespaces) x {cl["workers_per_host"]} worker processes x {cl["concurrency"]} in
flight, one redis-server in its own namespace, the producer and trainer in a third; each host reaches Redis
over its own veth pair through `bench/delay_proxy.py`, which delays each direction by half the round trip
(this kernel has no netem). "direct" skips the proxy; "0 ms" goes through it undelayed (its own cost).
{cl["note"]}. "Writes/rollout" counts client-to-Redis writes the proxies saw per rollout: each is a round
trip (a command, a pipeline or a Lua call) that pays the latency. First claim: seconds from a worker's
start to its first claim (median). Each setting ran {rounds} time(s), the order alternating round by round;
the table shows means ("of ideal" with its range).

{
        table(
            [
                "RTT asked",
                "PING RTT measured, ms",
                "rollouts/s",
                "of ideal",
                "Redis connections",
                "Redis commands/s",
                "commands/rollout",
                "writes/rollout",
                "Redis CPU ms/rollout",
                "worker CPU ms/rollout",
                "proxy CPU ms/rollout",
                "first claim, s",
            ],
            rows,
        )
    }

{dead_text}
"""


def failover_section(fo: dict[str, Any]) -> str:
    s = fo["settings"]
    runs = [fo["runs"]["wait_replicas_0"], fo["runs"]["wait_replicas_1"]]

    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value} s"

    measures: list[tuple[str, Any]] = [
        ("Sentinels named the replica primary after", lambda r: seconds(r["sentinel_named_new_primary_after_seconds"])),
        ("workers published rollouts again after", lambda r: seconds(r["workers_published_again_after_seconds"])),
        ("trainer received rollouts again after", lambda r: seconds(r["trainer_received_again_after_seconds"])),
        (
            "old primary restarted, replicating again after",
            lambda r: seconds(r["old_primary_replicating_again_after_seconds"]),
        ),
        (
            "enqueue of a batch of 10, median before the kill",
            lambda r: f"{r['enqueue_batch_of_10_ms_median_before_kill']} ms",
        ),
        ("tasks enqueued (acknowledged by Redis)", lambda r: r["tasks_enqueued_acknowledged"]),
        ("enqueue calls that failed during the failover", lambda r: r["enqueue_errors_during_failover"]),
        ("tasks lost (acknowledged, absent on the new primary)", lambda r: r["tasks_lost"]),
        ("rollouts never received", lambda r: r["rollouts_never_received"]),
        ("rollouts received twice", lambda r: r["rollouts_received_twice"]),
        ("tasks run more than once", lambda r: r["tasks_run_more_than_once"]),
        (
            "requeues on the new primary",
            lambda r: {k: v for k, v in r["stats_on_new_primary"].items() if k.startswith("requeued")} or "none",
        ),
        (
            "transitions short of wait_replicas (producer + workers)",
            lambda r: r["producer_replication_shortfalls"] + r["worker_replication_shortfalls"],
        ),
        ("worker processes still running at the end", lambda r: f"{r['workers_alive']} of {s['workers']}"),
    ]
    rows = [[name, *(get(r) for r in runs)] for name, get in measures]
    cost_rows = []
    for c in fo["transition_cost"]:
        off, on = c["wait_replicas_0"], c["wait_replicas_1"]
        cost_rows.append(
            [
                f"{c['replica_rtt_ms']:g} ms",
                f"{off['enqueue_ms_median']} -> {on['enqueue_ms_median']} ms",
                f"{off['enqueue_ms_p99']} -> {on['enqueue_ms_p99']} ms",
                f"{off['worker_rollouts_per_s']} -> {on['worker_rollouts_per_s']}",
            ]
        )
    return f"""## Redis failover under load (Sentinel), with and without `wait_replicas`

`{fo["command"]}` (load average at the end {s.get("load_average_at_end")})

A primary, one replica {s["replica_rtt_ms"]:g} ms (round trip) away through a delaying proxy, and 3 Sentinels
(quorum {s["quorum"]}, down-after {s["sentinel_down_after_ms"]} ms), all local; producer, trainer and {s["workers"]}
`rollq worker` processes (concurrency {s["concurrency"]}) connect with `redis+sentinel://...`; {s["rate_per_s"]:g}
tasks/s enqueued up to {s["tasks"]}; the primary and its end of the replication link are SIGKILLed
{s["kill_after_seconds"]:g} s in, and the old primary restarts {s["rejoin_after_seconds"]:g} s later (the Sentinels
make it a replica). Two runs, the same but for `wait_replicas` on every producer and worker
(`WAIT` timeout {s["wait_timeout_ms"]} ms).

{table(["measure", "wait_replicas=0", "wait_replicas=1"], rows)}

Each transition's cost, `wait_replicas` 0 -> 1: one enqueue (median and p99 of
{fo["transition_cost"][0]["enqueue_rounds"]} interleaved rounds), and the no-op rollouts/s of one worker
process at concurrency 16 ({fo["transition_cost"][0]["rollouts"]} rollouts), where rollq's transitions are all the work.

{table(["replica round trip", "enqueue median", "enqueue p99", "worker rollouts/s"], cost_rows)}
"""


def before_after_section(ba: dict[str, Any]) -> str:
    """Issue 15's "cheaper per rollout": worker CPU and Redis round trips per rollout, an earlier commit beside
    this tree, measured in one run."""
    before, after = ba["before"], ba["after"]
    rows = [
        [
            "worker CPU per rollout, 1000 in flight (mock LLM, spans on)",
            f"{before['worker_cpu_ms_per_rollout']:.2f} ms",
            f"{after['worker_cpu_ms_per_rollout']:.2f} ms",
            f"{after['worker_cpu_ms_per_rollout'] / before['worker_cpu_ms_per_rollout']:.2f}x",
        ],
        [
            "rollouts/s while profiled, 1000 in flight",
            fmt(before["rollouts_per_s_1000_in_flight"]),
            fmt(after["rollouts_per_s_1000_in_flight"]),
            f"{after['rollouts_per_s_1000_in_flight'] / before['rollouts_per_s_1000_in_flight']:.2f}x",
        ],
    ]
    for label, b in before["round_trips"].items():
        a = after["round_trips"].get(label)
        if a is None:
            continue
        rows.append(
            [
                f"Redis round trips per no-op rollout ({label.split(', ')[-1]})",
                f"{b['round_trips_per_job']:.2f}",
                f"{a['round_trips_per_job']:.2f}",
                f"{a['round_trips_per_job'] / b['round_trips_per_job']:.2f}x",
            ]
        )
    buckets = sorted(after["buckets_ms_per_rollout"].items(), key=lambda kv: -kv[1])
    where = table(["where (py-spy, GIL held, after)", "ms per rollout"], [[k, f"{v:.3f}"] for k, v in buckets])
    rounds = ", ".join(
        f"{x:.2f} -> {y:.2f}"
        for x, y in zip(
            before["worker_cpu_ms_per_rollout_rounds"], after["worker_cpu_ms_per_rollout_rounds"], strict=False
        )
    )
    return f"""## Cheaper per rollout: before and after

`{ba["command"]}` ({ba["date"][:10]}): commit `{ba["base"]}` (rollq 0.2.0 as it landed) beside `{ba["head"]}`,
taking turns in one run, {ba["rounds"]} rounds (worker CPU per round, before -> after: {rounds}). What changed:
a worker starts and ends its jobs in batches (the claims and RQ's start bookkeeping of every job taken since
the last batch in one pipeline, the publications in one, RQ's end bookkeeping in one, no WATCH or dependents
read per job); a rollout's tracer and executor leave no reference cycles, and workers raise the garbage
collector's young-generation threshold (full collections were 13-14% of worker CPU); agent spans and the
span-to-dict conversion do less per span.

{table(["per rollout", "before", "after", "after / before"], rows)}

{where}
"""


def more_sections() -> list[str]:
    parts = []
    ba = load("before_after")
    if ba:
        parts.append(before_after_section(ba))
    big, k10, sc, cl, fo = (load(n) for n in ("big", "inflight10k", "scaling", "cluster", "failover"))
    if big:
        parts.append(big_section(big))
    if k10:
        parts.append(k10_section(k10))
    if sc:
        parts.append(scaling_section(sc))
    if cl:
        parts.append(cluster_section(cl))
    if fo:
        parts.append(failover_section(fo))
    return parts
