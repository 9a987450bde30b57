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
+ system, from psutil, over the proxied rounds only). The percentiles are the
steady state's: each round starts its first ``--concurrency`` calls spread evenly over one mean latency (the
steady rate from the start), and those are reported apart, as ``with_opening_burst``. Until 2026-12-03 they were
sent at once: that burst queued on every path, and the calls after it stayed bunched for a few latencies (most of
a round's slowest "steady" proxied calls had started in its first 1.5 s of 2.5). Each round also keeps its own
added p50 and p99 and the share of the machine's CPU time the hypervisor took during each path's turn (steal,
``/proc/stat``). The proxy's process lets go of the calls' spans every second, as a worker's rollouts do
(:func:`_release_spans`): kept for the whole run, they made one round's added p99 +25 to +35 ms in every run.

Then the same at rollout level: sample-agent rollouts (the ``openai`` client
against the simulated LLM, 1-2 calls of 0.1-0.5 s each) at ``--concurrency`` in
flight on 2 stock worker processes, capture off and on in alternating rounds,
rollouts/s compared (``bench/mock_llm.py``'s measurement window).

Every proxy's process collects garbage as a worker process does (rollq.worker.collector's young-generation
threshold: at Python's default the proxy's thread spent about 0.1 ms a call collecting).

With ``--agent-load F`` a thread in each proxy's process runs Python for F of every 10 ms, as a worker's agents
do beside its proxy thread: the proxy then waits for the GIL as in a busy worker (its CPU is left out of the
proxy's CPU per call).

With ``--load-elsewhere`` that thread runs in a process of its own instead, for every path alike: what a proxy in a
process of its own (not sharing a GIL with the agents) would see beside busy agents. Results go to
``--out`` (``capture`` by default).

With ``--floor`` two more paths take their turn in every round, each in a process set up as the proxy's is (the
same agent load, collector and GIL switch interval): ``bench/proxy_floor.py``'s raw forwarder (bare asyncio
protocols, no HTTP library, nothing captured; not a usable proxy), the latency a forwarder in Python adds here at the
least, as ``added_p50_ms_raw``/``added_p99_ms_raw``; and its ``rollq_http`` forwarder (the capture proxy's own HTTP
server and client, nothing captured), as ``added_p50_ms_rollq_http``/``added_p99_ms_rollq_http``. Every call then
asks for token ids itself, on every path, so that all paths carry the same answers (the capture proxy asks for them
when the call does not).

With ``--native`` bench/proxy_floor.py's ``native`` forwarder takes its turn too, set up the same way: a compiled
forwarder (bench/native_forwarder: hyper, outside Python) that hands each call's request and answer to its Python
process every 20 ms, where they are recorded as the capture proxy records them (the call's record and span); its CPU
is both processes'. Not a usable proxy either (no streaming, gate, retries or request rewriting): it measures the
lever "the proxy's per-call path out of Python", as ``added_p50_ms_native``/``added_p99_ms_native``.

With ``--base COMMIT`` a second proxy, rollq as of that commit (a temporary ``git worktree``), takes its turn in
every round beside this tree's (their order swapped every round): before and after in one run, per round (the
base proxy is served by that commit's own ``bench/capture.py``: before 2026-12-03 09:00 UTC it kept every span). With
``--switch-interval S`` this tree's proxy sets the GIL switch interval to S instead of its own 1 ms
(``rollq/worker/capture/gil.py``); with ``--base HEAD`` too, the two intervals take turns in one run.
``--label TEXT`` names what the run compares in the report's title.

How far to trust a before/after: ``--base`` at the very code of this tree (an A/A run, results
``capture_same_code``) is what the method itself gives. Until 2026-12-03 18:30 UTC this tree's proxy's process
carried the agent load during every direct turn too, and the same code measured 7% more CPU per call there than as
the base, in all 10 rounds; the direct turns' load now moves between the proxies' processes. A/A runs after that
fix differed by up to 0.2 ms at p50, either side ahead, by several ms at p99 and by 2-3% in CPU per call: smaller
differences than those are not a change's.

    python bench/capture.py [--calls 4096] [--concurrency 256] [--rounds 4] [--latency 0.5]
                            [--rollout-rounds 2] [--window 20] [--agent-load 0.5] [--load-elsewhere]
                            [--floor] [--native] [--base COMMIT] [--switch-interval S] [--label TEXT] [--out capture]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import base_tree, commit_of, cpu_split, cpu_ticks, steal_percent, write_result  # noqa: E402

if TYPE_CHECKING:
    from rollq.worker.tracer import RolloutTrace


def serve_backend(latency: float) -> None:
    from rollq.ops.sim_llm import SimulatedLLM

    # Spread like real generations, so calls do not arrive at the proxy in lock-step bursts.
    with SimulatedLLM(latency=(0.5 * latency, 1.5 * latency)) as llm:
        print(llm.url, flush=True)
        sys.stdin.read()  # until the parent closes our stdin


RELEASE_SPANS_SECONDS = 1.0
"""How often the proxy's process lets go of the calls' spans recorded so far (:func:`_release_spans`)."""


def _release_spans(rollout: RolloutTrace, done: threading.Event, every: float = RELEASE_SPANS_SECONDS) -> None:
    """Every ``every`` seconds, let go of the calls' spans recorded so far, as a worker does when its rollouts end.

    The proxy here records every call into one rollout that lasts the whole run: kept, its thousands of spans made
    each garbage collection of the proxy's process longer than the last (a middle-generation collection of 33.6 ms
    in every run's third round, every call in flight waiting on it), which no worker sees: a worker's spans go with
    their rollout. Let go every second, the longest collection took 13.7 ms."""
    trace_id = rollout.root.get_span_context().trace_id
    processor = rollout._processor  # the bench's own reach into the tracer: nothing public drops an open trace's spans
    while not done.wait(every):
        processor.close(trace_id)
        processor.open(trace_id)


def serve_proxy(backend: str, switch_interval: float | None = None) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from rollq.models.contract import LLM
    from rollq.worker.capture import CaptureProxy
    from rollq.worker.tracer import OtelTracer

    tracer = OtelTracer(TracerProvider())
    proxy = (CaptureProxy(switch_interval=switch_interval) if switch_interval else CaptureProxy()).start()
    rollout = tracer.start_rollout("bench", 1)
    resources, _ = proxy.open_attempt(
        {"llm": LLM(endpoint=backend, model="sim")}, trace.set_span_in_context(rollout.root), tracer.capture_tracer()
    )
    llm = resources["llm"]
    assert isinstance(llm, LLM)
    print(llm.endpoint, flush=True)
    done = threading.Event()
    released = threading.Thread(target=_release_spans, args=(rollout, done), daemon=True)
    released.start()
    sys.stdin.read()
    done.set()
    released.join()
    print(len(rollout.finish()), file=sys.stderr)
    proxy.stop()


# Run in a proxy's process before its script (so a --base tree's script needs no knob for it): the garbage
# collector set as in a worker process (rollq.worker.collector: with Python's default young threshold of 700 the
# proxy's thread spent about 0.1 ms a call collecting, 0.02 ms at a worker's 5000), and, with agent load, a thread
# that runs Python for ``load`` of every 10 ms, as a worker's agents do beside its proxy thread, sharing its GIL.
# Its thread id goes to a file, so that its CPU is left out of the proxy's.
_SPIN = """
import time
def spin(load):
    while True:
        started = time.perf_counter()
        while time.perf_counter() - started < load * 0.01:
            sum(i * i for i in range(200))
        time.sleep(max(0.0, 0.01 - (time.perf_counter() - started)))
"""
_AGENT_LOAD = (
    _SPIN
    + """
import os, runpy, sys, threading
if os.environ.get("ROLLQ_BENCH_WORKER_GC"):
    from rollq.worker.collector import widen_young_generation
    widen_young_generation()
if os.environ.get("ROLLQ_BENCH_SWITCH_INTERVAL"):
    sys.setswitchinterval(float(os.environ["ROLLQ_BENCH_SWITCH_INTERVAL"]))
ready = threading.Event()
def agents(load):
    with open(os.environ["ROLLQ_BENCH_AGENT_TID"], "w") as f:
        f.write(str(threading.get_native_id()))
    ready.set()
    spin(load)
load = float(os.environ.get("ROLLQ_BENCH_AGENT_LOAD") or 0)
if load > 0:
    threading.Thread(target=agents, args=(load,), daemon=True, name="agents").start()
    ready.wait()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
)
# With --load-elsewhere: the same load in a process of its own, beside the proxy's rather than in it.
_LOAD_ELSEWHERE = (
    _SPIN
    + """
import sys
spin(float(sys.argv[1]))
"""
)


@dataclass
class Child:
    proc: subprocess.Popen[str]
    line: str
    agents_tid: int | None = None

    def only_one_loading(self, children: dict[str, Child]) -> None:
        """With agent load: this child's process runs, the other proxies' are stopped (one worker's agents load
        the machine at a time, whichever path is measured)."""
        for other in children.values():
            if other.agents_tid is not None:
                process = psutil.Process(other.proc.pid)
                process.resume() if other is self else process.suspend()

    def cpu_seconds(self) -> float:
        """The process's CPU (user + system) and its children's (the native forwarder's binary), less the
        agent-load thread's."""
        process = psutil.Process(self.proc.pid)
        used = sum(cpu_split(process))
        if self.agents_tid is not None:
            used -= sum(t.user_time + t.system_time for t in process.threads() if t.id == self.agents_tid)
        return used


def _child(*args: str, tree: Path | None = None, agent_load: float = 0.0) -> tuple[subprocess.Popen[str], str]:
    """This script (or ``tree``'s copy of it, with ``tree``'s rollq) in a process of its own; its first line."""
    child = _start(*args, tree=tree, agent_load=agent_load)
    return child.proc, child.line


def _start(
    *args: str,
    tree: Path | None = None,
    agent_load: float = 0.0,
    script: str = "capture.py",
    worker_gc: bool = True,
    switch_interval: float | None = None,
) -> Child:
    """``bench/<script>`` (of ``tree``, with its rollq) in a process of its own, set up as a worker process is (its
    garbage collector; ``agent_load``; the GIL ``switch_interval``, if given, for a script that sets none itself),
    and its first line."""
    root = tree or Path(__file__).resolve().parent.parent
    tid_file = Path(tempfile.mkstemp(prefix="rollq-bench-agents-")[1])
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "ROLLQ_BENCH_AGENT_LOAD": str(agent_load),
        "ROLLQ_BENCH_AGENT_TID": str(tid_file),
        "ROLLQ_BENCH_WORKER_GC": "1" if worker_gc else "",
        "ROLLQ_BENCH_SWITCH_INTERVAL": "" if switch_interval is None else str(switch_interval),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _AGENT_LOAD, str(root / "bench" / script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,  # "-c" puts the working directory first on sys.path: it must be the tree whose rollq is measured
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    tid = tid_file.read_text().strip() if agent_load > 0 else ""
    tid_file.unlink()
    return Child(proc, line, int(tid) if tid else None)


async def _round(
    session: aiohttp.ClientSession,
    base: str,
    calls: int,
    concurrency: int,
    prompt_chars: int = 0,
    token_ids: bool = False,
    ramp: float = 0.0,
) -> tuple[list[float], list[float]]:
    """``calls`` calls, ``concurrency`` in flight; the user message padded to ``prompt_chars`` (the simulated LLM
    answers with a token id per byte of the prompt); ``token_ids``: every call asks for them itself (so that a
    forwarder that does not add ``return_token_ids`` gets the answers the capture proxy gets).

    Returns every call's latency, and those of the calls in the steady state: all but the first ``concurrency``,
    which the round sends at once, or spread evenly over ``ramp`` seconds; each later call starts as an earlier one
    ends, with ``concurrency`` in flight. Sent at once, those calls are a burst no worker sends (its calls start as
    its agents reach them), and the calls that follow them stay bunched for a few backend latencies: in 2.5 s rounds
    at 256 in flight most of the slowest "steady" calls of a round had started in its first 1.5 s."""
    gate = asyncio.Semaphore(concurrency)
    content = "Compute 2 + 3."
    content += " and so on" * max(0, (prompt_chars - len(content)) // 10)
    body: dict[str, Any] = {"model": "sim", "messages": [{"role": "user", "content": content}], "temperature": 0.0}
    if token_ids:
        body["return_token_ids"] = True
    latencies: list[float] = []
    steady: list[float] = []
    started_calls = 0

    async def one(n: int) -> None:
        nonlocal started_calls
        async with gate:  # the first ``concurrency`` calls take the gate at once, in order, then wait their turn
            if ramp and n < concurrency:
                await asyncio.sleep(ramp * n / concurrency)
            opening = started_calls < concurrency
            started_calls += 1
            started = time.perf_counter()
            async with session.post(f"{base}/chat/completions", json=body) as response:
                data = await response.json()
                assert response.status == 200, data
            # The path's own time: the call's latency less the backend's (reported) generation time.
            latency = time.perf_counter() - started - float(response.headers["X-Sim-Seconds"])
            latencies.append(latency)
            if not opening:
                steady.append(latency)

    await asyncio.gather(*(one(n) for n in range(calls)))
    return latencies, steady


def _suffix(path: str) -> str:
    """The results' key suffix of a proxy path: ``""`` for ``proxy``, ``"_base"`` for ``proxy_base``, ``"_raw"``
    for ``raw``, ``"_rollq_http"`` for ``rollq_http``."""
    return "" if path == "proxy" else "_" + path.removeprefix("proxy_")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "calls": len(values),
        "p50_ms": round(_pct(values, 0.50) * 1000, 3),
        "p99_ms": round(_pct(values, 0.99) * 1000, 3),
        "mean_ms": round(statistics.fmean(values) * 1000, 3),
    }


async def measure(direct: str, proxies: dict[str, Child], args: argparse.Namespace) -> dict[str, Any]:
    """Rounds of ``direct`` then each proxy path (``proxy``; ``proxy_base`` with ``--base``; ``raw`` and
    ``rollq_http`` with ``--floor``; their order reversed every round); per path the latencies and the proxy
    process's CPU per call, per round too.

    Percentiles and added latency are the steady state's (``_round``); ``*_with_opening_burst`` counts every call,
    the rounds' opening ``concurrency`` calls (spread over one mean latency) included."""
    results: dict[str, list[float]] = {"direct": [], **{name: [] for name in proxies}}
    every: dict[str, list[float]] = {path: [] for path in results}
    cpu = dict.fromkeys(proxies, 0.0)
    rounds: list[dict[str, Any]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm every path's connections.
        await _round(session, direct, args.concurrency, args.concurrency, args.prompt_chars)
        for child in proxies.values():
            child.only_one_loading(proxies)
            await _round(session, child.line, args.concurrency, args.concurrency, args.prompt_chars)
        per_round = args.calls // args.rounds
        ramp = args.latency  # a round's first calls spread over one mean latency: the steady rate from the start
        for n in range(args.rounds):
            row: dict[str, Any] = {"round": n + 1}
            order = list(proxies)[:: -1 if n % 2 else 1]
            # The direct calls see one worker's agent load too: the process of the path that comes next, so that
            # over the rounds every proxy's process carries the load as long (one that carried it in every direct
            # turn measured 7% more CPU per call than the same proxy beside it; see --base).
            proxies[order[0]].only_one_loading(proxies)
            ticks = cpu_ticks()
            all_values, direct_values = await _round(
                session,
                direct,
                per_round,
                args.concurrency,
                args.prompt_chars,
                token_ids=args.floor or args.native,
                ramp=ramp,
            )
            row["direct_steal_percent"] = steal_percent(ticks, cpu_ticks())
            results["direct"] += direct_values
            every["direct"] += all_values
            direct_summary = _summary(direct_values)
            row["direct_p50_ms"], row["direct_p99_ms"] = direct_summary["p50_ms"], direct_summary["p99_ms"]
            for name in order:
                proxies[name].only_one_loading(proxies)
                before, ticks = proxies[name].cpu_seconds(), cpu_ticks()
                all_values, values = await _round(
                    session,
                    proxies[name].line,
                    per_round,
                    args.concurrency,
                    args.prompt_chars,
                    args.floor or args.native,
                    ramp=ramp,
                )
                used = proxies[name].cpu_seconds() - before
                row[f"{name}_steal_percent"] = steal_percent(ticks, cpu_ticks())
                results[name] += values
                every[name] += all_values
                cpu[name] += used
                row[f"{name}_cpu_ms_per_call"] = round(used * 1000 / len(all_values), 3)
                summary = _summary(values)
                row[f"{name}_p50_ms"], row[f"{name}_p99_ms"] = summary["p50_ms"], summary["p99_ms"]
                suffix = _suffix(name)
                for q in ("p50", "p99"):  # this round's added latency: a p99 moves more from round to round
                    row[f"added_{q}_ms{suffix}"] = round(summary[f"{q}_ms"] - direct_summary[f"{q}_ms"], 3)
            row["load_1min"] = round(os.getloadavg()[0], 1)
            if "proxy_base" in proxies:
                row["cpu_new_over_base"] = round(row["proxy_cpu_ms_per_call"] / row["proxy_base_cpu_ms_per_call"], 3)
            rounds.append(row)
    summary: dict[str, Any] = {path: _summary(values) for path, values in results.items()}
    for path, values in every.items():
        summary[path]["with_opening_burst"] = _summary(values)
    for name in proxies:
        suffix = _suffix(name)
        burst, direct_burst = summary[name]["with_opening_burst"], summary["direct"]["with_opening_burst"]
        for q in ("p50", "p99"):
            summary[f"added_{q}_ms{suffix}"] = round(summary[name][f"{q}_ms"] - summary["direct"][f"{q}_ms"], 3)
            summary[f"added_{q}_ms_with_opening_burst{suffix}"] = round(burst[f"{q}_ms"] - direct_burst[f"{q}_ms"], 3)
        summary[f"proxy_cpu_ms_per_call{suffix}"] = round(cpu[name] * 1000 / len(every[name]), 3)
    summary["rounds"] = rounds
    summary["opening_ramp_seconds"] = ramp
    summary["spans_released_every_seconds"] = RELEASE_SPANS_SECONDS
    return summary


def sample_rollouts(
    server: Any,
    llm_url: str,
    namespace: str,
    *,
    system: str,
    agent: str,
    in_flight: int,
    window: float,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Sample-agent rollouts (``agent``: the sample agent or a subclass) against ``llm_url`` at ``in_flight`` on 2
    worker processes, measured over ``window`` s (``bench/mock_llm.py``'s measurement): the row's rate and CPU."""
    from bench.mock_llm import run_rollq
    from rollq.worker.sample_agent import sample_inputs, sample_resources

    row = run_rollq(
        server,
        in_flight,
        window,
        log_dir,
        namespace=namespace,
        system=system,
        agent=agent,
        inputs=sample_inputs,
        resources=sample_resources(temperature=0.5, endpoint=llm_url),
        extra_env=extra_env,
        mean_rollout_seconds=None,  # as long as the simulated LLM's answers take: no ideal rate
    )
    kept = ("system", "rollouts", "failed", "seconds", "rollouts_per_s", "worker_cpu_ms_per_rollout")
    return {k: row[k] for k in (*kept, "other_processes_cpu_cores", "window_wall_time")}


def agents_taking_turns(
    agents: dict[str, str],
    *,
    rounds: int,
    window: float,
    in_flight: int,
    prefix: str,
    record_gc: bool = False,
    envs: dict[str, dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Sample-agent rollouts by each of ``agents`` (label: ``module:Class``) in turn on one redis-server and one
    simulated LLM, their order swapped every round: one :func:`sample_rollouts` row per agent and round, its worker
    processes started with ``envs[label]`` set, if given. With ``record_gc`` (the agents being
    :class:`bench.agents.GcRecordingSampleAgent` or subclasses), each row also has its worker processes' garbage
    collections, summed (``gc``), and those of its measurement window with the calls the agents timed, if they did
    (``in_window``, :func:`_window_events`)."""
    from bench.common import private_redis
    from rollq.ops.sim_llm import SimulatedLLM

    rows: list[dict[str, Any]] = []
    with private_redis() as server, SimulatedLLM(latency=(0.1, 0.5)) as llm:
        log_dir = Path(tempfile.mkdtemp(prefix=f"rollq-bench-{prefix}-"))
        for round_ in range(rounds):
            for n, (system, agent) in enumerate(list(agents.items())[:: -1 if round_ % 2 else 1]):
                namespace = f"{prefix}-{round_}-{n}"
                gc_dir = log_dir / f"gc-{namespace}"
                if record_gc:
                    gc_dir.mkdir()
                row = sample_rollouts(
                    server,
                    llm.url,
                    namespace,
                    system=system,
                    agent=agent,
                    in_flight=in_flight,
                    window=window,
                    log_dir=log_dir,
                    extra_env={
                        **((envs or {}).get(system) or {}),
                        **({"ROLLQ_BENCH_GC_DIR": str(gc_dir)} if record_gc else {}),
                    },
                )
                if record_gc:
                    row["gc"] = _gc_records(gc_dir)
                    row["in_window"] = _window_events(gc_dir, *row["window_wall_time"])
                rows.append({"round": round_ + 1, **row})
    return rows


def _gc_records(directory: Path) -> dict[str, Any]:
    """The worker processes' garbage-collection records (bench.agents._GcRecorder's files), summed per generation."""
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    cpu = sum(r["cpu_seconds"] for r in records)
    seconds = [sum(r["seconds"][g] for r in records) for g in range(3)]
    return {
        "processes": len(records),
        "collections": [sum(r["collections"][g] for r in records) for g in range(3)],
        "seconds": [round(s, 3) for s in seconds],
        "cpu_seconds": [round(sum(r["collector_cpu_seconds"][g] for r in records), 3) for g in range(3)],
        "longest_ms": [round(1000 * max((r["longest"][g] for r in records), default=0.0), 1) for g in range(3)],
        "share_of_cpu_percent": round(100 * sum(seconds) / cpu, 2) if cpu else None,
        "frozen": [r["frozen"] for r in records],
    }


def _window_events(directory: Path, started: float, ended: float) -> dict[str, Any]:
    """The collections and timed calls (bench.agents._GcRecorder's event lines) of every worker process that fell
    between ``started`` and ``ended`` (wall time): per generation the collections, per second, and their length at
    p50, p99 and longest; the calls' time at the client less the backend's at p50 and p99; how late the agents'
    loop's 100 ms ticks ran, on average (ms), and the share of those ticks that found the GIL switch interval
    below the interpreter's 5 ms (the capturing proxy's thread serving a call)."""
    pauses: list[list[float]] = [[], [], []]
    calls: list[float] = []
    lags: list[float] = []
    short_interval = 0
    processes = sorted(directory.glob("*.events"))
    for path in processes:
        for line in path.read_text().splitlines():
            kind, when, *rest = line.split()
            if not started <= float(when) <= ended:
                continue
            if kind == "gc":
                pauses[int(rest[0])].append(1000 * float(rest[1]))
            elif kind == "lag":
                lags.append(1000 * float(rest[0]))
                short_interval += float(rest[1]) < 0.005
            else:
                calls.append(1000 * float(rest[0]))
    seconds = ended - started
    process_seconds = seconds * max(1, len(processes))

    def ms(values: list[float], q: float) -> float | None:
        return round(_pct(values, q), 2) if values else None

    return {
        "collections": [len(p) for p in pauses],
        "collections_per_s": [round(len(p) / seconds, 2) for p in pauses],
        "collection_p50_ms": [ms(p, 0.5) for p in pauses],
        "collection_p99_ms": [ms(p, 0.99) for p in pauses],
        "collection_longest_ms": [round(max(p), 1) if p else None for p in pauses],
        "collector_share_of_wall_percent": round(100 * sum(map(sum, pauses)) / 1000 / process_seconds, 2),
        "calls": len(calls),
        "call_p50_ms": ms(calls, 0.5),
        "call_p99_ms": ms(calls, 0.99),
        "loop_lag_mean_ms": round(sum(lags) / len(lags), 2) if lags else None,
        "short_switch_interval_percent": round(100 * short_interval / len(lags), 1) if lags else None,
    }


def agents_taking_turns_main(
    benchmark: str,
    agents: dict[str, str],
    doc: str,
    *,
    rounds: int,
    window: float,
    record_gc: bool = False,
    envs: dict[str, dict[str, str]] | None = None,
) -> None:
    """A script's ``main`` that runs :func:`agents_taking_turns` with ``--rounds``, ``--window`` and ``--in-flight``
    (defaults ``rounds``, ``window``, 256) and writes the rows to bench/results/``benchmark``.json."""
    from bench.common import write_result

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=rounds, help=f"rounds (default {rounds})")
    parser.add_argument(
        "--window", type=float, default=window, help=f"seconds measured per agent and round (default {window:g})"
    )
    parser.add_argument("--in-flight", type=int, default=256, help="rollouts in flight, over 2 workers (default 256)")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in every worker process's environment (repeatable), e.g. ROLLQ_CAPTURE_IN_MEMORY=0",
    )
    parser.add_argument(
        "--out", default=benchmark, help=f"results name: bench/results/<out>.json (default {benchmark})"
    )
    args = parser.parse_args()
    common = dict(item.split("=", 1) for item in args.env)
    rows = agents_taking_turns(
        agents,
        rounds=args.rounds,
        window=args.window,
        in_flight=args.in_flight,
        prefix=benchmark.replace("_", "-"),
        record_gc=record_gc,
        envs={label: {**common, **((envs or {}).get(label) or {})} for label in agents},
    )
    argv = [f"--rounds={args.rounds}", f"--window={args.window}", f"--in-flight={args.in_flight}"]
    argv += [f"--env={item}" for item in args.env] + ([f"--out={args.out}"] if args.out != benchmark else [])
    path = write_result(args.out, {"rows": rows}, argv, settings=vars(args))
    print(f"wrote {path}")


def rollouts_on_and_off(args: argparse.Namespace) -> dict[str, Any]:
    """Sample-agent rollouts (the ``openai`` client against the simulated LLM), capture off vs on, interleaved."""
    from bench.common import private_redis
    from rollq.ops.sim_llm import SimulatedLLM

    rows: list[dict[str, Any]] = []
    with private_redis() as server, SimulatedLLM(latency=(0.1, 0.5)) as llm:
        log_dir = Path(tempfile.mkdtemp(prefix="rollq-bench-capture-"))
        for round_ in range(args.rollout_rounds):
            for capture in ("0", "1"):
                row = sample_rollouts(
                    server,
                    llm.url,
                    f"capture-{capture}-{round_}",
                    system=f"capture {'on' if capture == '1' else 'off'}",
                    agent="rollq.worker.sample_agent:SampleAgent",
                    in_flight=args.concurrency,
                    window=args.window,
                    log_dir=log_dir,
                    extra_env={"ROLLQ_CAPTURE_LLM": capture},
                )
                rows.append(row)
    on = sum(r["rollouts"] for r in rows if r["system"] == "capture on")
    on_s = sum(r["seconds"] for r in rows if r["system"] == "capture on")
    off = sum(r["rollouts"] for r in rows if r["system"] == "capture off")
    off_s = sum(r["seconds"] for r in rows if r["system"] == "capture off")
    return {"rows": rows, "on_vs_off_percent": round(100 * (on / on_s) / (off / off_s), 1) if off else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4096, help="calls per path (default 4096)")
    parser.add_argument("--concurrency", type=int, default=256, help="calls in flight (default 256)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4)")
    parser.add_argument("--latency", type=float, default=0.5, help="mean backend latency per call, s (default 0.5)")
    parser.add_argument(
        "--rollout-rounds", type=int, default=2, help="rounds of sample-agent rollouts, capture off then on (default 2)"
    )
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per rollout round (default 20)")
    parser.add_argument(
        "--agent-load",
        type=float,
        default=0.0,
        help="fraction of each 10 ms a thread in each proxy's process runs Python, as a worker's agents do (0-1)",
    )
    parser.add_argument(
        "--load-elsewhere",
        action="store_true",
        help="run the --agent-load thread in a process of its own, not in the proxy's (a proxy process of its own)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="a raw forwarder (no HTTP library) and the proxy's HTTP alone (nothing captured) take their turns too",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="bench/proxy_floor.py's native forwarder (hyper, outside Python; its calls recorded in Python in "
        "batches) takes its turn too",
    )
    parser.add_argument("--base", help="a commit whose proxy takes its turn in every round too (before/after)")
    parser.add_argument(
        "--prompt-chars",
        type=int,
        default=0,
        help="pad each call's user message to this many characters: the simulated LLM answers with as many prompt "
        "token ids (default 0: a 14-character message)",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        help="the GIL switch interval the proxy (not the --base one) sets while it runs, s (default: the proxy's own)",
    )
    parser.add_argument(
        "--label", help="what this run compares, for the report's title (say what the --base side is when not obvious)"
    )
    parser.add_argument("--out", default="capture", help="results name: bench/results/<out>.json")
    parser.add_argument("--serve", choices=("backend", "proxy"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.serve and args.calls // args.rounds <= args.concurrency:
        parser.error(
            "each round needs more calls than --concurrency: a round's first --concurrency calls are its "
            "opening calls, left out of the percentiles"
        )
    if args.serve == "backend":
        return serve_backend(args.latency)
    if args.serve == "proxy":
        return serve_proxy(args.backend, args.switch_interval)
    in_proxy = 0.0 if args.load_elsewhere else args.agent_load
    with base_tree(args.base) as tree:
        backend, direct = _child("--serve", "backend", "--latency", str(args.latency))
        children = [backend]
        loader = None
        if args.load_elsewhere and args.agent_load:
            loader = subprocess.Popen([sys.executable, "-c", _LOAD_ELSEWHERE, str(args.agent_load)])
        try:
            interval = [f"--switch-interval={args.switch_interval}"] if args.switch_interval else []
            proxies = {"proxy": _start("--serve", "proxy", "--backend", direct, *interval, agent_load=in_proxy)}
            children.append(proxies["proxy"].proc)
            if tree is not None:
                proxies["proxy_base"] = _start("--serve", "proxy", "--backend", direct, tree=tree, agent_load=in_proxy)
                children.append(proxies["proxy_base"].proc)
            from rollq.worker.capture.gil import SWITCH_INTERVAL_SECONDS

            forwarders = ("raw", "rollq_http") if args.floor else ()
            for forwarder in forwarders + (("native",) if args.native else ()):
                proxies[forwarder] = _start(
                    "--serve",
                    forwarder,
                    "--backend",
                    direct,
                    script="proxy_floor.py",
                    agent_load=in_proxy,
                    switch_interval=args.switch_interval or SWITCH_INTERVAL_SECONDS,
                )
                children.append(proxies[forwarder].proc)
            try:
                data = asyncio.run(measure(direct, proxies, args))
            finally:
                for child in proxies.values():
                    psutil.Process(child.proc.pid).resume()  # a stopped process would not read its stdin's end
        finally:
            if loader is not None:
                loader.kill()
                loader.wait(10)
            for proc in reversed(children):
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(10)
    if args.base:
        data["base_commit"] = commit_of(args.base)
    if args.label:
        data["label"] = args.label
    argv = [f"--calls={args.calls}", f"--concurrency={args.concurrency}", f"--rounds={args.rounds}"]
    argv += [f"--latency={args.latency}", f"--rollout-rounds={args.rollout_rounds}", f"--window={args.window}"]
    argv += [f"--agent-load={args.agent_load}"] if args.agent_load else []
    argv += ["--load-elsewhere"] if args.load_elsewhere else []
    argv += ["--floor"] if args.floor else []
    argv += ["--native"] if args.native else []
    argv += [f"--base={args.base}"] if args.base else []
    argv += [f"--switch-interval={args.switch_interval}"] if args.switch_interval else []
    argv += [f"--label={shlex.quote(args.label)}"] if args.label else []
    argv += [f"--out={args.out}"] if args.out != "capture" else []
    if args.rollout_rounds:
        data["rollouts"] = rollouts_on_and_off(args)
        print(json.dumps(data["rollouts"], indent=2))
    settings = {k: v for k, v in vars(args).items() if k not in ("serve", "backend", "base", "out", "label")}
    path = write_result(args.out, data, argv, settings=settings)
    print(json.dumps(data, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
