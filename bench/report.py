"""Regenerate docs/benchmarks.md from bench/results/*.json: one section per results file, all from one template.

Run: python bench/report.py   (bench/run_all.py runs it after the benchmarks)

Every section has the shape of :data:`SECTION`: the title, the command that reproduces it, where and when it
was measured (date, commit, load average before and after, settings), what was measured, then its tables.
What differs between benchmark kinds is data, a :class:`Spec`: the prose (a ``str.format`` template over the
results document) and the tables (which rows, which columns). A results file with no spec still gets its
section, its figures listed as they are. Every figure comes from a results file and every verdict is computed
from the measured value; only the words around them are written here. The plots are drawn by the benchmarks
that measure them (bench/mock_llm.py, bench/scaling.py).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"

Doc = dict[str, Any]
Getter = str | Callable[[Any, Doc], Any]
Format = str | Callable[[Any], str]

# The one template every section is rendered with.
SECTION = """## {title}

`{command}`

{provenance}

{about}

{tables}

{after}"""

# The provenance every results file carries (bench/common.py: write_result); the rest are its figures.
PROVENANCE_KEYS = {
    "benchmark",
    "date",
    "started",
    "commit",
    "dirty",
    "committed_in",
    "provenance_note",
    "command",
    "settings",
    "machine",
    "load_average",
    "niceness",
}


@dataclass(frozen=True)
class Col:
    """A column: its header, where its value comes from (a key of the row, dotted for a nested one, or a
    function of the row and the document) and how it is written (a format spec, or a function)."""

    header: str
    get: Getter
    fmt: Format = ""
    optional: bool = False
    """Left out of a table where no row has a value (a figure older runs did not record)."""


@dataclass(frozen=True)
class Table:
    """Rows (a key of the document, or a function of it) shown in columns; ``caption`` comes before it.

    A column is a :class:`Col` or the tuple ``(key, header[, format])``.
    """

    rows: str | Callable[[Doc], list[Any]]
    cols: list[Col | tuple[str, ...]]
    caption: str = ""


@dataclass(frozen=True)
class Spec:
    """How one kind of benchmark is written up. ``derive`` adds computed values the templates can name."""

    title: str
    about: str
    tables: list[Table] = field(default_factory=list)
    after: str = ""
    derive: Callable[[Doc], dict[str, Any]] = lambda doc: {}


# ---------------------------------------------------------------------------------------------------- values


def pick(row: Any, key: str) -> Any:
    """``row[key]``, or for a dotted key not in the row ``row[a][b]``."""
    if isinstance(row, dict) and key in row:
        return row[key]
    for part in key.split("."):
        row = row.get(part) if isinstance(row, dict) else None
    return row


def cell(value: Any, fmt: Format = "") -> str:
    if value is None:
        return "-"
    if callable(fmt):
        return fmt(value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return format(value, fmt)


def x(value: float) -> str:
    """A ratio: ``2.00x``."""
    return f"{value:.2f}x"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def mean(values: list[Any]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def ratios(values: list[float | None]) -> str:
    """Per-round ratios: ``1.89x, 2.00x``."""
    return ", ".join(x(v) for v in values if v is not None) or "-"


def nth(i: int) -> Callable[[Any, Doc], Any]:
    """A column of rows that are lists: their ``i``-th item."""
    return lambda row, doc: row[i]


def fixed(rows: list[Any]) -> Callable[[Doc], list[Any]]:
    """Rows given as they are."""
    return lambda doc: rows


def column(spec: Col | tuple[str, ...]) -> Col:
    return spec if isinstance(spec, Col) else Col(spec[1], spec[0], spec[2] if len(spec) > 2 else "")


def render_table(table: Table, doc: Doc) -> str:
    rows = pick(doc, table.rows) if isinstance(table.rows, str) else table.rows(doc)
    if not rows:
        return ""
    cols = [column(c) for c in table.cols]
    table_values = [[c.get(row, doc) if callable(c.get) else pick(row, c.get) for c in cols] for row in rows]
    shown = [i for i, c in enumerate(cols) if not c.optional or any(v[i] is not None for v in table_values)]
    cols = [cols[i] for i in shown]
    lines = ["| " + " | ".join(c.header for c in cols) + " |", "|" + "---|" * len(cols)]
    for every in table_values:
        values = [every[i] for i in shown]
        lines.append("| " + " | ".join(cell(v, c.fmt).replace("|", "/") for v, c in zip(values, cols, strict=True)))
        lines[-1] += " |"
    caption = table.caption.format_map(doc) + "\n\n" if table.caption else ""
    return caption + "\n".join(lines)


def measures(*keys: str) -> Table:
    """A two-column table of some of the document's figures, named by their keys."""
    return Table(lambda d: [[k.replace("_", " "), pick(d, k)] for k in keys if pick(d, k) is not None], MEASURE)


MEASURE: list[Col | tuple[str, ...]] = [Col("measure", nth(0)), Col("value", nth(1))]


def provenance(doc: Doc) -> str:
    """Where and when: the line every section carries."""
    load = doc.get("load_average") or {}
    before, after = load.get("before"), load.get("after")
    when = f"Measured {doc['date'][:16].replace('T', ' ')} UTC"
    if doc.get("commit"):
        when += f" at commit `{doc['commit'][:10]}`" + (" (tree modified)" if doc.get("dirty") else "")
    else:
        when += f"; commit not recorded (the results file came in with `{doc.get('committed_in', '?')}`)"
    if before:
        when += f"; load average (1/5/15 min) {cell(before)} before, {cell(after)} after"
    elif after:
        when += f"; load average (1/5/15 min) {cell(after)} at the end (not recorded before)"
    else:
        when += "; load not recorded"
    speed = (doc.get("machine") or {}).get("python_loop_ms")
    at_start = (doc.get("machine") or {}).get("python_loop_ms_at_start")
    if speed and at_start:
        when += (
            f"; the machine's Python speed: {at_start:g} ms for a million-step loop at the start, {speed:g} at the end"
        )
    elif speed:
        when += f"; the machine's Python speed: {speed:g} ms for a million-step loop"
    settings = {k: v for k, v in (doc.get("settings") or {}).items() if v not in (None, False, "")}
    if settings:
        when += "; settings: " + ", ".join(f"{k} {cell(v)}" for k, v in settings.items())
    return when + "."


def generic_tables(doc: Doc) -> list[Table]:
    """A results file without a spec: its scalar figures, then each set of rows, as they are."""
    flat: list[list[Any]] = []
    tables = [Table(fixed(flat), MEASURE)]
    for key, value in doc.items():
        if key in PROVENANCE_KEYS or key == "note":
            continue
        if isinstance(value, list) and value and isinstance(value[0], dict):
            # Rows nested in rows (a setting's rounds) stay in the results file.
            keys = [k for k, v in value[0].items() if not (isinstance(v, list) and v and isinstance(v[0], dict))]
            tables.append(Table(key, [(k, k) for k in keys], caption=f"`{key}`:"))
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            by_name: list[Any] = [{key: name, **v} for name, v in value.items()]
            tables.append(Table(fixed(by_name), [(k, k) for k in by_name[0]], caption=f"`{key}`:"))
        else:
            flat.append([key.replace("_", " "), value])
    return tables


def render(doc: Doc, spec: Spec | None) -> str:
    values = {**doc, **(spec.derive(doc) if spec else {})}
    tables = spec.tables if spec else generic_tables(doc)
    text = SECTION.format(
        title=spec.title.format_map(values) if spec else doc["benchmark"].replace("_", " ").capitalize(),
        command=doc.get("command", "?"),
        provenance=provenance(doc),
        about=spec.about.format_map(values) if spec else doc.get("note", ""),
        tables="\n\n".join(t for t in (render_table(table, values) for table in tables) if t),
        after=spec.after.format_map(values) if spec else "",
    )
    return re.sub(r"\n{3,}", "\n\n", text).strip()


# ----------------------------------------------------------------------------------------- the benchmark kinds
# Specs are tables of data: laid out by hand, a column to a line where it reads better.
# fmt: off


def _al_rows(doc: Doc, **match: Any) -> list[Doc]:
    return [r for r in doc["rows"] if all(r.get(k) == v for k, v in match.items())]


def _al_comparison(doc: Doc) -> list[Doc]:
    """AL's comparison rows with each round's ratio and the means of the per-system figures."""
    rows = []
    for c in doc["comparison"]:
        key = {"scenario": c["scenario"], "in_flight": c["in_flight"]}
        per_round = [
            ratio(*(mean([r["rollouts_per_s"] for r in _al_rows(doc, system=s, round=n, **key)])
                    for s in ("rollq", "agentlightning")))
            for n in sorted({r["round"] for r in doc["rows"]})
        ]
        figures = ("percent_of_ideal", "worker_cpu_ms_per_rollout", "coordinator_cpu_ms_per_rollout")
        means = {f"{s}_{f}": mean([r.get(f) for r in _al_rows(doc, system=s, **key)])
                 for s in ("rollq", "agentlightning") for f in figures}
        mine = [r for r in doc["rows"] if r["scenario"] == c["scenario"] and r["in_flight"] == c["in_flight"]]
        trainer = mean([1000 * r["trainer_side_cpu_cores"] / r["rollouts_per_s"]
                        for r in mine if r["system"] == "rollq" and r.get("rollouts_per_s")])
        loads = []  # the 1-minute load before each round's pair of runs and after it
        for n in sorted({r["round"] for r in mine}):
            pair = [r for r in mine if r["round"] == n and "load_1m" in r]
            if pair:
                loads.append(f"{pair[0]['load_1m']['before']:g} -> {pair[-1]['load_1m']['after']:g}")
        rows.append({**c, **means, "per_round": per_round, "trainer_ms": trainer, "loads": ", ".join(loads) or None})
    return rows


def _rate_pct(rate: str, pct: str) -> Callable[[Any, Doc], str]:
    return lambda r, d: f"{r[rate]:,.1f}" + (f" ({r[pct]:.0f}%)" if r.get(pct) is not None else "")


def _pair(key: str) -> Callable[[Any, Doc], str]:
    return lambda r, d: f"{cell(r.get('rollq_' + key), '.2f')} / {cell(r.get('agentlightning_' + key), '.2f')}"


AL1 = """**Agent Lightning 1.0.2** has no row above: it has no `LitAgent`, trainer-side store or tracer to run
the same agents with. Its shipped runner, `agl-controller`, runs every rollout as a Python subprocess (about
0.55-0.9 s of CPU to start one) or a Kubernetes Job, lists at most 50 queued rollouts per poll (so never runs more
than 50 at once) and never retries one; its `agl-server` keeps rollouts in process memory (gone after a restart).
What it can do, measured with AL's own trainer client and a no-op agent (posts its reward, no LLM call), 40
rollouts, two runs on these 2 shared cores: AL 1.0.2's own `agl-server` + `agl-controller` **2.1-2.4
rollouts/s** (source: [agent-lightning.md](agent-lightning.md), "Measured", commit `282780f`; not re-measured
here)."""


def _own_path(doc: Doc) -> bool:
    """Whether AL's tasks were queued with ``resources_id``, as AL's own RL path queues them."""
    return bool((doc.get("settings") or {}).get("al_resources_id"))


def _al_tasks(doc: Doc) -> str:
    if _own_path(doc):
        return "AL's tasks were queued with `resources_id`, as AL's own RL path queues them."
    return (
        "AL's tasks were queued **without** `resources_id`, so each AL rollout also asked for the latest "
        "resources: one HTTP request more than on AL's own RL path, which queues with `resources_id`. This "
        "flatters rollq's ratio."
    )


def _al_queue(doc: Doc) -> str:
    """How deep AL's tasks were queued in a run, and the versions of AL's HTTP stack where the run recorded them."""
    stack = doc.get("agentlightning_packages")
    if not stack:
        return (
            "AL's server kept in-flight tasks queued, no deeper: an AL client that finds its queue empty sleeps 5 s, "
            "which holds AL's rate down whenever the feeder falls behind (the runs from 2026-12-05 queue 4x deeper)."
        )
    versions = ", ".join(f"{name} {version}" for name, version in stack.items() if name != "agentlightning")
    return (
        "AL's server kept 4x the in-flight count of tasks queued, at least 256 (an AL client that finds its queue "
        f"empty sleeps 5 s before it asks again). AL's HTTP stack in its venv: {versions} (the venv's packages are "
        "pinned by `bench/al_constraints.txt` since 2026-12-05)."
    )


AL = Spec(
    title="rollq beside Agent Lightning {agentlightning}{al_path}{packs}",
    about="""Interleaved in one run (rollq, then AL, per setting; the order flips every round), {worker_processes}
worker processes each, {window_seconds:g} s of steady state after a {warmup_seconds:g} s warm-up; rates are means
over the rounds, and the rollq / AL ratio of every round is shown beside their mean. Agent Lightning runs in its own
venv (`bench/.venv-al`): its `AgentLightningServer` with the trainer's feeding and taking in the same process, and 2
client processes of `AgentRunner` loops over one `AgentLightningClient`; AgentOps is replaced by a no-op tracer (the
agent builds the same spans and triplets itself), which spares AL its tracing cost. {al_tasks} rollq: `rq worker -w
rollq.worker.RolloutWorker` at concurrency in flight / 2, a producer thread and a trainer thread reading results
through a consumer group. Rates count rollouts the trainer side received; the percentages are of the ideal rate
(in flight / {mean_rollout_seconds:g} s, the mean rollout time): a plain rate, nothing is simulated.
"Coordinator" is redis-server for rollq, AL's server process (its trainer side included) for AL; rollq's
trainer side (the producer and trainer threads, this process) is a column of its own. Duplicates
seen: {duplicates}. Other processes on the shared machine used {other:.2f} cores on average meanwhile. {al_queue}""",
    derive=lambda d: {
        "al_queue": _al_queue(d),
        "duplicates": sum(r["duplicates"] for r in d["rows"]),
        "al_tasks": _al_tasks(d),
        "packs": f", rollq with packs of {_packs_of(d)} tasks per RQ job" if _packs_of(d) > 1 else "",
        "other": mean([r.get("other_processes_cpu_cores") for r in d["rows"]]) or 0.0,
        # Said once, beside the run on AL's own path.
        "al1": AL1 if _own_path(d) else "",
        "al_path": " on its own RL path (tasks with `resources_id`)"
        if _own_path(d)
        else " (tasks without `resources_id`)",
    },
    tables=[
        Table(_al_comparison, [
            ("scenario", "scenario"), ("in_flight", "in flight"),
            Col("rollq/s (% of ideal)", _rate_pct("rollq_rollouts_per_s", "rollq_percent_of_ideal")),
            Col("AL/s (% of ideal)", _rate_pct("al_rollouts_per_s", "agentlightning_percent_of_ideal")),
            Col("rollq / AL", "rollq_over_al", x), Col("per round", "per_round", ratios),
            Col("worker CPU ms/rollout rollq / AL", _pair("worker_cpu_ms_per_rollout")),
            Col("coordinator CPU ms/rollout rollq / AL", _pair("coordinator_cpu_ms_per_rollout")),
            Col("rollq trainer-side CPU ms/rollout", "trainer_ms", ".2f"),
            Col("load (1 min) per round", "loads"),
        ])
    ],
    after="{al1}",
)


def _percents(values: list[float] | None) -> str:
    return "-" if not values else ", ".join(f"{v:.1f}%" for v in values)


def _noop_rows(doc: Doc) -> list[Doc]:
    simple = next(r for r in doc["end_to_end"] if r["label"] == "RQ SimpleWorker")
    def per_round(r: Doc) -> list[float | None]:
        return [ratio(a["jobs_per_s"], b["jobs_per_s"]) for a, b in zip(r["rounds"], simple["rounds"], strict=False)]

    return [{**r, "per_round": per_round(r)} for r in doc["end_to_end"]]


NOOP = Spec(
    title="No-op rollouts end to end, beside RQ's own workers",
    about="""Each configuration has {workers} worker processes on the same redis-server; all are up at once and take
turns, round by round, so that drift and other load hit them alike (the median round is shown, and each round's
rate over SimpleWorker's in that round). A round: enqueue a batch in one pipelined call, run it, receive every
result in the producer (rollq: `Producer.wait`; RQ: poll the finished registry, then read the return values in one
pipeline). CPU is the worker processes' user + system time (for RQ's fork-per-job `Worker`, its work horses' too).
Commands are counted by Redis (`INFO commandstats`, Lua's included) over the whole round, producer side too.""",
    tables=[
        Table(_noop_rows, [
            ("label", "configuration"), ("jobs_per_s", "jobs/s", ",.1f"),
            Col("rate / SimpleWorker, per round", "per_round", ratios),
            ("worker_cpu_ms_per_job", "worker CPU ms/job", ".2f"),
            Col("CPU / SimpleWorker", "cpu_per_job_vs_simpleworker", x),
            ("commands_per_job", "Redis commands/job", ".1f"), ("worker_rss_mb", "worker RSS MB", ".1f"),
            Col("% of the minimal queue, per round", "percent_of_minimal_queue_per_round", _percents),
        ]),
        Table("round_trips", [
            ("label", "worker"), ("round_trips_per_job", "round trips/job", ".1f"),
            Col("vs SimpleWorker", "round_trips_vs_simpleworker", x), ("commands_per_job", "commands/job", ".1f"),
            ("round_trips_per_job_by_command", "round trips by command"),
        ], caption="Redis round trips per job, worker side, counted in the client (a pipeline or a Lua call is "
                   "one): one worker in-process in burst mode, the run of {round_trip_jobs[1]} jobs less the run "
                   "of {round_trip_jobs[0]}, so start-up and shutdown cancel out."),
    ],
)


MOCK = Spec(
    title="Mock LLM agents: rollq beside plain RQ at 32 to 1000 in flight",
    about="""A rollout is 3 turns of an LLM-call span sleeping 0.1-0.5 s and a reward span, {mean_rollout_seconds:g} s
on average; the ideal rate is in flight / {mean_rollout_seconds:g} s. rollq runs 2 worker processes at concurrency
in flight / 2 (`bench/agents.py: MockLLMAgent`). Plain RQ runs one job per process, so one SimpleWorker process per
rollout in flight (`rq worker-pool`, the sync twin `bench/rq_jobs.py: mock_llm`), at most {rq_max_processes}
processes: at 1000 in flight RQ's figure is its {rq_max_processes}-process one. After a warm-up, completions are
counted over {window_seconds:g} s; "running (mean)" is sampled four times a second; "other processes" is CPU that
neither the workers, Redis nor the producer used. One round per setting.""",
    tables=[
        Table(lambda d: sorted(d["rows"], key=lambda r: (r["system"] != "rollq", r["in_flight"])), [
            ("system", "system"), ("in_flight", "in flight"), ("worker_processes", "worker processes"),
            ("rollouts_per_s", "rollouts/s", ",.1f"), ("percent_of_ideal", "% of the ideal rate", ".1f"),
            ("mean_running", "running (mean)", ",.1f"), ("worker_rss_mb", "worker RSS MB (sum)", ",.1f"),
            ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
            ("redis_cpu_ms_per_rollout", "Redis CPU ms/rollout", ".2f"),
            ("other_processes_cpu_cores", "other processes, cores", ".2f"),
        ]),
        Table("comparison", [
            ("in_flight", "in flight"), ("rq_processes", "RQ processes"),
            Col("rollq / RQ throughput", "throughput_ratio", x), Col("rollq / RQ RSS", "rss_ratio", ".3f"),
            Col("rollq / RQ CPU per rollout", "cpu_per_rollout_ratio", x),
        ], caption="rollq over plain RQ:"),
    ],
    after="![rollouts/s against rollouts in flight](throughput.png)",
)


def _before_after_rows(doc: Doc) -> list[list[Any]]:
    b, a = doc["before"], doc["after"]
    cpu = "worker_cpu_ms_per_rollout"
    rows = [
        ["worker CPU ms per rollout, 1000 in flight", b[cpu], a[cpu],
         [ratio(y, z) for z, y in zip(b[f"{cpu}_rounds"], a[f"{cpu}_rounds"], strict=False)]],
        ["rollouts/s while profiled, 1000 in flight", b["rollouts_per_s_1000_in_flight"],
         a["rollouts_per_s_1000_in_flight"], []],
    ] + [
        [f"round trips per no-op rollout ({label.split(', ')[-1]})", trips["round_trips_per_job"],
         a["round_trips"][label]["round_trips_per_job"], []]
        for label, trips in b["round_trips"].items() if label in a["round_trips"]
    ]
    if "noop_c16_end_to_end" in b and "noop_c16_end_to_end" in a:  # written since issue 24's measure
        be, ae = b["noop_c16_end_to_end"], a["noop_c16_end_to_end"]
        for name, key in [("Redis commands per no-op rollout, concurrency 16, end to end", "commands_per_rollout"),
                          ("worker CPU ms per no-op rollout, concurrency 16", "worker_cpu_ms_per_rollout")]:
            before, after = be[f"{key}_rounds"], ae[f"{key}_rounds"]
            rows.append([name, _median(before), _median(after),
                         [ratio(y, z) for z, y in zip(before, after, strict=False)]])
    return [[name, before, after, ratio(after, before), per] for name, before, after, per in rows]


def _before_after_changes(doc: Doc) -> dict[str, Any]:
    if doc["base"] == "1c72b18":
        changes = """Commit `1c72b18` is rollq 0.2.0 as it landed. What changed: a worker starts and ends its
jobs in batches (claims and RQ's start bookkeeping in one pipeline, the publications in one, RQ's end bookkeeping in
one); a rollout's tracer and executor leave no reference cycles and workers raise the garbage collector's
young-generation threshold; agent spans and the span-to-dict conversion do less per span."""
    elif doc["base"] == "fd9d057":
        changes = f"""Commit `fd9d057` is the one the page's headline figures were measured at until 2026-12-04
(`bench/run_all.py`, 2026-12-02); this run, on the machine of the headline run that replaced them, checks that the
worker's path costs what it did then. What changed since (`git log {doc['base']}..{doc['head']}`) is mostly the
capturing proxy, which neither the mock agent nor the no-op agent calls."""
    elif doc["base"] == "74dfb49":
        changes = f"""Commit `74dfb49` is the last one before the Lua scripts checked the type of each key they
write before their first write (`TYPE`, once a key a call: a key of another type is skipped and named, or refuses
the call when it is essential, instead of failing the script half-way after its `XADD`), before RQ job ids hashed
the namespace, and before the worker's heartbeat re-registered a worker Redis had lost (`git log
{doc['base']}..{doc['head']}`). This run is what those checks cost on the worker's path.{_packs_note_of(doc)}"""
    else:
        changes = f"What changed: the commits `git log {doc['base']}..{doc['head']}` lists."
    # The earlier headline runs' commits get headings of their own: the page links to them.
    against = f", against {doc['base']}" if doc["base"] in ("fd9d057", "74dfb49") else ""
    if doc["base"] == "74dfb49" and _packs_of(doc) > 1:
        against += f", this tree with packs of {_packs_of(doc)}"
    return {"changes": changes, "against": against}


def _packs_note_of(doc: Doc) -> str:
    """What a before/after run with packs compares: only this tree ran with them."""
    k = _packs_of(doc)
    return (
        f" This tree ran with packs of {k} tasks per RQ job and the base without (before_after.py gives packs to "
        "this tree only), so its ratios are the packs' whole gain plus the checks' cost; the Redis commands per "
        "rollout are the figure to read against the target (<= 15)."
        if k > 1
        else ""
    )


BEFORE_AFTER = Spec(
    title="Cheaper per rollout: before and after{against}",
    about="""Commit `{base}` beside `{head}`, taking turns in one run, {rounds} rounds. {changes}""",
    derive=_before_after_changes,
    tables=[
        Table(_before_after_rows, [
            Col("per rollout", nth(0)), Col("before", nth(1), ",.2f"),
            Col("after", nth(2), ",.2f"), Col("after / before", nth(3), x),
            Col("after / before, per round", nth(4), ratios),
        ])
    ],
)


PROFILE = Spec(
    title="Where a worker's time goes at {in_flight} in flight{packs}",
    about="""Both workers of the mock-LLM setting sampled with `py-spy record --gil` (stacks holding the GIL: Python
CPU) for {seconds:g} s: {rollouts_per_s:,.1f} rollouts/s while sampled, {worker_cpu_ms_per_rollout:.2f} ms of
worker CPU per rollout (psutil), {gil_held_ms_per_rollout:.2f} ms of it with the GIL held. CPU ms per rollout by
the innermost matching frame (`bench/profile.py` lists the rules):""",
    tables=[
        Table(lambda d: sorted(d["buckets_ms_per_rollout"].items(), key=lambda kv: -kv[1]),
              [Col("where", nth(0)), Col("GIL-held CPU ms per rollout", nth(1), ".3f")]),
        Table(lambda d: list((d.get("cpu_ms_per_rollout_by_thread") or {}).items()),
              [Col("thread", nth(0)), Col("CPU ms per rollout", nth(1), ".3f")],
              caption="Each thread's own CPU over the same window (psutil, both workers summed; runs from 2026-12-05). "
                      "These are exact where the GIL-held samples above are not: py-spy reads the running processes "
                      "without stopping them, and its samples cover only part of the CPU."),
    ],
    derive=lambda d: {"packs": f", packs of {_packs_of(d)} tasks per RQ job" if _packs_of(d) > 1 else ""},
)


def _round_mean(row: Doc, side: str, key: str) -> float:
    values = [r[side][key] for r in row["rounds"]]
    return sum(values) / len(values)


def _big_rows(doc: Doc) -> list[Doc]:
    return [
        {
            "rollout": f"{r['mb_per_rollout']:.2f} MB ({r['turns']} turns)",
            **{f"{k}/s": v for k, v in r["mean_rollouts_per_s"].items()},
            "over_json": r["rollq_over_json"],
            "over_orjson": r["rollq_over_orjson"],
            "per_round": ", ".join(x(v) for v in r["rollq_over_orjson_per_round"]),
            "orjson_cpu": f"{_round_mean(r, 'orjson', 'process_cpu_ms_per_rollout'):.2f} + "
            f"{_round_mean(r, 'orjson', 'redis_cpu_ms_per_rollout'):.2f}",
            "worker": _round_mean(r, "rollq", "worker_cpu_ms_per_rollout"),
            "redis": _round_mean(r, "rollq", "coordinator_cpu_ms_per_rollout"),
            "trainer": _round_mean(r, "rollq", "trainer_side_cpu_ms_per_rollout"),
            "loads": ", ".join(f"{r2['load_1min_before']:.1f} -> {r2['load_1min_after']:.1f}" for r2 in r["rounds"]),
        }
        for r in doc["rows"]
    ]


BIG_AFTER = """
What the change cost in simplicity: two modules and one dependency. `rollq/models/wire.py` (every writer and reader
of a results entry goes through it) writes with orjson: {write_orjson:.2f} ms of CPU against pydantic's
{write_pydantic:.2f} ms at 0.23 MB ({write_gain:.1f}x), and the same bytes: anything orjson would write differently
or refuses (an int beyond 64 bits, a datetime, bytes, a set, a key that is not a string, a subclass of a JSON type,
a dataclass) sends the whole rollout through pydantic as before; `tests/models/test_rollout_wire.py` compares the bytes
case by case. orjson is well kept (wheels for every common platform, the most used fast JSON library for Python).
`rollq/store/packing.py` packs a command that carries an argument past 6,000 bytes with redis-py's own Python
packer, which sends that argument uncopied, instead of `hiredis.pack_command`, which copies it into a buffer it
allocates anew: {pack_hiredis:.2f} against {pack_python:.2f} ms here, where malloc reuses the block; hiredis's takes
ten times as long where malloc maps fresh pages (the module's docstring has the figures). The bytes sent are the
same, and hiredis still packs every other command and parses every reply; the raw pipes keep redis-py's defaults.

Reading: what orjson wrote ends with two bytes of JSON whitespace, two tabs (every JSON reader skips them), and only
such an entry is read with orjson: it holds no int beyond 64 bits (orjson refuses to write one) and no NaN (written
as `null`), the two cases where orjson's parser differs from pydantic's (it reads an int beyond 64 bits as a float
without an error, and refuses `NaN`). Every other entry (pydantic's fallback, an older rollq, any other writer) is
read by pydantic's `model_validate_json` as before. At 0.23 MB the trainer parses a rollout in {read_orjson:.2f} ms
against {read_pydantic:.2f} ms ({read_gain:.2f}x), at 1 MB {read_orjson_1mb:.2f} against {read_pydantic_1mb:.2f} ms:
building the Python ints (36,864 per 0.23 MB rollout) is most of any parser's time. The cost in simplicity: a rule
readers rely on (the marker means "no big ints, no NaN"), which an entry forged with the marker could break;
`tests/models/test_rollout_wire.py` checks, case by case, that orjson reads back what it wrote as pydantic's parser
does, and that unmarked entries keep big ints exact.

What is left between rollq and the orjson pipe: at 0.23 MB rollq spent {rollq_cpu:.2f} ms of CPU per rollout (worker
{worker_cpu:.2f} + Redis {redis_cpu:.2f} + trainer side {trainer_cpu:.2f}), the orjson pipe {pipe_cpu:.2f} ms (its
process and Redis, one after the other). Parsing in the trainer and Redis moving the bytes are the pipe's costs too;
the rest is rollq's work per rollout that does not grow with its size (claim, RQ's job bookkeeping, the finish
script, the consumer group, the producer keeping tasks queued: bench/noop.py), spread over more processes and
threads, each handing the rollout on, which a loaded machine slows more than one process (see the load per round).
Beyond the changes here, a steady 1.0x needs that fixed cost cut (the worker CPU target above) or the token ids not
parsed into Python ints at all: a binary column (int32 bytes that a trainer turns into a tensor with
`torch.frombuffer`) instead of JSON lists, a change to the wire format and to what a `Triplet` holds, not made here.

At 1 MB most of the gap was Redis's, and most of that the copy of the rollout into Lua: finish.lua took the rollout
as an argument, and handing 1 MB to a script that only takes its length costs Redis {argument_usec_1mb:,.0f} µs by
itself (a SET of it {set_usec_1mb:,.0f} µs, an XADD {xadd_usec_1mb:,.0f} µs: Redis keeps the argument it read, while a
script gets a copy in Lua's heap). Now a rollout over 32 KB is SET at a key of its own in the finish's pipeline and
the script is passed the key's name (`rollq/store/payloads.py`): in the replay at 1 MB Redis spends
{finish_usec_1mb:,.0f} µs in finish.lua and {set_replay_usec_1mb:,.0f} µs in the SET, the trainer's MGET of the
payload {mget_usec_1mb:,.0f} µs. The MGET copies the rollout into its reply, as reading an inline entry did, but the
cost of fresh memory moved there: an XADD copies the bytes into the stream on new pages (the XADD alone above), a SET
keeps the buffer it read, and the reply's copy is what touches new pages while Redis's memory grows, as in the replay
and the runs above, which never trim ({get_growing_usec_1mb} µs for a GET right after its SET; {get_steady_usec_1mb} µs
once older keys are deleted, as the trim of a full results stream does). In the runs above rollq's Redis CPU per 1 MB
rollout is {redis_cpu_1mb:.2f} ms against the orjson pipe's {pipe_redis_cpu_1mb:.2f}.

What the payload keys cost in simplicity: the results stream has two entry shapes (a small rollout inline, a big one
naming its payload key), every reader loads the referenced ones (one MGET per read batch) before parsing, the trim
deletes the keys of the entries it removes, and a refused finish deletes its key; all of the rule is in
`rollq/store/payloads.py` and the two scripts (docs/internals.md, "Big rollouts").
"""


BIG = Spec(
    title="Big token-id rollouts beside raw redis-py pipes (json and orjson)",
    about="""A rollout carries 8 (or 35) triplets of 4096 prompt + 512 response token ids. The anchors are one process
moving the same rollout through a stream with redis-py (serialise, `XADD MAXLEN ~ {results_maxlen}`, `XREAD`,
parse): one with the standard `json` module, one with orjson, the fastest serialiser at hand. rollq runs
{worker_processes} worker processes ({in_flight} in flight) and a trainer thread reading through a consumer group,
every rollout parsed into a `Rollout`. The three take turns in one run, {window_seconds:g} s each, the order
rotating every round; rates are means over the rounds and the ratio rollq / orjson pipe of every round is shown.
rollq writes rollouts with orjson and reads what orjson wrote with orjson (`rollq/models/wire.py`; the text below
the tables says how it stays exact).""",
    tables=[
        Table(_big_rows, [
            ("rollout", "rollout"), ("json/s", "json pipe/s", ",.1f"), ("orjson/s", "orjson pipe/s", ",.1f"),
            ("rollq/s", "rollq/s", ",.1f"), Col("rollq / json pipe", "over_json", x),
            Col("rollq / orjson pipe", "over_orjson", x), ("per_round", "per round (orjson)"),
            ("orjson_cpu", "orjson pipe CPU ms/rollout, process + Redis"),
            ("worker", "rollq worker CPU ms/rollout", ".2f"), ("redis", "rollq Redis CPU ms/rollout", ".2f"),
            ("trainer", "rollq trainer CPU ms/rollout", ".2f"), ("loads", "load (1 min) per round"),
        ]),
        Table(lambda d: [{"MB": r["mb_per_rollout"], **r["replay"]["steps_ms_per_rollout"],
                          "total": r["replay"]["total_ms_per_rollout"]} for r in d["rows"]],
              [("MB", "rollout MB", ".2f"), *((s, s, ".2f") for s in (
                  "agent", "to_rollout", "stamp", "rollout_json", "finish.lua", "read + parse", "total"))],
              caption="One rollout's path step by step in one thread under cProfile (ms per rollout, wall clock):"),
        Table(lambda d: [[name, *(r["serialisers_cpu_ms"][name] for r in d["rows"])]
                         for name in d["rows"][0]["serialisers_cpu_ms"]],
              [Col("serialiser, one rollout", nth(0)),
               *(Col(f"CPU ms, {label}", lambda row, doc, i=i: row[i] if i < len(row) else "-",
                     lambda v: v if isinstance(v, str) else f"{v:.3f}")
                 for i, label in ((1, "0.23 MB"), (2, "1.01 MB")))],
              caption="The serialisers on their own (CPU ms per rollout, the best of 5 runs):"),
        Table(lambda d: [[name, *(r["replay"]["redis_usec_per_call"].get(name, "-") for r in d["rows"])]
                         for name in d["rows"][0]["replay"]["redis_usec_per_call"]],
              [Col("command", lambda row, doc: _REDIS_CALLS.get(row[0], row[0])),
               *(Col(f"Redis µs per call, {label}", lambda row, doc, i=i: row[i] if i < len(row) else "-",
                     lambda v: v if isinstance(v, str) else f"{v:,.0f}")
                 for i, label in ((1, "0.23 MB"), (2, "1.01 MB")))],
              caption="Redis's own time per call (`INFO commandstats`) in the replay, and for the rollout's bytes "
              "alone, on the same server:"),
    ],
    after=BIG_AFTER.strip(),
    derive=lambda doc: _big_derived(doc),
)


_REDIS_CALLS = {
    "evalsha": "replay: finish.lua (EVALSHA), given the rollout's payload key (over 32 KB)",
    "xadd": "replay: the XADD inside finish.lua",
    "xreadgroup": "replay: the trainer's XREADGROUP",
    "xack": "replay: the trainer's XACK",
    "set": "replay: the worker's SET of a big rollout's payload key",
    "mget": "replay: the trainer's MGET of payload keys",
    "alone: set": "alone: SET of the rollout",
    "alone: xadd": "alone: XADD of the rollout (what the pipes do)",
    "alone: evalsha": "alone: a script given the rollout that only takes its length",
    "alone: get, memory growing": "alone: GET of a key right after its SET, Redis's memory growing",
    "alone: get, old keys deleted": "alone: GET of a key right after its SET, older keys deleted",
}


def _big_derived(doc: Doc) -> dict[str, Any]:
    first = doc["rows"][0]
    codecs = first["serialisers_cpu_ms"]
    out = {
        "write_orjson": codecs["write rollq rollout_json (orjson)"],
        "pack_hiredis": codecs["send: hiredis pack_command (redis-py's default)"],
        "pack_python": codecs["send: rollq CommandPacker"],
        "write_pydantic": codecs["write pydantic model_dump_json"],
        "read_pydantic": codecs["read pydantic model_validate_json"],
        "read_orjson": codecs["read rollq parse_rollout (orjson: marked)"],
        "worker_cpu": _round_mean(first, "rollq", "worker_cpu_ms_per_rollout"),
        "redis_cpu": _round_mean(first, "rollq", "coordinator_cpu_ms_per_rollout"),
        "trainer_cpu": _round_mean(first, "rollq", "trainer_side_cpu_ms_per_rollout"),
        "pipe_cpu": _round_mean(first, "orjson", "process_cpu_ms_per_rollout")
        + _round_mean(first, "orjson", "redis_cpu_ms_per_rollout"),
    }
    out["write_gain"] = out["write_pydantic"] / out["write_orjson"]
    out["read_gain"] = out["read_pydantic"] / out["read_orjson"]
    last = doc["rows"][-1]["serialisers_cpu_ms"]
    out["read_pydantic_1mb"] = last["read pydantic model_validate_json"]
    out["read_orjson_1mb"] = last["read rollq parse_rollout (orjson: marked)"]
    out["rollq_cpu"] = out["worker_cpu"] + out["redis_cpu"] + out["trainer_cpu"]
    usec = doc["rows"][-1]["replay"]["redis_usec_per_call"]
    out["finish_usec_1mb"], out["xadd_usec_1mb"] = usec["evalsha"], usec["alone: xadd"]
    out["set_replay_usec_1mb"], out["mget_usec_1mb"] = usec.get("set", 0.0), usec.get("mget", 0.0)
    for name, key in (
        ("get_growing_usec_1mb", "alone: get, memory growing"),
        ("get_steady_usec_1mb", "alone: get, old keys deleted"),
    ):
        out[name] = f"{usec[key]:,.0f}" if key in usec else "-"
    out["argument_usec_1mb"], out["set_usec_1mb"] = usec["alone: evalsha"], usec["alone: set"]
    out["redis_cpu_1mb"] = _round_mean(doc["rows"][-1], "rollq", "coordinator_cpu_ms_per_rollout")
    out["pipe_redis_cpu_1mb"] = _round_mean(doc["rows"][-1], "orjson", "redis_cpu_ms_per_rollout")
    return out


K10 = Spec(
    title="10,000 rollouts in flight",
    about="""Slow agents: 3 LLM calls of 3-10 s each, traced as spans. Every task is enqueued in one call into idle
workers; the run ends when the trainer has every rollout. The simulation runs the same task list FIFO on
{in_flight:,} slots at zero cost: a real simulation, the figure to reach. Heartbeats every {heartbeat_seconds:g} s,
`unresponsive_seconds` 30.""",
    tables=[measures(
        "tasks", "in_flight", "worker_processes", "seconds", "simulated_seconds", "percent_of_simulation",
        "rollouts_per_s", "simulated_rollouts_per_s", "worker_cpu_ms_per_rollout", "redis_cpu_ms_per_rollout",
        "worker_rss_idle_mb", "worker_rss_full_mb", "worker_kb_per_in_flight", "redis_bytes_per_finished_rollout",
        "enqueue_seconds", "seconds_to_fill_slots", "min_deadline_slack_seconds", "requeued_or_superseded",
        "tasks_claimed_more_than_once", "lost", "duplicates")],
)


SCALING = Spec(
    title="How cost grows with worker processes and rollouts in flight",
    about="""Mock-LLM rollouts (3 turns x 0.1-0.5 s, spans on), {window_seconds:g} s of steady state each. First
sweep: 1000 in flight over 1-8 processes; second: 2 processes, 32 to 10,000 in flight (its 1000 is the first
sweep's 2-process row).""",
    tables=[
        Table(lambda d: [r for r in d["rows"] if not (r["sweep"] == "in_flight" and r["in_flight"] == 1000)], [
            ("worker_processes", "worker processes"), ("in_flight", "in flight"),
            ("rollouts_per_s", "rollouts/s", ",.1f"), ("percent_of_ideal", "% of the ideal rate", ".0f"),
            ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
            ("coordinator_cpu_ms_per_rollout", "Redis CPU ms/rollout", ".2f"),
            ("worker_rss_mb", "worker RSS MB", ",.1f"), ("other_processes_cpu_cores", "other processes, cores", ".2f"),
        ])
    ],
    after="![rollouts/s and CPU per rollout against processes and in flight](scaling.png)",
)


def _cluster_rows(doc: Doc) -> list[Doc]:
    rows = []
    for setting in dict.fromkeys(r["rtt_setting"] for r in doc["rows"]):
        mine = [r for r in doc["rows"] if r["rtt_setting"] == setting]
        avg = {k: mean([r.get(k) for r in mine]) for k, v in mine[0].items() if isinstance(v, (int, float))}
        firsts = sorted(r["seconds_to_first_claim"]["median"] for r in mine if r["seconds_to_first_claim"]["median"])
        rows.append({**avg, "setting": setting + ("" if setting == "direct" else " ms"),
                     "per_round": ", ".join(f"{r['percent_of_ideal']:.0f}%" for r in mine),
                     "first_claim": firsts[len(firsts) // 2] if firsts else None})
    return rows


def _dead_host_rows(doc: Doc) -> list[Doc]:
    """The dead-host runs: a list, one per profile and outage (a single dict before profiles existed)."""
    dead = doc.get("dead_host") or []
    if isinstance(dead, dict):  # bench/cluster.py before --profiles: its only settings, today's `tuned`
        settings = {"worker_heartbeat_seconds": 1.0, "policy_unresponsive_seconds": 6.0}
        return [{"profile": "tuned", "settings": settings, **dead}]
    return dead


def _dead_host_setting(row: Doc, doc: Doc) -> str:
    settings = row.get("settings")
    if not settings:
        return "-"
    return f"{settings['worker_heartbeat_seconds']:g} / {settings['policy_unresponsive_seconds']:g}"


CLUSTER = Spec(
    title="A simulated cluster: {hosts} hosts x {workers_per_host} worker processes, latency to Redis",
    about="""{hosts} hosts (network namespaces) x {workers_per_host} worker processes x {concurrency} in flight, one
redis-server in its own namespace, the producer and trainer in a third; each host reaches Redis over its own veth
pair through `bench/delay_proxy.py`, which delays each direction by half the round trip (this kernel has no
netem). "direct" skips the proxy; "0 ms" goes through it undelayed. {note}. "Writes/rollout" counts
client-to-Redis writes the proxies saw per rollout (each pays the latency). First claim: seconds from a worker's
start to its first claim (median). The % of the ideal rate of every round is shown beside the mean.""",
    tables=[
        Table(_cluster_rows, [
            ("setting", "RTT asked"), ("ping_rtt_ms_measured", "PING RTT measured, ms", ".2f"),
            ("rollouts_per_s", "rollouts/s", ",.1f"),
            Col("% of ideal (per round)", lambda r, d: f"{r['percent_of_ideal']:.0f}% ({r['per_round']})"),
            ("redis_connections", "Redis connections", ".0f"),
            ("redis_commands_per_rollout", "commands/rollout", ".1f"),
            ("client_writes_per_rollout", "writes/rollout", ".1f"),
            ("redis_cpu_ms_per_rollout", "Redis CPU ms/rollout", ".2f"),
            ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
            ("proxy_cpu_ms_per_rollout", "proxy CPU ms/rollout", ".2f"), ("first_claim", "first claim, s"),
        ]),
        Table(_dead_host_rows, [
            ("profile", "profile"), Col("heartbeat / `unresponsive_seconds`, s", _dead_host_setting),
            ("down_for_seconds", "link down, s"), ("rtt_setting", "RTT, ms"), ("tasks", "tasks"),
            ("received", "received"), ("lost", "lost"), ("duplicates", "duplicated"),
            ("tasks_claimed_more_than_once", "ran more than once"),
            ("requeued_or_superseded", "requeued / superseded"),
            ("received_while_down", "received while down"),
            ("seconds_from_restore_to_last_received", "last received, s after restore"),
            ("tasks_last_claimed_by_host0_after_restore", "host 0 claims after restore"),
        ], caption="Dead host (`--outage`, `--profiles`): host 0's link down, then back, at each profile's settings "
                   "(`defaults`: every rollq default; `tuned`: 1 s heartbeats, `unresponsive_seconds` 6; the rest "
                   "of each profile's resolved settings are in the results file, `dead_host_profiles`):"),
    ],
)


FAILOVER_PROFILES = ("defaults", "tuned", "tuned-no-wait")


def _failover_rows(doc: Doc) -> list[list[Any]]:
    """One row per measure, one column per profile: its resolved settings, then its aggregate over its runs."""
    found = doc.get("profiles") or {}
    profiles = {name: found.get(name, {"settings": {}, "aggregate": {}}) for name in FAILOVER_PROFILES}

    def spread(key: str) -> Callable[[Doc], str]:
        return lambda a: f"{cell(a[key]['p50'])} / {cell(a[key]['max'])}" if a.get(key) else "-"

    def of(key: str) -> Callable[[Doc], Any]:
        return lambda a: a.get(key)

    settings = [
        ("Sentinel `down-after-milliseconds`", "sentinel_down_after_milliseconds"),
        ("worker heartbeat, s", "worker_heartbeat_seconds"),
        ("`unresponsive_seconds`", "policy_unresponsive_seconds"),
        ("`wait_replicas` (from)", lambda s: f"{s['wait_replicas']} ({s['wait_replicas_from']})"),
        ("`wait_timeout_ms`", "wait_timeout_ms"),
        ("client socket / connect timeout, s; retries",
         lambda s: f"{s['client_socket_timeout_seconds']:g} / {s['client_connect_timeout_seconds']:g}; "
                   f"{s['client_retries']}"),
        ("old primary restarted after, s", "old_primary_restarted_after_seconds"),
    ]
    figures: list[tuple[str, Callable[[Doc], Any]]] = [
        ("runs (completed)", lambda a: f"{a['runs']} ({a['runs_completed']})"),
        ("tasks enqueued and acknowledged, all runs", of("tasks_enqueued_acknowledged_total")),
        ("**tasks lost**, all runs (worst run)",
         lambda a: f"**{a['tasks_lost_total']}** ({a['tasks_lost_max_in_a_run']})"),
        ("rollouts never received", of("rollouts_never_received_total")),
        ("**rollouts the trainer received twice** (runs with any)",
         lambda a: f"**{a['rollouts_received_twice_total']}** ({a['runs_with_a_rollout_received_twice']})"),
        ("tasks run twice (runs with any)",
         lambda a: f"{a['tasks_run_more_than_once_total']} ({a['runs_with_a_task_run_twice']})"),
        ("Sentinels named the new primary after, s, p50 / max", spread("sentinel_named_new_primary_after_seconds")),
        ("workers published again after, s, p50 / max", spread("workers_published_again_after_seconds")),
        ("trainer received again after, s, p50 / max", spread("trainer_received_again_after_seconds")),
        ("old primary replicating again after, s, p50 / max",
         spread("old_primary_replicating_again_after_seconds")),
        ("enqueue of 10 before the kill, ms, p50 / max", spread("enqueue_batch_of_10_ms_median_before_kill")),
        ("runs with workers degraded (no replica)", of("runs_with_workers_degraded")),
        ("enqueue errors during the failovers", of("enqueue_errors_during_failover_total")),
    ]
    rows: list[list[Any]] = []
    for label, key in settings:
        get = key if callable(key) else (lambda k: lambda s: s.get(k))(key)
        rows.append([label, *(get(p["settings"]) if p["settings"] else None for p in profiles.values())])
    for label, get in figures:
        rows.append([label, *(get(p["aggregate"]) if p["aggregate"].get("runs") else None for p in profiles.values())])
    return rows


def _arrow(key: str) -> Callable[[Any, Doc], str]:
    return lambda r, d: f"{r['wait_replicas_0'][key]} -> {r['wait_replicas_1'][key]}"


FAILOVER = Spec(
    title="Redis failover under load (Sentinel){repeated}, at default and tuned settings",
    about="""A primary, one replica {settings[replica_rtt_ms]:g} ms (round trip) away through a delaying proxy, 3
Sentinels (quorum 2); {settings[workers]} `rollq worker` processes (concurrency {settings[concurrency]}, mock-LLM
rollouts) and a producer enqueuing {settings[rate]:g} tasks/s, {settings[tasks]} tasks per run, connect with
`redis+sentinel://...`; the primary and its end of the replication link are SIGKILLed {settings[kill_after]:g} s
in, the old primary restarts empty later. A trainer reads every rollout through a consumer group. Each profile ran
{runs_text}; its settings (defaults resolved to their values) head its column, then its figures over all its
runs.{incomplete}""",
    derive=lambda d: {
        "runs_text": ", ".join(f"`{n}` {c} times" for n, c in (d.get("run_settings") or {})
                               .get("runs_per_profile", {}).items()),
        "incomplete": "" if d.get("complete", True) else " **Incomplete: written while runs were still going.**",
        "repeated": ", repeated" if max((d.get("run_settings") or {}).get("runs_per_profile", {}).values(),
                                        default=1) > 1 else ", one run a profile",
    },
    tables=[
        Table(_failover_rows, [Col("measure", nth(0)), Col("`defaults`", nth(1)), Col("`tuned`", nth(2)),
                               Col("`tuned-no-wait`", nth(3))]),
        Table("transition_cost", [
            ("replica_rtt_ms", "replica round trip, ms", "g"), Col("enqueue median ms, 0 -> 1",
            _arrow("enqueue_ms_median")), Col("worker rollouts/s, 0 -> 1", _arrow("worker_rollouts_per_s")),
        ], caption="What `wait_replicas=1` costs each transition (interleaved rounds; one worker, concurrency 16, "
                   "no-op rollouts):"),
    ],
)


SOAK = Spec(
    title="Soak: a kill storm",
    about="""{settings[workers]} workers x concurrency {settings[concurrency]}; a random worker SIGKILLed and
replaced every {settings[kill_every]} s for {settings[duration]:g} s; `unresponsive_seconds`
{settings[unresponsive]:g}. Every task in must come out exactly once (the script exits 1 otherwise).""",
    tables=[measures("tasks_in", "delivered", "lost", "duplicated", "succeeded", "failed", "superseded", "requeued",
                     "kills", "kills_with_tasks_in_flight", "kill_to_requeue_mean_s", "kill_to_requeue_max_s",
                     "elapsed_s", "rollouts_per_s")],
)


def _capture_rounds(doc: Doc) -> list[Doc]:
    """The capture on/off rollout rounds, each "on" round with its rate over the "off" round before it."""
    rows = (doc.get("rollouts") or {}).get("rows", [])
    return [{**r, "on_over_off": ratio(r["rollouts_per_s"], rows[i - 1]["rollouts_per_s"]) if i % 2 else None}
            for i, r in enumerate(rows)]


def _capture_paths(doc: Doc) -> list[Doc]:
    """Direct, this commit's proxy, with --base the base commit's, with --floor the proxy's HTTP alone and the raw
    forwarder, each with its added latency and CPU."""
    rows = []
    names = {
        "proxy_base": f"proxy at {doc.get('base_commit', 'base')}",
        "raw": "raw forwarder (the floor)",
        "rollq_http": "the proxy's HTTP alone (nothing captured)",
        "native": "compiled forwarder, recorded in Python in batches (bench only)",
    }
    paths = (("direct", None), ("proxy", ""), ("proxy_base", "_base"), ("rollq_http", "_rollq_http"), ("raw", "_raw"),
             ("native", "_native"))
    for path, suffix in paths:
        if path not in doc:
            continue
        name = names.get(path, path)
        row = {"path": name, **doc[path]}
        if suffix is not None:
            row.update({k: doc.get(f"{k}{suffix}") for k in ("added_p50_ms", "added_p99_ms", "proxy_cpu_ms_per_call")})
        rows.append(row)
    return rows


def _load_elsewhere(doc: Doc) -> bool:
    """Whether a capture run's agent load ran in a process of its own (``--load-elsewhere``), not the proxy's."""
    settings = doc.get("settings") or {}
    return bool(settings.get("load_elsewhere") and settings.get("agent_load"))


def _agent_load_text(doc: Doc) -> str:
    """What a capture run's agent load was, and where it ran, for the section's text."""
    load = (doc.get("settings") or {}).get("agent_load")
    if not load:
        return ""
    if _load_elsewhere(doc):
        return (f", with a thread in another process running Python {load:.0%} of the time, as a worker's agents "
                "would beside a proxy process of its own (no GIL shared)")
    return (f", with a thread in it running Python {load:.0%} of the time as a worker's agents do, sharing its GIL; "
            "that thread's CPU is not counted")


def _forwarder_cols(key: str, header: str) -> list[Col]:
    """A forwarder's added p50 and p99 and CPU per call in a capture run's round, left out where it did not run."""
    return [
        Col(f"{header} added p50 ms", f"added_p50_ms_{key}", "+.1f", optional=True),
        Col(f"{header} added p99 ms", f"added_p99_ms_{key}", "+.1f", optional=True),
        Col(f"{header} CPU ms/call", f"{key}_cpu_ms_per_call", ".3f", optional=True),
    ]


CAPTURE = Spec(
    title="LLM calls through the capturing proxy vs straight to the backend{load_where}{label_title}",
    about="""{settings[concurrency]} calls in flight against the demo's simulated LLM ({settings[latency]:g} s per
call on average), {settings[rounds]} rounds alternating direct and through a worker's `CaptureProxy` (its own
process, its garbage collector set as a worker's{released_text}{agent_load_text}).{prompt_text} Latency is each call's
time at the client less the backend's reported generation time: the path's own cost, in the steady state: each round
opens with
{settings[concurrency]} calls {opening_text}, and those are left out of the percentiles (each later call starts as an
earlier one ends).{burst_text} Added latency p50 {added_p50_ms:+.1f} ms, p99
{added_p99_ms:+.1f} ms; proxy CPU per call {proxy_cpu_ms_per_call:.2f} ms.{base_text}{floor_text}{native_text}
The per-round table gives each
round's own added p50 and p99 (over about {per_round_calls:,} steady calls) and the share of the machine's CPU time
the hypervisor took during each path's turn (steal): a round's p99 can be several times another's in the same run,
so one run's p99 says little on its own. The proxy is one Python
thread per worker process: when the machine leaves it less than the calls need, they queue in it, and when the
agents' thread holds the GIL each step of a call waits for it (the proxy lowers the GIL switch interval to 1 ms for
that: `rollq/worker/capture/gil.py`).""",
    derive=lambda d: {
        "load_where": ", the agents' load in a process of its own" if _load_elsewhere(d) else "",
        "agent_load_text": _agent_load_text(d),
        "per_round_calls": d["proxy"]["calls"] // max(1, len(d.get("rounds", []))),
        "released_text": (f", the calls' spans let go every {d['spans_released_every_seconds']:g} s as a worker's "
                          "rollouts let go of theirs") if d.get("spans_released_every_seconds") else "",
        "opening_text": (f"spread over {d['opening_ramp_seconds']:g} s (one mean latency: the steady rate from the "
                         "start)") if d.get("opening_ramp_seconds") else "sent at once, a burst no worker sends",
        "burst_text": (f" Counting the opening calls too, the added latency is p50 "
                       f"{d['added_p50_ms_with_opening_burst']:+.1f} ms, "
                       f"p99 {d['added_p99_ms_with_opening_burst']:+.1f} ms"
                       + ("." if d.get("opening_ramp_seconds") else ": those calls queue behind one another on every "
                          "path, and the burst's spread swamps the proxy's part."))
        if "added_p50_ms_with_opening_burst" in d else "",
        "floor_text": (f" A raw forwarder (`--floor`: bench/proxy_floor.py's bare asyncio protocols, no HTTP library, "
                       f"nothing captured; not a usable proxy) took its turn in every round too, in a process set up "
                       f"as the proxy's (the same agent load, collector and GIL switch interval), every call asking "
                       f"for token ids itself on every path: it added p50 {d['added_p50_ms_raw']:+.1f} ms, p99 "
                       f"{d['added_p99_ms_raw']:+.1f} ms at {d['proxy_cpu_ms_per_call_raw']:.2f} ms CPU per call, "
                       f"the least a forwarder in Python adds here."
                       + (f" The proxy's own HTTP server and client with nothing captured (`rollq_http`) added "
                          f"{d['added_p50_ms_rollq_http']:+.1f} and {d['added_p99_ms_rollq_http']:+.1f} ms at "
                          f"{d['proxy_cpu_ms_per_call_rollq_http']:.2f} ms CPU per call."
                          if "added_p50_ms_rollq_http" in d else "")) if "added_p50_ms_raw" in d else "",
        "native_text": (f" A compiled forwarder (`--native`: bench/native_forwarder, hyper on one thread outside "
                        f"Python; not a usable proxy: no streaming, weight-sync gate, retries or request rewriting) "
                        f"took its turn in every round too, in a process set up as the proxy's, that process "
                        f"recording every call it was handed (every 20 ms) as the capture proxy records it, span "
                        f"included, while its agents' thread held the GIL as in the proxy's: it added p50 "
                        f"{d['added_p50_ms_native']:+.1f} ms, p99 {d['added_p99_ms_native']:+.1f} ms at "
                        f"{d['proxy_cpu_ms_per_call_native']:.2f} ms CPU per call (both processes). The calls it "
                        f"forwards never wait for the GIL.") if "added_p50_ms_native" in d else "",
        "label_title": f": {d['label']}" if d.get("label") else "",
        "prompt_text": (f" Each call's user message was padded to {d['settings']['prompt_chars']:,} characters, and "
                        "each answer carried a prompt token id per byte of the prompt, each below 256."
                        ) if d.get("settings", {}).get("prompt_chars") else "",
        "base_text": (f" The proxy as of `{d['base_commit']}` took its turn in every round too (order swapped "
                      f"every round): added p50 {d['added_p50_ms_base']:+.1f} ms, p99 {d['added_p99_ms_base']:+.1f} "
                      f"ms, {d['proxy_cpu_ms_per_call_base']:.2f} ms CPU per call.") if d.get("base_commit") else "",
    },
    tables=[
        Table(_capture_paths, [
            ("path", "path"), ("calls", "calls"), ("p50_ms", "p50 ms", ",.1f"), ("p99_ms", "p99 ms", ",.1f"),
            ("mean_ms", "mean ms", ",.1f"), ("added_p50_ms", "added p50 ms", "+.1f"),
            ("added_p99_ms", "added p99 ms", "+.1f"), ("proxy_cpu_ms_per_call", "proxy CPU ms/call", ".3f")]),
        Table("rounds", [
            ("round", "round"), ("direct_p50_ms", "direct p50 ms", ".1f"), ("proxy_p50_ms", "proxy p50 ms", ".1f"),
            ("added_p50_ms", "added p50 ms", "+.1f"), ("added_p99_ms", "added p99 ms", "+.1f"),
            ("direct_steal_percent", "steal % direct", ".1f"), ("proxy_steal_percent", "steal % proxy", ".1f"),
            Col("base proxy p50 ms", "proxy_base_p50_ms", ".1f", optional=True),
            ("proxy_cpu_ms_per_call", "proxy CPU ms/call", ".3f"),
            Col("base proxy CPU ms/call", "proxy_base_cpu_ms_per_call", ".3f", optional=True),
            Col("CPU new / base", "cpu_new_over_base", ".3f", optional=True),
            Col("raw p50 ms", "raw_p50_ms", ".1f", optional=True),
            *_forwarder_cols("raw", "raw"), *_forwarder_cols("rollq_http", "HTTP alone"),
            *_forwarder_cols("native", "compiled"),
            ("load_1min", "load (1 min)", ".1f"),
        ], caption="Per round (the base proxy's columns in runs with `--base`, the raw forwarder's and the proxy's "
                   "HTTP alone with `--floor`, the compiled forwarder's with `--native`; a column no round has is "
                   "left out):"),
        Table(_capture_rounds, [
            ("system", "capture"), ("rollouts", "rollouts"), ("failed", "failed"),
            ("rollouts_per_s", "rollouts/s", ",.1f"), Col("on / off, this round pair", "on_over_off", x),
            ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
            ("other_processes_cpu_cores", "other processes, cores", ".2f"),
        ], caption="Sample-agent rollouts (the `openai` client, 1-2 calls of 0.1-0.5 s) on 2 worker processes, "
                   "capture off and on in alternating rounds:"),
    ],
)


ENQUEUE = Spec(
    title="Enqueue {rows[0][tasks]:,} tasks",
    about="""One call each, median of the rounds, same redis-server (flushed between rounds). rollq writes the task
record and an RQ job hash and pushes the job in one Lua call per task (2000 per pipelined round trip); RQ's
`enqueue_many` pipelines its own commands.""",
    tables=[
        Table("rows", [
            ("label", "producer"), ("tasks_per_s", "tasks/s", ",.0f"),
            ("producer_cpu_us_per_task", "producer CPU us/task", ".1f"),
            ("redis_cpu_us_per_task", "Redis CPU us/task", ".1f"), ("commands_per_task", "Redis commands/task", ".1f"),
        ])
    ],
)


MEMORY = Spec(
    title="One worker's memory over {rollouts:,} rollouts",
    about="""One `RolloutWorker` process, concurrency {concurrency}, {agent}; RSS sampled every second.
{rollouts:,} rollouts in {seconds:.0f} s ({rollouts_per_s:,.1f}/s), {failed} failed.""",
    tables=[measures("rss_mb.start", "rss_mb.peak", "rss_mb.end", "growth_mb_from_start",
                     "growth_mb_after_first_1000")],
)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


STARTUP = Spec(
    title="Worker start-up: from exec to the first claim",
    about="""{rounds} rounds; in each, the workers take turns, every one a fresh `rq worker` process on the same
redis-server with one job already queued for it: the seconds from `exec` to the moment its first job started (RQ's
`started_at` for the plain job, the claim for rollq). Below, the import times: `python -X importtime -c
"import ..."` in a fresh process, cumulative, median of {import_rounds} runs.""",
    tables=[
        Table("rows", [
            ("label", "worker"), ("median_seconds", "exec to first claim, median s", ".3f"),
            Col("per round, s", "rounds_seconds", lambda v: ", ".join(f"{s:.2f}" for s in v)),
            Col("vs plain RQ (medians)", "vs_rq", x),
            Col("median of per-round ratios", lambda r, d: _median(r["vs_rq_per_round"]), x),
            Col("vs plain RQ, per round", "vs_rq_per_round", ratios),
        ]),
        Table(lambda d: list(d.get("imports", {}).items()),
              [Col("import", lambda r, d: f"`{r[0]}`"), Col("seconds (median)", nth(1), ".3f")]),
    ],
    after="""What changed, and what it cost: the capturing proxy's HTTP stack (aiohttp, httptools) is imported and its
thread started by the first attempt that has an http(s) LLM endpoint, not at worker start (`OnDemandCapture`); that
attempt waits for it (a few tenths of a second, once per process), and a proxy that cannot start fails that
attempt (the task is retried) instead of stopping the worker at start. The weight-sync gate still exists from
the start, so a pause is followed before any proxy runs. fakeredis (and the numpy it imports) is imported only
for `memory://` URLs. rollq's modules are byte-compiled as a wheel install leaves them.
`tests/worker/test_startup_imports.py` pins what a worker's import leaves out (aiohttp, httptools, fakeredis, numpy, the
metrics and dashboard side). What remains over plain RQ is pydantic and pydantic-settings (the contract and the
settings model) and rollq's own modules.""",
)


def _vs_base_rows(doc: Doc, base: str) -> list[Doc]:
    """The rows of agents taking turns, each with its worker CPU and rollouts/s over those of ``base`` (the
    ``system`` compared against) in the same round."""
    rows = [dict(row) for row in doc.get("rows", [])]
    bases = {row.get("round"): row for row in rows if row["system"] == base}
    for row in rows:
        old = bases.get(row.get("round"))
        if old is not None and row is not old:
            row["cpu_ratio"] = ratio(row["worker_cpu_ms_per_rollout"], old["worker_cpu_ms_per_rollout"])
            row["rate_ratio"] = ratio(row["rollouts_per_s"], old["rollouts_per_s"])
    return rows


def _sample_clients_rows(doc: Doc) -> list[Doc]:
    return _vs_base_rows(doc, "1 client")


def _switch_interval_rows(doc: Doc) -> list[Doc]:
    return _vs_base_rows(doc, "1 ms")


def _over_socket(doc: Doc) -> bool:
    """Whether a run's workers sent their calls to the proxy over its socket (``ROLLQ_CAPTURE_IN_MEMORY=0``)."""
    return "ROLLQ_CAPTURE_IN_MEMORY=0" in ((doc.get("settings") or {}).get("env") or [])


SAMPLE_CLIENTS = Spec(
    title="The sample agent: one openai client for all its rollouts, or several{socket_title}",
    about="""Sample-agent rollouts (the `openai` client, 1-2 calls of 0.1-0.5 s to the demo's simulated LLM, capture
on{socket_text}) at {settings[in_flight]} in flight on 2 worker processes, one client and `SampleAgent.clients` taking
turns, order swapped every round, {settings[window]:g} s measured each. The client's connection pool looks at every
connection it holds whenever a request starts or ends ([workers.md](workers.md#writing-an-agent)).""",
    derive=lambda d: {
        "socket_title": ", calls over the proxy's socket" if _over_socket(d) else "",
        "socket_text": (": the calls sent to the proxy over its socket, `ROLLQ_CAPTURE_IN_MEMORY=0`" if _over_socket(d)
                        else ": the calls handed to the proxy in memory, the default since 2026-12-04"
                        if "2026-12-04" <= d["date"][:10] else ""),
    },
    tables=[Table(_sample_clients_rows, [
        ("round", "round"), ("system", "clients"), ("rollouts", "rollouts"), ("failed", "failed"),
        ("rollouts_per_s", "rollouts/s", ",.1f"), ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
        Col("CPU, several / one, this round", "cpu_ratio", x),
    ])],
)


def _by_system(rows: list[Doc]) -> Iterator[tuple[str, list[Doc], list[Doc]]]:
    """Each agent's rows (``_vs_base_rows``'), in order of first appearance, and those of them with ratios."""
    for system in dict.fromkeys(row["system"] for row in rows):
        mine = [row for row in rows if row["system"] == system]
        yield system, mine, [row for row in mine if "cpu_ratio" in row]


def _ratio_medians(compared: list[Doc]) -> list[float | None]:
    """The medians over rounds of the worker CPU and rollouts/s ratios (None without any)."""
    if not compared:
        return [None, None]
    return [_median([r["cpu_ratio"] for r in compared]), _median([r["rate_ratio"] for r in compared])]


def _switch_interval_summary(doc: Doc) -> list[list[Any]]:
    """Per switch interval: the medians over the rounds of its worker CPU and rollouts/s over the 1 ms run's."""
    return [
        [system, len(compared), *_ratio_medians(compared)]
        for system, _, compared in _by_system(_switch_interval_rows(doc))
        if compared
    ]


SWITCH_INTERVAL = Spec(
    title="The sample agent beside its proxy: the GIL switch interval at 1 ms, 5 ms and 0.25 ms",
    about="""What the switch interval costs the agents (docs/workers.md, "The proxy and the GIL"): sample-agent
rollouts (the `openai` client, 1-2 calls of 0.1-0.5 s to the demo's simulated LLM, capture on) at
{settings[in_flight]} in flight on 2 worker processes, the sample agent at 1 ms (set by its proxy from its start
until commit 4c4ec23, by the bench agent since) and the same agent in processes set to 5 ms (the interpreter's
default, as if the proxy left it alone) and to 0.25 ms taking turns, order reversed every round,
{settings[window]:g} s measured each. The workers are CPU-bound here: every setting
runs as many rollouts as its CPU per rollout lets it.""",
    tables=[
        Table(_switch_interval_summary, [
            Col("switch interval", nth(0)), Col("rounds", nth(1)),
            Col("worker CPU per rollout over 1 ms's, median of rounds", nth(2), x),
            Col("rollouts/s over 1 ms's, median of rounds", nth(3), x),
        ]),
        Table(_switch_interval_rows, [
            ("round", "round"), ("system", "switch interval"), ("rollouts", "rollouts"), ("failed", "failed"),
            ("rollouts_per_s", "rollouts/s", ",.1f"), ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
            Col("CPU over 1 ms's, this round", "cpu_ratio", x),
            Col("rollouts/s over 1 ms's, this round", "rate_ratio", x),
        ], caption="Per round:"),
    ],
)


def _gc_freeze_rows(doc: Doc) -> list[Doc]:
    return _vs_base_rows(doc, "start-up in reach")


def _gc_freeze_summary(doc: Doc) -> list[list[Any]]:
    """Per setting: the medians over rounds of CPU and rollouts/s over the unfrozen run's, and the collections."""
    summary = []
    for system, mine, compared in _by_system(_gc_freeze_rows(doc)):
        summary.append([
            system, len(mine), *_ratio_medians(compared),
            sum(r["gc"]["collections"][2] for r in mine),
            sum(r["gc"]["collections"][0] for r in mine),
            1000 * sum(r["gc"]["cpu_seconds"][0] for r in mine) / max(1, sum(r["gc"]["collections"][0] for r in mine)),
            max(r["gc"]["longest_ms"][0] for r in mine),
            max(r["gc"]["longest_ms"][1] for r in mine),
            _median([r["gc"]["share_of_cpu_percent"] for r in mine]),
        ])
    return summary


GC_FREEZE = Spec(
    title="A worker's start-up objects frozen out of the garbage collector's reach",
    about="""Every full collection walks every object the collector tracks, and most of a worker's are what it
imported before its first rollout (about 114,000 with the `openai` SDK; a full collection of them alone took 55 ms
on this machine), none of which ever becomes garbage. `gc.freeze()` would take them out of its reach. Sample-agent
rollouts (the `openai` client, 1-2 calls of 0.1-0.5 s to the demo's simulated LLM, capture on) at
{settings[in_flight]} in flight on 2 worker processes, as they are and with what the process imported frozen when
the agent is built, taking turns, order swapped every round, {settings[window]:g} s measured each; the collections
are each worker process's over its life (start-up and warm-up included, about 35 s), summed over the round's 2
processes; a collection's time is its wall time, on cores the workers keep busy.""",
    tables=[
        Table(_gc_freeze_summary, [
            Col("start-up objects", nth(0)), Col("rounds", nth(1)),
            Col("worker CPU per rollout over in reach, median", nth(2), x),
            Col("rollouts/s over in reach, median", nth(3), x),
            Col("full collections, all rounds", nth(4)), Col("young collections, all rounds", nth(5)),
            Col("CPU per young collection, ms", nth(6), ".1f"), Col("longest young, ms (wall)", nth(7), ".1f"),
            Col("longest middle-generation, ms (wall)", nth(8), ".1f"),
            Col("collector's share of worker CPU, median %", nth(9), ".2f"),
        ]),
        Table(_gc_freeze_rows, [
            ("round", "round"), ("system", "start-up objects"), ("rollouts", "rollouts"), ("failed", "failed"),
            ("rollouts_per_s", "rollouts/s", ",.1f"), ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
            Col("CPU over in reach's", "cpu_ratio", x),
            Col("collections (young, middle, full)", lambda r, d: ", ".join(map(str, r["gc"]["collections"]))),
            Col("their CPU s", lambda r, d: ", ".join(f"{v:.3f}" for v in r["gc"]["cpu_seconds"])),
            Col("collector's share of CPU %", lambda r, d: f"{r['gc']['share_of_cpu_percent']:.2f}"),
        ], caption="Per round:"),
    ],
    after="""Why a young collection costs more than its threshold suggests: Python 3.11 counts a young generation's
new objects net of every tracked object freed, old ones included, so while rollouts that outlived a collection or
two keep ending, the young generation holds several times the threshold when it is collected (23,000-28,000 objects,
counted in the collector's callback in one run, at a threshold of 5,000: tuples, dicts, coroutines, bound methods,
locks and events of the rollouts in flight). Every collection stops every thread of the process, the capturing
proxy's included.""",
)


def _answer_rows(doc: Doc) -> list[Doc]:
    return [{"answer": name, **row} for name, row in doc.get("answers", {}).items()]


def _now(row: Doc) -> str:
    """The newest reader of the run for that answer, the proxy's own then (a run that recorded none: the typed pass)."""
    return str(row.get("now", "typed"))


def _now_cell(gap: str, key: str) -> Callable[[Doc, Doc], Any]:
    return lambda row, doc: (row.get(gap) or {}).get(key.format(now=_now(row)))


ANSWER_READ = Spec(
    title="Reading an LLM answer into its record: the typed pass beside parsing all of it{variant}",
    about="""Every answer the capturing proxy forwards, whole or streamed, is read into its call's record and span.
`before` is how the proxy read answers before this release (copied into the script): each body searched for a run
of 19 digits (an int orjson would read as a float), parsed whole by orjson, or by `json` where such a run was found,
every field a Python object, the token ids written back to JSON text for the span. `parsed` is the same with today's
`codec.loads` (msgspec, exact for ints of any size): what a streamed chunk, or a whole answer of another shape than
vLLM's and OpenAI's, gets now. `typed` is what vLLM's and OpenAI's whole answers get now
(`rollq/worker/capture/answers.py`): msgspec decodes the few fields a record takes, skips the rest, and keeps the
token ids as the text they came in.{typed_chunks} Each then builds the call's span attributes. The answers are
vLLM's chat answers with `return_token_ids`: `bench` is the size bench/capture.py and bench/call_rate.py forward (40
prompt ids, one answer token); `chat_2k` has 2,000 prompt ids and 200 answer tokens with logprobs, `chat_8k` 8,000
and 1,000, as a training run asks for them; `stream_2k` and `stream_8k` are streams of 2,000 prompt ids and 200
tokens, 8,000 and 500, a chunk a token (logprobs uniform in (-1, 0); one within 0.01 of zero has a run of 18-19
digits, which sent `before` to `json`). CPU per answer of the reading thread, back to back and with a 0.5 ms sleep
after each (the call rate of issue 24's target, where every burst starts with cold caches) less the sleeps alone,
the readers taking turns, order reversed every repeat; medians of {settings[repeats]} repeats.""",
    derive=lambda d: {
        "variant": ": with a typed pass for streamed chunks too, tried and not kept"
        if d.get("benchmark") == "answer_read_typed_chunks" else "",
        "typed_chunks": " In this run streamed chunks had a typed pass of their own too (`answers.read_chunk`, at "
        "126006e), taken out again after it."
        if d.get("benchmark") == "answer_read_typed_chunks" else "",
    },
    tables=[
        Table(_answer_rows, [
            ("answer", "answer"), ("bytes", "bytes", ","), ("before_read_by_json", "before: read by json"),
            ("back_to_back.before_us", "before, us", ",.1f"), ("back_to_back.parsed_us", "parsed, us", ",.1f"),
            ("back_to_back.typed_us", "typed, us", ",.1f"),
            Col("the run's newest reader", lambda row, doc: _now(row)),
            Col("newest / before", _now_cell("back_to_back", "{now}_over_before"), x),
            ("between_sleeps.before_us", "before between sleeps, us", ",.1f"),
            Col("newest between sleeps, us", _now_cell("between_sleeps", "{now}_us"), ",.1f"),
            Col("newest / before between sleeps", _now_cell("between_sleeps", "{now}_over_before"), x),
            Col("per repeat, between sleeps", lambda row, doc: (row.get("between_sleeps") or {}).get(
                "per_repeat_now_over_before", (row.get("between_sleeps") or {}).get("per_repeat_typed_over_before"))),
        ]),
    ],
)


def _per_level(key: str) -> Callable[[Doc], list[Doc]]:
    """The ``key`` rows of every in-flight level of bench/agent_calls.py's file, each with its level."""
    return lambda doc: [{"in_flight": lv["in_flight"], **row} for lv in doc.get("levels", []) for row in lv[key]]


def _agent_calls_workers(in_memory: bool, on_its_thread: bool) -> str:
    """The workers of a bench/agent_calls.py run, as its section names them."""
    if not in_memory:
        return """capture off (the agents call the LLM directly), the proxy on a thread and loop of its own
(the default then), and the proxy on the agents' loop (`ROLLQ_CAPTURE_ON_AGENT_LOOP=1`), both called over the
proxy's socket"""
    served = """, each served on the agents' loop that made it ("proxy thread, in memory": the default) or passed
to the proxy's thread and back ("served on its thread", `ROLLQ_CAPTURE_IN_MEMORY_ON_AGENT_LOOP=0`, the default
until then)"""
    return f"""capture off (the agents call the LLM directly); the proxy on a thread and loop of its own
(the default), called over its socket (`ROLLQ_CAPTURE_IN_MEMORY=0`) or handed the agents' calls in memory (the
default){served if on_its_thread else ""}; and the proxy on the agents' loop (`ROLLQ_CAPTURE_ON_AGENT_LOOP=1`), \
over its socket or in memory"""


def _agent_calls_others(doc: Doc) -> str:
    """The workers of a full bench/agent_calls.py run that :func:`_agent_calls_workers` does not describe: all but
    capture off, the pairs the targets quote, and the in-memory calls served on the proxy's thread."""
    described = {"capture off", "proxy thread, in memory, served on its thread"}
    described.update(name for _, thread, loop in AGENT_CALLS_PAIRS for name in (thread, loop))
    others = [name for name in doc.get("workers") or {} if name not in described]
    if not others:
        return ""
    named = ", ".join(f'"{name}"' for name in others)
    return f"; and {named} (what each does: the docstring of `bench/agent_calls.py`)"


def _agent_calls_aa(doc: Doc) -> str:
    """What the run's "left at 5 ms" worker says of the method, when it ran beside the default: the sample agent's
    calls are all handed over in memory, which never lower the switch interval, so the two run the same code."""
    default, left = "proxy thread, in memory", "proxy thread, in memory, GIL switch interval left at 5 ms"
    rows = [row for level in doc.get("levels", []) for row in level["rows"]]
    ticks = [row.get("short_switch_interval_percent") for row in rows if row["system"] == default]
    if not ticks or any(share != 0 for share in ticks) or not any(row["system"] == left for row in rows):
        return ""  # the default lowered the interval in that run (or no tick recorded it): not the same code
    return """

The sample agent's calls all reach the proxy in memory, which never lowers the switch interval (the ticks column
says so): "GIL switch interval left at 5 ms" runs the same code as "proxy thread, in memory", the default. The gap
between those two rows at each level is the method's own spread (an A/A pair), and no difference smaller than it is
shown by this run."""


def _agent_calls_derived(doc: Doc) -> dict[str, Any]:
    collector = doc.get("settings", {}).get("collector")
    in_memory = any("in memory" in name for name in doc.get("workers") or {})
    on_its_thread = "proxy thread, in memory, served on its thread" in (doc.get("workers") or {})
    chosen = doc.get("settings", {}).get("workers")
    levels = " and ".join(str(level["in_flight"]) for level in doc.get("levels", []))
    subject = (
        "the GIL switch interval as the default sets it, always at 1 ms, or left at 5 ms"
        if chosen and any("switch interval" in name for name in chosen)
        else "calls handed over in memory, served on the agents' loop or on the proxy's thread"
    )
    return {
        "title_text": f"the proxy thread with the collector's thresholds at {collector}" if collector else
        f"{subject}, at {levels} in flight"
        if chosen
        else
        "the proxy on a thread of its own or on the agents' loop",
        "workers_text": "capture off and " + ", ".join(f'"{name}"' for name in chosen) + " (what each does: the "
        "docstring of `bench/agent_calls.py`)" if chosen else _agent_calls_workers(in_memory, on_its_thread)
        + _agent_calls_others(doc),
        "aa_text": _agent_calls_aa(doc),
        "cpu_text": " Added CPU per call is a capture setting's worker CPU per rollout less capture off's, over its"
        " calls per rollout." if in_memory else "",
        "collector_text": f""" One more worker takes its turn: the proxy thread in processes whose garbage
collector's thresholds are set to {collector} (young, middle, old) as the first rollout starts, against the
worker's (5000, 10, 10): young collections smaller and more frequent, the middle generation collected as often in
time as before.""" if collector else "",
    }


AGENT_CALLS = Spec(
    title="LLM calls as the agents see them in a worker: {title_text}",
    about="""Where the capturing proxy runs, in a worker: sample-agent rollouts (the `openai` client, 1-2 calls of
0.1-0.5 s to the demo's simulated LLM) on 2 stock worker processes, each call timed by the agent's own HTTP client
(request sent to answer read) less the generation time the simulated LLM reports: what the path to the LLM costs
the agent, its own client and event loop included. At each number of rollouts in flight, {settings[rounds]} rounds,
the workers taking turns (order reversed every round, {settings[window]:g} s measured each): {workers_text}. Added
latency is a capture setting's p50 or p99 less capture off's in the same round; the summary gives medians over the
rounds.{cpu_text}{collector_text}""",
    derive=_agent_calls_derived,
    tables=[
        Table(_per_level("summary"), [
            ("in_flight", "in flight"), ("system", "worker"), ("rollouts_per_s", "rollouts/s", ",.1f"),
            ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
            ("cpu_over_off", "CPU over capture off's", x),
            ("added_cpu_ms_per_call", "added CPU ms per call", "+.2f"),
            ("call_p50_ms", "call p50 ms", ".1f"), ("call_p99_ms", "call p99 ms", ".1f"),
            ("added_p50_ms", "added p50 ms", "+.1f"), ("added_p99_ms", "added p99 ms", "+.1f"),
            ("young_p50_ms", "young collection p50 ms", ".1f"),
            Col("agents' loop lag ms (mean)", "loop_lag_mean_ms", ".1f", optional=True),
            Col("ticks at a short switch interval, %", "short_switch_interval_percent", ".1f", optional=True),
        ]),
        Table(_per_level("rows"), [
            ("in_flight", "in flight"), ("round", "round"), ("system", "worker"), ("rollouts", "rollouts"),
            ("failed", "failed"), ("rollouts_per_s", "rollouts/s", ",.1f"),
            ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"), ("calls", "calls"),
            ("added_cpu_ms_per_call", "added CPU ms per call", "+.2f"),
            ("call_p50_ms", "call p50 ms", ".1f"), ("call_p99_ms", "call p99 ms", ".1f"),
            ("added_p50_ms", "added p50 ms", "+.1f"), ("added_p99_ms", "added p99 ms", "+.1f"),
            Col("collections (young, middle, full)", lambda r, d: ", ".join(map(str, r["collections"]))),
            ("young_longest_ms", "longest young ms", ".1f"),
            Col("agents' loop lag ms (mean)", "loop_lag_mean_ms", ".1f", optional=True),
            Col("ticks at a short switch interval, %", "short_switch_interval_percent", ".1f", optional=True),
            ("other_processes_cpu_cores", "other processes, cores", ".2f"),
        ], caption="Per round:"),
    ],
    after="""How to read it: the call's time includes the agent's own event loop, which serves every rollout of its
process. With few rollouts in flight (16: the workers about a fifth busy) the loop is idle when an answer comes, and
what the proxy adds shows. With more, the loop is the latency: at 64 in flight capture off's p99 moved between rounds
by more than any proxy adds, and at 256 the workers are CPU-bound and calls wait over a hundred milliseconds in their
own loop with capture off; there the added latency is mostly the CPU that capture adds to a saturated loop, and a
negative median says the rounds' spread is larger than the difference. CPU per rollout and rollouts/s compare at
every level. Collections (young, middle, full) are those of the window, summed over the 2 processes; each stops
every thread of its process.{aa_text}""",
)


CALL_RATE = Spec(
    title="CPU per LLM call by call rate, and the same Python work between sleeps",
    about="""The same work costs a thread more CPU when it runs in short bursts between waits than back to back:
each burst starts on a thread the kernel has just woken, with caches its last wait left cold. A forwarder's CPU per
call therefore depends on how often calls come, and the proxy's CPU target is measured at about 500 calls a second
(256 in flight, 0.5 s each), where its thread wakes about every millisecond.

First a captured call's record made by the proxy's own functions (`codec.loads` reads a chat request and an
answer, `tokens.read_response` fills a `CapturedCall`, `spans.attributes` builds the span's attributes, written with
`codec.dumps`), run back to back and then with a sleep after each run; what the sleeps cost
the thread with no work between them is measured apart and taken off. Then {forwarder_count} forwarders, each in a
process of its own, taking turns against the demo's simulated LLM at {settings[concurrency]} calls in flight, one mean
backend latency per row (a call rate each, the last as fast as the 2 cores carry): the capture proxy (a worker's
`CaptureProxy`), its HTTP server and client with nothing captured (`rollq_http`), {raw_and}bare asyncio protocols with
no HTTP library (`raw`, bench/proxy_floor.py's; not a usable proxy){native_about}. CPU per call is the forwarder
process's user + system time (psutil) over its turns{native_cpu}.""",
    tables=[
        Table("work_between_sleeps", [
            ("gap_ms", "sleep after each run, ms", "g"), ("runs", "runs", ","), ("cpu_us_per_run", "CPU us per run"),
            ("cpu_us_sleep_alone", "of it the sleep alone"), ("cpu_us_work", "the work"),
            ("work_over_back_to_back", "the work, over back to back", ".2f"),
        ], caption="The same work, back to back and between sleeps (medians of 5, the sleeps alone measured right "
                   "after each):"),
        Table(lambda d: [{**r, "native_over_capture": ratio(pick(r, "native.cpu_ms_per_call"),
                                                             r["capture"]["cpu_ms_per_call"])}
                         for r in d["rates"]], [
            ("latency_s", "mean latency s", "g"), ("capture.calls_per_s", "calls/s", ",.0f"),
            ("capture.cpu_ms_per_call", "capture CPU ms/call", ".3f"),
            ("rollq_http.cpu_ms_per_call", "rollq_http", ".3f"), ("raw.cpu_ms_per_call", "raw", ".3f"),
            ("native.cpu_ms_per_call", "native", ".3f"), ("native.binary_cpu_ms_per_call", "of it the binary", ".3f"),
            ("capture_over_raw", "capture / raw", ".2f"), ("native_over_capture", "native / capture", ".2f"),
            ("capture.over_fastest_rate", "capture over its fastest-rate CPU", ".2f"),
            ("raw.over_fastest_rate", "raw over its fastest-rate CPU", ".2f"),
        ], caption="Forwarders by call rate (calls/s: the capture proxy's):"),
    ],
    derive=lambda d: _call_rate_native(d),
    after="""Read within a row: every forwarder, the one with no HTTP library included, costs several times more per
call at a hundred calls a second than when calls come as fast as it takes them, and the capture proxy stays a
roughly constant multiple of the raw forwarder until the cores run out. So the part of the proxy's CPU per call
that rollq's code decides is that multiple; the rest is what waking a Python thread costs on this machine. At the
target's rate (0.5 s) the raw forwarder, which parses no HTTP and records nothing, takes most of the 0.2 ms asked,
leaving a few hundredths of a millisecond for reading HTTP and recording the call.{native_after}""",
)


def _call_rate_native(doc: Doc) -> dict[str, str]:
    """The text a bench/call_rate.py section gives the native forwarder, when the run measured it."""
    if not _native_rates(doc):
        return {"forwarder_count": "three", "raw_and": "and ", "native_about": "", "native_cpu": "",
                "native_after": ""}
    return {
        "forwarder_count": "four",
        "raw_and": "",
        "native_about": ", and a compiled forwarder (`native`: bench/native_forwarder, hyper on one thread outside "
                        "Python, built from Debian's packaged crates) that hands each call's request and answer to "
                        "its Python process every 20 ms, where the call is recorded as the capture proxy records it "
                        "(request and answer read into a `CapturedCall`, its span); not a usable proxy either: no "
                        "streaming, weight-sync gate, retries or request rewriting",
        "native_cpu": ", the native forwarder's binary included (also given apart)",
        "native_after": _native_after(doc),
    }


def _native_rates(doc: Doc) -> list[Doc]:
    """bench/call_rate.py's rows that measured the native forwarder (runs from 2026-12-04 22:00 UTC on)."""
    return [r for r in doc.get("rates") or [] if "native" in r]


def _native_after(doc: Doc) -> str:
    """What the native forwarder's rows say, at the target's rate (0.5 s) and when calls come fastest."""
    rows = {r["latency_s"]: r for r in _native_rates(doc)}
    if 0.5 not in rows:
        return ""
    at, fastest = rows[0.5], max(rows.values(), key=lambda r: r["capture"]["calls_per_s"])
    slowest = min(rows.values(), key=lambda r: r["capture"]["calls_per_s"])
    slow = slowest["native"]["cpu_ms_per_call"]
    native, binary = at["native"]["cpu_ms_per_call"], at["native"]["binary_cpu_ms_per_call"]
    return (
        f"\n\nThe compiled forwarder measures what is left to gain by taking the proxy's per-call path out of "
        f"Python: at the target's rate it took {native:.3f} ms a call, "
        f"{binary:.3f} ms in its binary (HTTP read and written, both ways, outside Python) and {native - binary:.3f} "
        f"ms in Python recording the calls it was handed, {native / at['capture']['cpu_ms_per_call']:.2f}x the "
        f"capture proxy's CPU; as fast as the cores carry, {fastest['native']['cpu_ms_per_call']:.3f} ms. Its binary "
        f"alone costs about what the raw Python forwarder does ({at['raw']['cpu_ms_per_call']:.3f} ms): what a "
        f"call costs there is the kernel's (its socket reads and writes and the wake-ups between them), not the "
        f"language's. "
        f"What it saves is the Python that ran on every wake-up: its Python process wakes 50 times a second "
        f"however many calls come, and records what it was handed back to back, about "
        f"{at['native']['calls_per_s'] / 50:.0f} calls a wake at the target's rate. At the slowest rate, "
        f"{slowest['native']['calls_per_s'] / 50:.0f} calls a wake, that saving is gone: {slow:.3f} ms a call, "
        f"{slow - slowest['native']['binary_cpu_ms_per_call']:.3f} of it in Python (the capture proxy: "
        f"{slowest['capture']['cpu_ms_per_call']:.3f})."
    )


HANDOFFS = Spec(
    title="Thread hand-offs: their cost on this machine, and how many a no-op rollout makes",
    about="""A round trip between two Python threads (a `queue.SimpleQueue` ping-pong, median of 5 runs of 20,000)
took {round_trip_us} us. Then one rollq worker (concurrency 16, the no-op agent) and one RQ `SimpleWorker` on a private
redis-server, taking turns: per round, {settings[jobs]:,} no-op jobs enqueued at once and waited for, the worker
process's CPU and its context switches summed over all its threads (voluntary: a thread blocked and was woken
again; the others: the kernel put a ready thread aside; which a wake-up counts as depends on the race for the 2
cores). A rollq worker passes each rollout between threads (RQ's loop, the start batcher, the agents' loop, the
finish batcher), where RQ's SimpleWorker runs a job on its one thread. The hypervisor took {steal_percent}% of
the machine's CPU time during the run (steal, `/proc/stat`): compare the two workers within it.""",
    tables=[Table("workers", [
        ("label", "worker"), ("jobs_per_s", "jobs/s", ",.1f"), ("worker_cpu_ms_per_job", "CPU ms/job", ".3f"),
        ("switches_per_job", "context switches/job", ".2f"), ("voluntary_per_job", "of them voluntary", ".2f"),
        ("commands_per_job", "Redis commands/job", ".1f"),
        Col("per round: jobs/s", "rounds", lambda rs: ", ".join(f"{r['jobs_per_s']:,.1f}" for r in rs)),
    ])],
)

def _trace_cols(key: str, header: str, fmt: str) -> list[Col | tuple[str, ...]]:
    """One figure of bench/rollout_trace.py's summary: its median with every trace, with failed ones only, and the
    per-round ratios."""
    return [
        (f"all_{key}", f"{header}, all", fmt),
        (f"failed_{key}", f"{header}, failed", fmt),
        Col("failed / all, per round", lambda row, doc: ratios(row[f"ratio_{key}"])),
    ]


ROLLOUT_TRACE = Spec(
    title="A rollout's trace: every trace published (the default) beside `ROLLQ_ROLLOUT_TRACE=failed`",
    about="""A worker publishes each rollout with its trace (its OpenTelemetry spans as JSON) unless
`ROLLQ_ROLLOUT_TRACE` says otherwise; with `failed`, a succeeded rollout goes out with `trace` null and the same
triplets and rewards. Two agents on 2 worker processes each, one private redis-server: the benchmark's mock agent
(`mock`, {settings[mock_in_flight]} in flight: three sleeps in LLM-call spans it makes itself, no LLM called) and
the demo's sample agent (`sample`, {settings[sample_in_flight]} in flight: 1-2 `openai` calls to the simulated
LLM through the worker's capturing proxy, whose spans repeat each call's messages, token ids and logprobs). Per
agent and round the two settings take turns (the first alternates), {settings[window]:g} s measured each. Bytes
per rollout: the rollout JSON of the row's last 200 results-stream entries. Redis memory per rollout: `used_memory`'s
growth over the row over the rollouts it finished (stream entry, summary, task record and RQ's finished job; the
stream is not trimmed within a run).""",
    tables=[
        Table("summary", [
            ("agent", "agent"), ("rounds", "rounds"),
            *_trace_cols("rollout_bytes", "bytes/rollout", ",.0f"),
            *_trace_cols("redis_bytes_per_rollout", "Redis memory/rollout", ",.0f"),
            *_trace_cols("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
            *_trace_cols("redis_cpu_ms_per_rollout", "Redis CPU ms/rollout", ".3f"),
        ], caption="Medians of the rounds:"),
        Table("rows", [
            ("round", "round"), ("agent", "agent"), ("trace", "ROLLQ_ROLLOUT_TRACE"), ("rollouts", "rollouts"),
            ("failed", "failed"), ("rollouts_per_s", "rollouts/s", ",.1f"),
            ("worker_cpu_ms_per_rollout", "worker CPU ms/rollout", ".2f"),
            ("redis_cpu_ms_per_rollout", "Redis CPU ms/rollout", ".3f"),
            ("rollout_bytes", "bytes/rollout", ",.0f"), ("redis_bytes_per_rollout", "Redis memory/rollout", ",.0f"),
        ], caption="Per row:"),
    ],
    after="""The worker's CPU does not move: the trace is still built from the spans, because triplets and
rewards are read from it, and only its JSON is left out of what is published. What moves is what every rollout
costs downstream: the results stream's bytes (the 1 GiB `results_max_bytes` budget holds that many more
rollouts), the bytes a trainer reads (a reader process is bound by bytes, docs/scaling.md), and Redis's memory
for as long as the stream keeps the rollout.""",
)

SPECS: dict[str, Spec] = {
    "al": AL, "noop": NOOP, "mock_llm": MOCK, "before_after": BEFORE_AFTER, "profile": PROFILE, "big": BIG,
    "inflight10k": K10, "scaling": SCALING, "cluster": CLUSTER, "failover": FAILOVER, "soak": SOAK,
    "capture": CAPTURE, "enqueue": ENQUEUE, "memory": MEMORY, "startup": STARTUP, "sample_clients": SAMPLE_CLIENTS,
    "switch_interval": SWITCH_INTERVAL,
    "gc_freeze": GC_FREEZE,
    "agent_calls": AGENT_CALLS,
    "handoffs": HANDOFFS, "call_rate": CALL_RATE, "answer_read": ANSWER_READ,
    "rollout_trace": ROLLOUT_TRACE,
}
# The page's order; results files not named here follow in name order.
ORDER = ["al_own_path", "al", "al_packs", "noop", "handoffs", "mock_llm", "startup", "fleet_startup", "before_after",
         "before_after_packs", "before_after_stop32", "before_after_fd9d057", "before_after_damaged_keys",
         "before_after_damaged_keys_packs", "profile", "profile_packs",
         "worker_floor", "rollout_cpu", "rollout_cpu_before_after", "rollout_trace", "big", "results_stream",
         "inflight10k", "scaling",
         "cluster",
         "cluster_256", "cluster_dead_host", "failover", "failover_repeated", "soak", "capture", "capture_native",
         "capture_load_elsewhere",
         "capture_same_code", "capture_no_record", "capture_record_after", "capture_msgspec", "capture_long_prompts",
         "agent_calls",
         "agent_calls_collector",
         "agent_calls_placement",
         "agent_calls_busy",
         "agent_calls_switch",
         "agent_calls_switch_256",
         "call_rate", "answer_read", "answer_read_typed_chunks", "switch_interval", "gc_freeze", "sample_clients",
         "sample_clients_socket", "enqueue", "memory", "idle", "idle_8", "idle_1",
         "connections",
         "plan_rate", "plan_rate_16", "plan_rate_16_default", "plan_rate_16_tuned", "trainer_api", "embedded_drain"]


def spec_for(doc: Doc) -> Spec | None:
    """The spec of the script that wrote the file (cluster_256.json was written by bench/cluster/)."""
    script = re.search(r"bench[/.](\w+)", doc.get("command", ""))
    return SPECS.get(script.group(1) if script else doc["benchmark"])


# ------------------------------------------------------------------------------------------------ the targets


def _packs_of(doc: Doc) -> int:
    """rollq's tasks per RQ job in a run (packs, docs/rq.md; 1: one job a task)."""
    return int((doc.get("settings") or {}).get("tasks_per_job") or 1)


Measure = tuple[str, bool]


def _with_packs(default: Measure | None, packs: Measure | None, k: int) -> Measure | None:
    """A target measured at the default (one task per RQ job) and with packs of ``k``: both values, met when
    either is (the status says which: packs are opt-in)."""
    if packs is None:
        return default
    value = (f"{default[0]}; " if default else "") + f"packs of {k}: {packs[0]}"
    met = bool(default and default[1]) or packs[1]
    return value, met


def _packs_note(measured: Measure | None, default: Measure | None) -> str:
    """The status cell's note when only the packs figure meets a target."""
    return " (packs)" if measured and measured[1] and not (default and default[1]) else ""


def _al_mean(doc: Doc | None, system: str, key: str) -> float | None:
    """rollq's or AL's mean ``key`` at 1000 mock rollouts in flight in an al.py run."""
    rows = _al_rows(doc, system=system, scenario="mock", in_flight=1000) if doc else []
    return mean([r.get(key) for r in rows])


def _al_runs(docs: dict[str, Doc], packs: bool) -> list[Doc]:
    """al.py runs on AL's own RL path (else any), rollq with packs or without; the newest last."""
    runs = [d for d in docs.values() if spec_for(d) is AL and (_packs_of(d) > 1) == packs]
    runs.sort(key=lambda d: (_own_path(d), d["date"]))
    return runs


def _noop_vs_al_of(doc: Doc) -> Measure | None:
    c = next((c for c in _al_comparison(doc) if c["scenario"] == "noop"), None)
    if c is None:
        return None
    note = "" if _own_path(doc) else ", AL without `resources_id`"
    load = (doc.get("load_average") or {}).get("before")
    value = (
        f"{x(c['rollq_over_al'])} ({c['rollq_rollouts_per_s']:,.0f} vs {c['al_rollouts_per_s']:,.0f}/s{note}; "
        f"per round {ratios(c['per_round'])}" + (f"; load {load[0]:g}" if load else "") + ")"
    )
    return value, c["rollq_over_al"] >= 3.0 and _median([r for r in c["per_round"] if r]) >= 3.0 and _own_path(doc)


def _newest(docs: dict[str, Doc], packs: bool, measure: Callable[[Doc], Measure | None]) -> tuple[Measure | None, int]:
    """``measure`` of the newest al.py run (with packs or not) that has it, and that run's tasks per job."""
    for doc in reversed(_al_runs(docs, packs)):
        measured = measure(doc)
        if measured is not None:
            return measured, _packs_of(doc)
    return None, 1


def _al_target(measure: Callable[[Doc], Measure | None]) -> Callable[[dict[str, Doc]], Any]:
    def target(docs: dict[str, Doc]) -> tuple[str, bool, str] | None:
        default, _ = _newest(docs, False, measure)
        packs, k = _newest(docs, True, measure)
        both = _with_packs(default, packs, k)
        return None if both is None else (*both, _packs_note(both, default))
    return target


def _with_mock_llm(key: str, text: str) -> Callable[[Callable[[dict[str, Doc]], Any]], Callable[[dict[str, Doc]], Any]]:
    """A 1000-in-flight target (from the AL run), with bench/mock_llm.py's rollq row at 1000 in flight beside it
    (``key``, written with ``text``) and both runs' machine speed: the two measure the same setting, and one sitting's
    machine ran plain Python at different speeds from one benchmark to the next. The AL run's figure decides."""
    def wrap(target: Callable[[dict[str, Doc]], Any]) -> Callable[[dict[str, Doc]], Any]:
        def measure(docs: dict[str, Doc]) -> Any:
            measured = target(docs)
            mock, al = docs.get("mock_llm") or {}, docs.get("al") or {}
            row = next((r for r in mock.get("rows", []) if r["system"] == "rollq" and r["in_flight"] == 1000), None)
            if measured is None or row is None:
                return measured
            sitting = "the same sitting" if mock.get("commit") == al.get("commit") else "another run"
            speeds = [(d.get("machine") or {}).get("python_loop_ms") for d in (mock, al)]
            speed = (f" (a machine at {speeds[0]:g} ms for a million-step loop, the AL run's at {speeds[1]:g})"
                     if None not in speeds else "")
            value = f"{measured[0]}; rollq alone (bench/mock_llm.py) in {sitting}: {text.format(row[key])}{speed}"
            return (value, *measured[1:])
        return measure
    return wrap


def _cpu_1000(doc: Doc) -> Measure | None:
    cpu = _al_mean(doc, "rollq", "worker_cpu_ms_per_rollout")
    return None if cpu is None else (f"{cpu:.2f} ms", cpu <= 0.4)


def _worker_floor(docs: dict[str, Doc]) -> tuple[float | None, float | None, float | None, float | None]:
    """bench/worker_floor.py's medians, ms per rollout: the sleeps alone, with the SDK's spans, rollq, rollq in
    packs of 16 (None where the run has no such row)."""
    floor = (docs.get("worker_floor") or {}).get("worker_cpu_ms_per_rollout") or {}
    rows = ("floor, no-spans", "floor, bare", "rollq, 1 task(s) per job", "rollq, 16 task(s) per job")
    bare, spans, rollq, packs = (floor.get(row, {}).get("median") for row in rows)
    return bare, spans, rollq, packs


def _same_rate(docs: dict[str, Doc]) -> Doc | None:
    """bench/call_rate.py's row at the capture run's mean backend latency (its call rate), if both ran."""
    latency = docs.get("capture", {}).get("settings", {}).get("latency")
    return next((r for r in (docs.get("call_rate") or {}).get("rates") or [] if r["latency_s"] == latency), None)


def _with_floor(target: Callable[[dict[str, Doc]], Any]) -> Callable[[dict[str, Doc]], Any]:
    """The worker-CPU target, with what the same agent costs with no rollq at all (bench/worker_floor.py), and
    rollq in that same run: machines differ by 2-4x, so the floor is read beside the rollq figure measured with it."""
    def measure(docs: dict[str, Doc]) -> Any:
        measured = target(docs)
        bare, spans, rollq, packs = _worker_floor(docs)
        if measured is None or bare is None or spans is None:
            return measured
        value = f"{measured[0]}; the floor, no rollq: {bare:.2f} ms sleeps alone, {spans:.2f} ms with the SDK's spans"
        if rollq is not None:
            value += f", and in the same run rollq {rollq:.2f} ms"
            value += ("" if packs is None else f" (packs of 16: {packs:.2f})") + _speed(docs["worker_floor"])
        return (value, *measured[1:])
    return measure


def _speed(doc: Doc) -> str:
    """`` (a machine at N ms for a million-step loop)`` when the results file recorded it, else nothing."""
    loop = (doc.get("machine") or {}).get("python_loop_ms")
    return "" if loop is None else f" (a machine at {loop:g} ms for a million-step loop)"


def _with_call_rate(target: Callable[[dict[str, Doc]], Any]) -> Callable[[dict[str, Doc]], Any]:
    """The proxy-CPU target, with what a raw forwarder (no HTTP library) costs at the same call rate, and the proxy
    when calls come as fast as it takes them (bench/call_rate.py): the machine's part of the figure."""
    def measure(docs: dict[str, Doc]) -> Any:
        measured = target(docs)
        same = _same_rate(docs)
        if measured is None or same is None:
            return measured
        fastest = max(docs["call_rate"]["rates"], key=lambda r: r["capture"]["calls_per_s"])
        value = (
            f"{measured[0]}{_speed(docs['capture'])}; at the same call rate in another run: "
            f"{same['capture']['cpu_ms_per_call']:.2f} ms, "
            f"rollq's HTTP server and client alone (nothing captured) {same['rollq_http']['cpu_ms_per_call']:.2f} ms, "
            f"a raw forwarder with no HTTP library {same['raw']['cpu_ms_per_call']:.2f} ms"
            f"{_speed(docs['call_rate'])}; at "
            f"{fastest['capture']['calls_per_s']:,.0f} calls/s: {fastest['capture']['cpu_ms_per_call']:.2f} ms "
            f"([by call rate](#cpu-per-llm-call-by-call-rate-and-the-same-python-work-between-sleeps))"
        )
        return (value, *measured[1:])
    return measure


def _added_latency(key: str, limit: float) -> Callable[[dict[str, Doc]], Any]:
    """A proxy-latency target from bench/capture.py's run, with the same figure per round where the run kept it.

    A p99 over one round's calls moves a lot from round to round (and the pooled one can meet a limit that most
    rounds miss, when the direct path had the bad round), so the target counts as met only when the pooled figure
    and the median of the rounds' both meet it."""
    def measure(docs: dict[str, Doc]) -> Any:
        if "capture" not in docs:
            return None
        doc = docs["capture"]
        rounds = [r[key] for r in doc.get("rounds", []) if key in r]
        if not rounds:
            return f"{doc[key]:+.1f} ms", doc[key] <= limit
        middle = statistics.median(rounds)
        per_round = ", ".join(f"{v:+.1f}" for v in rounds)
        value = f"{doc[key]:+.1f} ms (per round {per_round}; median {middle:+.1f}){_speed(doc)}"
        raw = [r[f"{key}_raw"] for r in doc.get("rounds", []) if f"{key}_raw" in r]
        if raw:
            value += (f"; a raw forwarder (no HTTP library, nothing captured) in the same run: {doc[f'{key}_raw']:+.1f}"
                      f" ms (median of rounds {statistics.median(raw):+.1f})")
            if f"{key}_rollq_http" in doc:
                value += f", the proxy's HTTP alone (nothing captured) {doc[f'{key}_rollq_http']:+.1f} ms"
        return value, max(doc[key], middle) <= limit
    return measure


def _with_load_elsewhere(key: str, target: Callable[[dict[str, Doc]], Any]) -> Callable[[dict[str, Doc]], Any]:
    """A proxy-latency target, with the same measure when the agents' load runs in another process
    (bench/capture.py --load-elsewhere: what a proxy process of its own would add; not how the proxy runs now)."""
    def measure(docs: dict[str, Doc]) -> Any:
        measured = target(docs)
        elsewhere = (docs.get("capture_load_elsewhere") or {}).get(key)
        if measured is None or elsewhere is None:
            return measured
        value = f"{measured[0]}; with the agents' load in another process instead (a proxy process of its own): " \
                f"{elsewhere:+.1f} ms"
        return (value, *measured[1:])
    return measure


AGENT_CALLS_ANCHOR = (
    "#llm-calls-as-the-agents-see-them-in-a-worker-the-proxy-on-a-thread-of-its-own-or-on-the-agents-loop"
)


AGENT_CALLS_PAIRS = (
    ("in memory", "proxy thread, in memory", "proxy on the agents' loop, in memory"),
    ("over the socket", "proxy thread, socket", "proxy on the agents' loop, socket"),
    ("", "proxy thread", "proxy on the agents' loop"),  # runs from before calls were handed over in memory
)
"""The workers of bench/agent_calls.py a target quotes, as (how the calls reached the proxy, its thread, the agents'
loop)."""


def _agent_calls_parts(docs: dict[str, Doc], key: str, fmt: str, unit: str) -> list[str]:
    """bench/agent_calls.py's medians of ``key`` for each pair of workers it ran, at each level in flight."""
    levels = (docs.get("agent_calls") or {}).get("levels") or []
    parts = []
    for how, thread_name, loop_name in AGENT_CALLS_PAIRS:
        cells = []
        for level in levels:
            by = {row["system"]: row.get(key) for row in level["summary"]}
            thread, loop = by.get(thread_name), by.get(loop_name)
            if thread is not None and loop is not None:
                cells.append(f"{level['in_flight']} in flight {thread:{fmt}} / {loop:{fmt}} {unit}")
        if cells:
            parts.append((f"{how}: " if how else "") + "; ".join(cells))
    return parts


def _in_memory_meets(docs: dict[str, Doc], key: str, bound: float) -> bool:
    """Whether both in-memory workers of bench/agent_calls.py meet ``bound`` at every level in flight it ran."""
    levels = (docs.get("agent_calls") or {}).get("levels") or []
    _, thread_name, loop_name = AGENT_CALLS_PAIRS[0]
    values = [row.get(key) for level in levels for row in level["summary"] if row["system"] in (thread_name, loop_name)]
    return bool(values) and all(v is not None and v <= bound for v in values)


def _with_agent_calls(
    key: str, target: Callable[[dict[str, Doc]], Any], bound: float, fmt: str = "+.1f", unit: str = "ms"
) -> Callable[[dict[str, Doc]], Any]:
    """A proxy target, with what the agents in a worker saw (bench/agent_calls.py: each call timed by the agent's
    own client, the proxy's thread and the agents' loop against capture off, medians of the rounds). Met "(in
    memory)" when only the calls handed to the proxy in memory meet ``bound``, at every level in flight."""
    def measure(docs: dict[str, Doc]) -> Any:
        measured = target(docs)
        parts = _agent_calls_parts(docs, key, fmt, unit)
        if measured is None or not parts:
            return measured
        value = f"{measured[0]}; in a worker, as its agents' clients saw it ([proxy thread / on the agents' loop]" \
                f"({AGENT_CALLS_ANCHOR}), medians of rounds), {' | '.join(parts)}"
        if not measured[1] and _in_memory_meets(docs, key, bound):
            return value, True, " (in memory)"
        return (value, *measured[1:])
    return measure


NATIVE_ANCHOR = (
    "#llm-calls-through-the-capturing-proxy-vs-straight-to-the-backend-beside-a-compiled-forwarder-that-records-in-"
    "python-in-batches-bench-only"
)


def _with_native_cpu(target: Callable[[dict[str, Doc]], Any]) -> Callable[[dict[str, Doc]], Any]:
    """The proxy-CPU target, with what the compiled forwarder of the benchmarks (bench/native_forwarder: outside
    Python, its calls recorded in Python in batches) took at the same call rate (bench/call_rate.py): the lever, not
    what rollq ships, so it never decides "met"."""
    def measure(docs: dict[str, Doc]) -> Any:
        measured, same = target(docs), _same_rate(docs)
        if measured is None or same is None or "native" not in same:
            return measured
        native = same["native"]
        value = (f"{measured[0]}; a compiled forwarder recording in Python in batches (bench only, not shipped) "
                 f"at the same rate: {native['cpu_ms_per_call']:.2f} ms, its binary "
                 f"{native['binary_cpu_ms_per_call']:.2f} ms of it")
        return (value, *measured[1:])
    return measure


def _with_native_latency(key: str, target: Callable[[dict[str, Doc]], Any]) -> Callable[[dict[str, Doc]], Any]:
    """A proxy-latency target (``key``: bench/capture.py's ``added_p50_ms``/``added_p99_ms``), with what the compiled
    forwarder added in bench/capture.py --native's run, beside the capture proxy in the same rounds; never decides
    "met" (see :func:`_with_native_cpu`)."""
    def measure(docs: dict[str, Doc]) -> Any:
        measured, doc = target(docs), docs.get("capture_native") or {}
        if measured is None or f"{key}_native" not in doc:
            return measured
        rounds = [r[f"{key}_native"] for r in doc.get("rounds", []) if f"{key}_native" in r]
        value = (f"{measured[0]}; a compiled forwarder recording in Python in batches ([bench only, not shipped]"
                 f"({NATIVE_ANCHOR})), beside agents holding its Python process's GIL half the time: "
                 f"{doc[f'{key}_native']:+.1f} ms (median of rounds {statistics.median(rounds):+.1f}), "
                 f"the capture proxy in the same rounds {doc[key]:+.1f} ms")
        return (value, *measured[1:])
    return measure


def _ideal_1000(doc: Doc) -> Measure | None:
    pct, al = _al_mean(doc, "rollq", "percent_of_ideal"), _al_mean(doc, "agentlightning", "percent_of_ideal")
    return None if pct is None else (f"{pct:.1f}% (AL 0.1.2: {cell(al, '.1f')}%)", pct >= 95)


NOOP_PACKS = re.compile(r"rollq, concurrency 16, packs of (\d+)$")


def _noop_target(measure: Callable[[Doc], Measure | None]) -> Callable[[dict[str, Doc]], Any]:
    """A no-op target at concurrency 16: rollq's default row and its packs row, when the run has one."""
    def target(docs: dict[str, Doc]) -> tuple[str, bool, str] | None:
        if "noop" not in docs:
            return None
        rows = {r["label"]: r for r in docs["noop"]["end_to_end"]}
        floor = rows.get("a minimal Redis queue, batched (BLMPOP 16, pipelined XADD)")
        default = measure({"row": rows.get("rollq, concurrency 16"), "floor": floor})
        packed = next(((r, int(m.group(1))) for label, r in rows.items() if (m := NOOP_PACKS.match(label))), None)
        packs = measure({"row": packed[0], "floor": floor}) if packed else None
        both = _with_packs(default, packs, packed[1] if packed else 1)
        return None if both is None else (*both, _packs_note(both, default))
    return target


def _commands_16(rows: Doc) -> Measure | None:
    row = rows["row"]
    return None if row is None else (f"{row['commands_per_job']:.1f}", row["commands_per_job"] <= 15)


def _vs_minimal_queue(rows: Doc) -> Measure | None:
    row, floor = rows["row"], rows["floor"]
    if floor is None or row is None or "percent_of_minimal_queue" not in row:
        return None
    pct = row["percent_of_minimal_queue"]
    return f"{pct:.1f}% ({row['jobs_per_s']:,.0f} vs {floor['jobs_per_s']:,.0f}/s, concurrency 16)", pct >= 10


def _startup(docs: dict[str, Doc]) -> tuple[str, bool] | None:
    # The tree measured, not the --base commit it was measured beside.
    rows = [r for r in docs["startup"]["rows"] if r["label"].startswith("rollq") and "(at " not in r["label"]]
    if not rows:
        return None
    r = rows[0]
    per_round = _median(r["vs_rq_per_round"])
    value = f"{x(r['vs_rq'])} (median of per-round ratios {x(per_round)}; {r['median_seconds']:.2f} s)"
    return value, max(r["vs_rq"], per_round) <= 2.0


def _fleet(docs: dict[str, Doc]) -> tuple[str, bool] | None:
    doc = docs["fleet_startup"]
    rq, rollq = doc["rows"]
    value = (f"{x(doc['rollq_vs_rq_all_claimed'])} ({doc['processes']} processes: {rollq['all claimed, s (median)']} "
             f"vs {rq['all claimed, s (median)']} s; CPU per process {rollq['CPU s per process']} vs "
             f"{rq['CPU s per process']} s)")
    return value, doc["rollq_vs_rq_all_claimed"] <= 2.0


def _big(docs: dict[str, Doc]) -> tuple[str, bool]:
    """Every size measured: the target holds only if it holds at each."""
    rows, ahead = docs["big"]["rows"], (docs["big"].get("settings") or {}).get("ahead") or 0
    value = ("" if not ahead else f"feeder at most {ahead} tasks ahead of the trainer: ") + ", ".join(
        f"{r['rollq_over_orjson']:.2f}x at {r['mb_per_rollout']:.2f} MB "
        f"(per round {ratios(r['rollq_over_orjson_per_round'])})"
        for r in rows
    )
    return value, all(r["rollq_over_orjson"] >= 1.0 for r in rows)


def _field(name: str, key: str, text: str, ok: Callable[[float], bool]) -> Callable[[dict[str, Doc]], Any]:
    """The measure ``docs[name][key]``, written with the template ``text``."""
    return lambda docs: (text.format(docs[name][key]), ok(docs[name][key])) if name in docs else None


# (target, asked, its measure over the results: (value, met) or None when nothing measures it)
# measure: (value, met) or (value, met, note); None when nothing measures it
TARGETS: list[tuple[str, str, Callable[[dict[str, Doc]], tuple[Any, ...] | None]]] = [
    ("worker CPU per rollout, 1000 in flight, mock agent", "<= 0.4 ms",
     _with_floor(_with_mock_llm("worker_cpu_ms_per_rollout", "{:.2f} ms")(_al_target(_cpu_1000)))),
    ("capturing proxy CPU per LLM call", "<= 0.2 ms",
     _with_agent_calls("added_cpu_ms_per_call", _with_native_cpu(_with_call_rate(
         _field("capture", "proxy_cpu_ms_per_call", "{:.2f} ms", lambda v: v <= 0.2))), 0.2, fmt="+.2f")),
    ("proxy's added latency at 256 calls in flight, p50", "<= +1 ms",
     _with_agent_calls("added_p50_ms", _with_native_latency("added_p50_ms", _with_load_elsewhere(
         "added_p50_ms", _added_latency("added_p50_ms", 1))), 1)),
    ("proxy's added latency at 256 calls in flight, p99", "<= +5 ms",
     _with_agent_calls("added_p99_ms", _with_native_latency("added_p99_ms", _with_load_elsewhere(
         "added_p99_ms", _added_latency("added_p99_ms", 5))), 5)),
    ("no-op rollouts vs Agent Lightning 0.1.2 on its own RL path", ">= 3x", _al_target(_noop_vs_al_of)),
    ("no-op rollouts vs a minimal Redis queue on the same box", ">= 10%", _noop_target(_vs_minimal_queue)),
    ("Redis commands per no-op rollout, concurrency 16", "<= 15", _noop_target(_commands_16)),
    ("1000 in flight, % of the ideal rate", ">= 95%",
     _with_mock_llm("percent_of_ideal", "{:.1f}%")(_al_target(_ideal_1000))),
    ("10,000 in flight, % of the simulation", ">= 95%",
     _field("inflight10k", "percent_of_simulation", "{:.1f}%", lambda v: v >= 95)),
    ("10,000 in flight, worker memory per in-flight rollout", "<= 30 KB",
     _field("inflight10k", "worker_kb_per_in_flight", "{:.1f} KB", lambda v: v <= 30)),
    ("big token-id rollouts vs a raw pipe using orjson", ">= 1.0x", lambda docs: _big(docs) if "big" in docs else None),
    ("worker start-up, exec to first claim", "<= 2x plain RQ",
     lambda docs: _startup(docs) if "startup" in docs else None),
    ("a fleet of worker processes started at once, until all have claimed", "<= 2x plain RQ",
     lambda docs: _fleet(docs) if "fleet_startup" in docs else None),
]


def targets_section(docs: dict[str, Doc]) -> str:
    rows = []
    for name, asked, measure in TARGETS:
        measured = measure(docs)
        value, ok, note = (*measured, "")[:3] if measured else ("not measured", None, "")
        rows.append([name, asked, value, "" if ok is None else ("met" + note if ok else "**missed**")])
    headers = ["target", "asked", "measured", ""]
    table = Table(fixed(rows), [Col(h, nth(i)) for i, h in enumerate(headers)])
    return (
        "## Targets\n\nEach checked against the figure of the section below that measures it (\"not measured\": "
        "no benchmark here measures it yet). The figures come from different runs: see each section's date, "
        "commit and load. Where a run also measured packs (`tasks_per_job`, several tasks per RQ job: opt-in, "
        "see [rq.md](rq.md#packs-several-tasks-per-rq-job-tasks_per_job) for what they cost), both figures "
        "are shown, and \"met (packs)\" says that only the packs figure meets the target. \"Met (in memory)\" says "
        "that only the calls handed to the capturing proxy in memory (async `openai` / httpx clients in a worker, "
        "the default; [workers.md](workers.md#what-a-rollout-holds-capture-triplets-rewards), \"Calls handed to the "
        "proxy in memory\") meet it, at every load "
        "measured: other clients reach the proxy over its socket, where the other figures hold. The proxy's added "
        "latency counts as met only when the run's pooled figure and the median of its rounds' both meet it: one "
        "round's p99 can be several times another's.\n\n"
        + render_table(table, {}) + "\n\n" + _floors_note(docs) + MACHINES_NOTE
    )


def _latency_floors(doc: Doc) -> str:
    """The added-latency item of :func:`_floors_note`, from a bench/capture.py --floor run."""
    text = (
        f"- **Added latency** (`bench/capture.py --floor`: beside agents holding the GIL half the time): a raw "
        f"forwarder in the same rounds added {doc['added_p50_ms_raw']:+.1f} ms at p50 and "
        f"{doc['added_p99_ms_raw']:+.1f} ms at p99"
    )
    http = "added_p50_ms_rollq_http" in doc
    if http:
        text += (f", the proxy's HTTP server and client with nothing captured {doc['added_p50_ms_rollq_http']:+.1f} "
                 f"and {doc['added_p99_ms_rollq_http']:+.1f} ms")
    text += f", the capture proxy {doc['added_p50_ms']:+.1f} and {doc['added_p99_ms']:+.1f} ms. "
    if doc["added_p50_ms_raw"] >= 1.0:
        text += "The p50 asked (+1 ms) is at or below what a forwarder in Python adds here before it reads any HTTP; "
    if doc["added_p99_ms_raw"] <= 5.0:
        text += "the p99 asked (+5 ms) is above that floor: a proxy as lean as the raw forwarder would meet it"
        if http and doc["added_p99_ms_rollq_http"] <= 5.0:
            text += ", and one with the proxy's HTTP but less to capture per call would too"
        elif http:
            text += ", but the proxy's HTTP alone already misses it"
        text += "."
    return text


def _native_item(docs: dict[str, Doc]) -> str:
    """The floors note's item on the compiled forwarder of the benchmarks (bench/call_rate.py and bench/capture.py
    --native), when they measured it: the lever for the proxy's three targets, and what shipping it would take."""
    same, doc = _same_rate(docs), docs.get("capture_native") or {}
    if same is None or "native" not in same or "added_p50_ms_native" not in doc:
        return ""
    native, capture = same["native"], same["capture"]
    cpu, p50, p99 = native["cpu_ms_per_call"], doc["added_p50_ms_native"], doc["added_p99_ms_native"]
    meets = cpu <= 0.2 and p50 <= 1 and p99 <= 5
    return (
        f"- **The proxy's per-call path out of Python, measured** (bench only: `bench/native_forwarder`, hyper on one "
        f"thread, built from Debian's packaged crates): a compiled forwarder that hands each call's request and "
        f"answer to its Python process every 20 ms, where the call is recorded as the capture proxy records it (its "
        f"`CapturedCall` and span), took {cpu:.2f} ms of CPU per call at {capture['calls_per_s']:,.0f} calls/s "
        f"({native['binary_cpu_ms_per_call']:.2f} ms in the binary, {cpu - native['binary_cpu_ms_per_call']:.2f} ms "
        f"recording in Python) where the capture proxy took {capture['cpu_ms_per_call']:.2f} ms; beside agents "
        f"holding its Python process's GIL half the time it added {p50:+.1f} ms at p50 and {p99:+.1f} ms at p99 "
        f"([its section]({NATIVE_ANCHOR}); the capture proxy {doc['added_p50_ms']:+.1f} and "
        f"{doc['added_p99_ms']:+.1f} ms in the same rounds). "
        + ("It meets all three of the proxy's targets on this machine. " if meets else
           "It does not meet all three of the proxy's targets on this machine either. ")
        + "It is not a proxy rollq can ship as it stands: it has none of the capture proxy's streaming, weight-sync "
        "gate, per-mode sampling, retries and upstream routing, and no attempt tokens. Shipping the design means a "
        "second language and toolchain in rollq's install (wheels per platform, or cargo at install time), the "
        "proxy's rules for a call kept in Rust as well as Python (the gate's pause most of all: no call may reach a "
        "backend while weights change), and a rollout's end waiting for its calls' records, which reach Python up "
        "to 20 ms after the answer."
    )


_THREAD_ROLES = {
    "rollq-finish": "the finishing thread (each rollout's trace, triplets and JSON built from its spans, and "
    "published)",
    "rollq-agent-loop": "the agents' loop (the agent, its spans, the executor)",
    "rollq-start": "the starting thread (claims and RQ's start of each job)",
    "MainThread": "RQ's main loop (dequeueing jobs)",
}


def _threads_note(doc: Doc | None) -> str:
    """Where a worker's CPU per rollout goes, thread by thread, from a profile run that measured it."""
    if doc is None or not doc.get("cpu_ms_per_rollout_by_thread"):
        return ""
    threads = doc["cpu_ms_per_rollout_by_thread"]
    parts = [f"{_THREAD_ROLES[name]} {ms:.2f} ms" for name, ms in threads.items() if name in _THREAD_ROLES]
    total = doc["worker_cpu_ms_per_rollout"]
    return f" Where it goes, thread by thread (`{doc['command']}`, a run of its own: {total:.2f} ms per rollout): " + (
        "; ".join(parts) + "."
    )


def _floors_note(docs: dict[str, Doc]) -> str:
    """The missed targets beside their floors, each measured in the same run as the rollq figure it is read with:
    what no implementation in Python reaches here, and what is left above it."""
    items = []
    bare, spans, rollq, packs = _worker_floor(docs)
    if bare is not None and spans is not None and rollq is not None:
        items.append(
            f"- **Worker CPU per rollout** (<= 0.4 ms; `bench/worker_floor.py`): the mock agent with no rollq at all "
            f"takes {bare:.2f} ms with its sleeps alone and {spans:.2f} ms with its spans made by the OpenTelemetry "
            f"SDK (rollq makes the same spans for about half the SDK's CPU: `rollq/worker/lean_spans.py`); rollq took "
            f"{rollq:.2f} ms" + ("" if packs is None else f" (packs of 16: {packs:.2f} ms)") + " in the same run. "
            f"Within 0.4 ms, claiming, running, recording and publishing a rollout, its spans and RQ's records of it "
            f"included, would have to cost {max(0.0, 0.4 - bare):.2f} ms over the sleeps, where the SDK's spans alone "
            f"cost {spans - bare:.2f}." + _threads_note(docs.get("profile_packs"))
        )
    same = _same_rate(docs)
    if same is not None:
        capture, http, raw = (same[k]["cpu_ms_per_call"] for k in ("capture", "rollq_http", "raw"))
        items.append(
            f"- **Proxy CPU per call** (<= 0.2 ms; `bench/call_rate.py`, {same['capture']['calls_per_s']:,.0f} "
            f"calls/s): a raw forwarder with no HTTP library took {raw:.2f} ms, rollq's HTTP server and client with "
            f"nothing captured {http:.2f} ms, the capture proxy {capture:.2f} ms. Within 0.2 ms the capture (the "
            f"request and the answer read, the call's record and span) would have to cost "
            f"{max(0.0, 0.2 - http):.2f} ms instead of {capture - http:.2f}."
        )
    doc = docs.get("capture") or {}
    if "added_p50_ms_raw" in doc:
        items.append(_latency_floors(doc))
    native = _native_item(docs)
    if native:
        items.append(native)
    if not items:
        return ""
    note = (
        "**The missed targets beside their floors**, each floor measured in the same run as the rollq figure it "
        "is read with (the machine's speed moves both alike):\n\n" + "\n".join(items) + "\n\nWhat is left would "
        "take the proxy's per-call path out of Python (a compiled forwarder handing the raw request and answer to "
        "Python to record" + ("; measured above, not shipped" if native else "") + ") and agents' spans cheaper "
        "than the SDK's; neither is in rollq."
    )
    unrecorded = docs.get("capture_no_record") or {}
    if "proxy_cpu_ms_per_call_base" in unrecorded and "capture_record_after" in docs:
        saved = 1 - unrecorded["proxy_cpu_ms_per_call_base"] / unrecorded["proxy_cpu_ms_per_call"]
        note += (
            " Recording a whole answer right after writing it, rather than before, moved no figure by more than the "
            f"method's own spread, though without that record at all the proxy took {saved:.0%} less CPU per call "
            "(the capture sections below: an A/A run of the same code, the proxy beside one that records nothing of "
            "the answer, then that experiment); it was not kept."
        )
    return note + "\n\n"


MACHINES_NOTE = (
    "**Compare within a run, not across days.** Each session runs on a fresh machine of the same kind (2 cores), "
    "and they differ. The same minimal Redis queue, batched, ran 44,800 jobs/s on 2026-12-01, 12,900-18,900 jobs/s "
    "on 2026-12-02 from 05:20 UTC, 29,100-29,200 jobs/s on 2026-12-02 from 09:00 UTC and 25,100-26,400 jobs/s on "
    "2026-12-02 from 15:30 UTC; the mock-LLM setting's worker CPU at 1000 in flight was 2.43 ms per rollout at "
    "`eb07806` on the 05:20 machine where the same worker code (`4dac21d`) measured 1.41 ms the day before, and the "
    "1000-in-flight setting, CPU-bound, moves with it (AL 0.1.2 alike: 38.0%, 20.4%, then 27-32% of the ideal "
    "rate). The machine of 2026-12-02 from 20:00 UTC was slower still, and more so for rollq than for RQ: one round "
    "of `python bench/noop.py --rounds 1 --jobs 1000` gave the batched minimal queue 14,700 jobs/s (0.57x the 15:30 "
    "machine's), RQ's SimpleWorker 243/s (0.46x), rollq at concurrency 16 643/s (0.31x; 4.4% of the minimal queue) "
    "and with packs of 16 1,313/s (8.9%); `python bench/worker_floor.py --seconds 10 --rounds 1 --with-rollq "
    "--no-write` gave the floor 0.54 ms per rollout with the sleeps alone and 1.25 ms with the SDK's spans, rollq "
    "2.11 ms (packs of 16: 1.57 ms), and rollq's 1000 in flight reached 63% of the ideal rate (packs: 81%) where "
    "the floor with the SDK's spans reached 98.7%. Thread hand-offs explain none of that: on the same machine "
    "[bench/handoffs.py](#thread-hand-offs-their-cost-on-this-machine-and-how-many-a-no-op-rollout-makes) counted "
    "1.6-1.9 context switches per no-op rollout for a rollq worker, across all its threads, and 17-18.2 per job for "
    "RQ's SimpleWorker (it blocks on each of its Redis round trips). That machine's hypervisor took a fifth of its "
    "CPU time at moments (steal: 22.5% over one hand-offs run, 1.4% over the one shown below), which moved every "
    "figure from one minute to the next. What a change did is in the ratios measured side by side in one run "
    "(`--base`, before/after sections). Since 2026-12-03 each results file records how fast its machine ran plain "
    "Python (ms for a million-step loop, in its section's first line) and the versions of the libraries on the "
    "measured paths (`machine.packages`): the machine of 2026-12-03 from 10:30 UTC took 120-160 ms, and there "
    "`python bench/rollout_cpu.py` (no Redis, no SDK) gave 1.59 ms per rollout where its results file, from "
    "2026-12-01, has 0.54 ms. The headline run of 2026-12-04 (`bench/run_all.py` at `df2e55d`) missed two targets "
    "that the run of 2026-12-02 (at `fd9d057`) met: 1000 in flight reached 78.7% of the ideal rate (packs: 91.9%) "
    "against 95.9% (95.6%), and no-op rollouts 5.0% of the minimal queue's rate (packs: 8.9%) against 8.1% "
    "(13.8%), the minimal queue itself running 36,960 jobs/s against 25,773. The worker's code did not change there: "
    "in one run on that machine ([before and after `fd9d057`]"
    "(#cheaper-per-rollout-before-and-after-against-fd9d057)) its CPU per rollout at 1000 in flight was 0.96x "
    "and 1.01x of `fd9d057`'s per round and its Redis commands per rollout 1.00x. "
    "The machine did: the mock agent with no rollq at all took 0.80 ms of CPU per rollout with the SDK's spans "
    "where it took 0.45 ms on 2026-12-03, and at 1000 in flight the 2 workers are CPU-bound. "
    "`python bench/noop.py` re-run on 2026-12-05 (at `a38b91a`, a machine at 32 ms for the loop) gave the minimal "
    "queue 51,610 jobs/s and rollq 6.9% of it (packs: 10.8%), the rate the no-op section gives now; worker CPU per "
    "no-op rollout stayed 0.24x RQ's SimpleWorker's (0.25x in the headline run), at 0.28 ms where that run had 0.52. "
    "`bench/al.py` (and with `--tasks-per-job 16`) re-run that night, at `cbaf33d` on a quiet machine (load 0.25 to "
    "2.4), gave rollq's 1000 in flight 98.9% of the ideal rate (packs: 98.0%) at 1.01 ms of worker CPU per "
    "rollout (packs: 0.57 ms), where the headline run's AL runs, at load 12, gave 78.7% at 1.55 ms. It also "
    "found that harness holding Agent Lightning back: AL's server had kept only in-flight tasks queued, and an AL "
    "client that finds none sleeps 5 s, so AL's no-op rate ran 76-608 rollouts/s from one window to the next in "
    "the first runs that night; queued 4x deeper it ran 1,786-1,877/s, where the headline run had 807. rollq's "
    "no-op lead over AL is therefore 1.41x at the default (packs of 16: 3.56x), not the 2.01x (3.12x) of the "
    "headline run."
)


# fmt: on
# ------------------------------------------------------------------------------------------------------ the page


def load_all() -> dict[str, Doc]:
    docs = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    for name, doc in docs.items():
        doc.setdefault("benchmark", name)
    return docs


def header(docs: dict[str, Doc]) -> str:
    m = next(d["machine"] for d in docs.values() if "machine" in d)
    dates = sorted(d["date"][:10] for d in docs.values())
    return f"""# Benchmarks: rollq beside Agent Lightning and plain RQ

<!-- Generated by bench/report.py from bench/results/*.json; edit those, not this file. -->

Measured {dates[0]} to {dates[-1]} on {m["cores"]} cores ({m["cpu"]}), {m["memory_gb"]} GB RAM, {m["os"]};
Python {m["python"]}, redis-server {m["redis_server"]} on loopback (no persistence), RQ {m["rq"]}, redis-py
{m["redis_py"]}. Every benchmark starts its own redis-server on a free port; workers, Redis and the producer share
the same cores, and the machine was shared with other work while these ran: each section says when it was
measured, at which commit, and the load average before and after (files from before results recorded these say
so). Figures move by 10-30% between runs. Reproduce everything with `nice -n 10 python bench/run_all.py` (as root,
or with `--skip-cluster`), or one benchmark with the command in its section; the sizing guide built on these
figures is [scaling.md](scaling.md)."""


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, and no stray arguments
    docs = load_all()
    if not docs:
        sys.exit("no results in bench/results/: run python bench/run_all.py")
    order = [n for n in ORDER if n in docs] + sorted(set(docs) - set(ORDER))
    parts = [header(docs), targets_section(docs), *(render(docs[n], spec_for(docs[n])) for n in order)]
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text("\n\n".join(parts) + "\n")
    print(f"wrote {PAGE.relative_to(ROOT)}: {len(order)} sections")


if __name__ == "__main__":
    main()
