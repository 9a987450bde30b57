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
        add("10,000 in flight, worker memory per in-flight rollout", "<= 30 KB", f"{kb:.1f} KB", kb <= 30)
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
                f"{c['rollq_over_al']:.2f}x",
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

Interleaved in one run (rollq, then AL, per setting), {al["worker_processes"]} worker processes each,
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
    return parts
