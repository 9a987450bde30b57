"""rollq beside Agent Lightning 0.1.2, interleaved in one run: no-op, mock LLM at 32/256/1000 in flight, big rollouts.

Run: python bench/al.py [--window 10] [--in-flight 32,256,1000] [--rounds 1] [--scenarios noop,mock,big]
     [--skip-al] [--al-without-resources-id] [--out al]

Agent Lightning is installed into its own venv, ``bench/.venv-al`` (made here on first use with
``pip install agentlightning==0.1.2`` under the pins of ``bench/al_constraints.txt``; it is never a dependency of
rollq), and runs there:
``bench/al_side.py`` starts AL's ``AgentLightningServer`` with the trainer's feeding and taking in
the same event loop, and 2 client processes, each running in-flight / 2 of AL's own ``AgentRunner``
loops over one ``AgentLightningClient``. rollq runs 2 ``rq worker -w rollq.worker.RolloutWorker``
processes at concurrency in-flight / 2 against a private redis-server, fed by a producer thread and
read by a trainer thread (``Producer.rollouts``, a consumer group) in this process.

Scenarios (same agents on both sides; bench/agents.py and bench/al_side.py):
- ``noop``: a reward at once, 16 in flight per worker process: each system's own cost per rollout;
- ``mock``: 3 turns x U(0.1, 0.5) s LLM calls with spans, at each in-flight level; the ideal rate
  (no cost at all) is in-flight / 0.9 s rollouts per second, and each row reports its % of that;
- ``big``: 8 triplets of 4096 prompt + 512 response token ids (~0.23 MB of JSON), 16 in flight per
  worker process.

Each setting: rollq's tasks kept queued at least in-flight deep and AL's 4x that, at least 256 (an AL client that
finds none sleeps 5 s; ``AL_DEPTH_TIMES``), a warm-up (4 s and at least
in-flight completions), then completions the trainer side received over ``--window`` seconds, with the
CPU of the worker processes and of the coordinator (redis-server; AL's server process) meanwhile.
Every rollout id received is checked for duplicates. Settings alternate rollq, AL, so drift hits both
alike. AL's tasks are queued with ``resources_id``, as AL's own RL path queues them (its runner then
caches the resources; ``--al-without-resources-id`` queues them without, and every AL rollout fetches the
latest resources over HTTP). Writes bench/results/<--out>.json (al.json by default).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from bench.common import (  # noqa: E402
    ROOT,
    Workers,
    free_port,
    private_redis,
    rate,
    rollq_workers,
    sum_over,
    write_result,
)
from bench.mock_llm import MEAN_ROLLOUT_SECONDS, Feeder, add_ideal  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.store.stats import outcome_stat  # noqa: E402

AL_VERSION = "0.1.2"
AL_VENV = ROOT / "bench" / ".venv-al"
AL_PYTHON = AL_VENV / "bin" / "python"
AL_SIDE = ROOT / "bench" / "al_side.py"
AL_CONSTRAINTS = ROOT / "bench" / "al_constraints.txt"
"""The venv's packages, pinned (pip freeze of a fresh venv): AL's HTTP stack moved its no-op rate 3x between two venvs
resolved afresh."""
WORKER_PROCESSES = 2
AL_DEPTH_TIMES, AL_DEPTH_MIN = 4, 256
"""Agent Lightning's server keeps at least this many times the in-flight count of tasks queued, and at least the
minimum: an AL client that finds no task sleeps its ``poll_interval`` (5 s) before asking again, where a rollq worker
blocks on the queue and wakes at the next task. Queued only in-flight deep, AL's no-op rate ran 76-608 rollouts/s
from one 8 s window to the next on 2026-12-05 (CPU per rollout unchanged): its feeder, on the server's busy event
loop, now and then let the queue run dry."""
WARMUP_SECONDS = 4.0
PER_WORKER_FAST = 16  # in flight per worker process for no-op and big rollouts
ROLLQ_AGENTS = {
    "noop": "bench.agents:NoopAgent",
    "mock": "bench.agents:MockLLMAgent",
    "big": "bench.agents:BigTokenAgent",
}


def ensure_al_venv() -> str:
    """bench/.venv-al with agentlightning==0.1.2 in it, its packages pinned by :data:`AL_CONSTRAINTS`; returns the
    installed version. A venv made under other pins (or none: before 2026-12-05) is made again."""
    pins = hashlib.sha256(AL_CONSTRAINTS.read_bytes()).hexdigest()
    stamp = AL_VENV / "rollq-constraints.sha256"
    if not stamp.exists() or stamp.read_text() != pins:
        print(f"creating {AL_VENV.relative_to(ROOT)} with agentlightning=={AL_VERSION}, pinned (once)", flush=True)
        shutil.rmtree(AL_VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(AL_VENV)], check=True)
        pip = [str(AL_PYTHON), "-m", "pip", "install", "-q", "-c", str(AL_CONSTRAINTS), f"agentlightning=={AL_VERSION}"]
        subprocess.run(pip, check=True)
        stamp.write_text(pins)
    probe = [str(AL_PYTHON), "-c", "import importlib.metadata as m; print(m.version('agentlightning'))"]
    return subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()


AL_STACK = ("agentlightning", "aiohttp", "fastapi", "starlette", "uvicorn", "h11", "httpx", "requests", "pydantic")
"""The packages on Agent Lightning's serving and client paths: their versions go with every results file (pinned by
:data:`AL_CONSTRAINTS` since 2026-12-05; before, the venv resolved them afresh on each machine, and a run on
2026-12-05 saw its no-op rate move 3x between two venvs)."""


def al_packages() -> dict[str, str]:
    """The versions of :data:`AL_STACK` in bench/.venv-al."""
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "found = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try: found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(found))"
    )
    out = subprocess.run([str(AL_PYTHON), "-c", probe, *AL_STACK], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


class Trainer(threading.Thread):
    """rollq's trainer side: reads finished rollouts as a consumer group member, counting and checking ids."""

    def __init__(self, producer: Producer) -> None:
        super().__init__(daemon=True, name="trainer")
        self.producer = producer
        self.received = 0
        self.duplicates = 0
        self.seen: set[str] = set()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():  # a reader ends after 0.5 s idle; read on until told to stop
                for rollout in self.producer.rollouts(idle_timeout=0.5):
                    if rollout.rollout_id in self.seen:
                        self.duplicates += 1
                    self.seen.add(rollout.rollout_id)
                    self.received += 1
                    if self.stop_event.is_set():
                        return
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


def steady_state(
    completions: Callable[[], int],
    workers: list[psutil.Process],
    coordinator: list[psutil.Process],
    in_flight: int,
    window: float,
    check: Callable[[], None],
    published: Callable[[], int] | None = None,
) -> dict[str, Any]:
    """Warm up, then count completions and CPU over ``window`` seconds.

    ``published``: rollouts the workers published so far. Where they publish faster than the trainer reads (a
    backlog grows on the results stream), CPU per rollout read overstates what a rollout costs them: the row then
    also gives the workers' CPU per rollout published."""
    started = time.monotonic()
    # Warm: slots filled once over (capped, so that 10,000 in flight does not take minutes to warm).
    while time.monotonic() - started < WARMUP_SECONDS or completions() < min(in_flight, 2000):
        check()
        if time.monotonic() - started > 120:
            raise RuntimeError(f"only {completions()} completions after 120 s of warm-up")
        time.sleep(0.2)

    def cpu(ps: list[psutil.Process]) -> float:
        return sum_over(ps, lambda p: sum(p.cpu_times()[:2]))

    me = psutil.Process()
    n0, w0, c0, m0, idle0, t0 = (
        completions(),
        cpu(workers),
        cpu(coordinator),
        cpu([me]),
        psutil.cpu_times().idle,
        time.monotonic(),
    )
    p0 = published() if published else 0
    time.sleep(window)
    check()
    p1 = published() if published else 0
    n1, w1, c1, m1, idle1, t1 = (
        completions(),
        cpu(workers),
        cpu(coordinator),
        cpu([me]),
        psutil.cpu_times().idle,
        time.monotonic(),
    )
    rss = sum_over(workers, lambda p: p.memory_info().rss)
    done, elapsed = n1 - n0, t1 - t0
    busy = psutil.cpu_count() - (idle1 - idle0) / elapsed
    ours = (w1 - w0 + c1 - c0 + m1 - m0) / elapsed
    row = {
        "rollouts": done,
        "seconds": round(elapsed, 2),
        "rollouts_per_s": rate(done, elapsed),
        "worker_cpu_ms_per_rollout": round(1000 * (w1 - w0) / max(done, 1), 3),
        "coordinator_cpu_ms_per_rollout": round(1000 * (c1 - c0) / max(done, 1), 3),
        "trainer_side_cpu_cores": round((m1 - m0) / elapsed, 2),
        # This process: rollq's producer and trainer threads (AL's trainer side runs in its server, the coordinator).
        "trainer_side_cpu_ms_per_rollout": round(1000 * (m1 - m0) / max(done, 1), 3),
        "worker_cpu_cores": round((w1 - w0) / elapsed, 2),
        "coordinator_cpu_cores": round((c1 - c0) / elapsed, 2),
        "worker_rss_mb": round(rss / 2**20, 1),
        "other_processes_cpu_cores": round(busy - ours, 2),
    }
    if published:
        row["published_per_s"] = rate(p1 - p0, elapsed)
        row["worker_cpu_ms_per_published"] = round(1000 * (w1 - w0) / max(p1 - p0, 1), 3)
    return row


def run_rollq(
    scenario: str,
    in_flight: int,
    window: float,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
    processes: int = WORKER_PROCESSES,
    tasks_per_job: int = 1,
    ahead: int = 0,
) -> dict[str, Any]:
    """``ahead``: queue no more than this many tasks ahead of what the trainer has read (0: keep ``in_flight`` queued
    whatever the trainer reads; see Feeder)."""
    if tasks_per_job > 1:  # packs (docs/rq.md): the producer's and the workers' setting
        extra_env = {**(extra_env or {}), "ROLLQ_TASKS_PER_JOB": str(tasks_per_job)}
    if scenario == "big":
        # Room for a backlog, as in bench/big.py: workers can publish big rollouts faster than the one trainer
        # thread parses them, and a backlog past the default 1 GiB would be trimmed unread (RolloutsTrimmedError).
        extra_env = {**(extra_env or {}), "ROLLQ_RESULTS_MAX_BYTES": str(4 * 1024**3)}
    with private_redis() as server:
        namespace = f"al-{scenario}-{in_flight}"
        producer = Producer.from_url(server.url, namespace, tasks_per_job=tasks_per_job)
        trainer = Trainer(Producer.from_url(server.url, namespace))
        feeder = Feeder(
            server.client(),
            f"rq:queue:{namespace}",
            in_flight,
            lambda n: producer.enqueue_many([{"question": i} for i in range(n)], mode="train"),
            ahead=(lambda: trainer.received, ahead) if ahead else None,
        )
        stats = server.client()
        workers = rollq_workers(
            server.url,
            namespace,
            processes,
            agent=ROLLQ_AGENTS[scenario],
            concurrency=max(1, in_flight // processes),
            log_dir=log_dir,
            extra_env=extra_env,
        )
        try:
            workers.wait_registered(server.client(), namespace)
            trainer.start()
            feeder.start()

            def check() -> None:
                workers.check_alive()
                for t in (feeder, trainer):
                    if t.error:
                        raise t.error

            row = steady_state(
                lambda: trainer.received,
                workers.ps,
                [psutil.Process(server.process.pid)],  # type: ignore[union-attr]
                in_flight,
                window,
                check,
                published=lambda: int(stats.hget(producer.keys.stats, outcome_stat("succeeded", "train")) or 0),
            )
        finally:
            feeder.stop()
            workers.stop(timeout=30)
            trainer.stop()
        row["duplicates"] = trainer.duplicates
    return row


def al_stats(endpoint: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{endpoint}/bench/stats", timeout=10) as reply:
        return dict(json.loads(reply.read()))


def run_al(
    scenario: str, in_flight: int, window: float, log_dir: Path, *, with_resources_id: bool = True
) -> dict[str, Any]:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    depth = max(AL_DEPTH_TIMES * in_flight, AL_DEPTH_MIN)
    command = [str(AL_PYTHON), str(AL_SIDE), "server", "--port", str(port), "--depth", str(depth)]
    if not with_resources_id:
        command.append("--latest-resources")
    server = Workers([command], env, log_dir)
    clients: Workers | None = None
    try:
        deadline = time.monotonic() + 60
        while True:
            server.check_alive()
            try:
                if al_stats(endpoint)["ready"]:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"AL server did not start; log: {server.logs[0]}")
            time.sleep(0.2)
        client = [
            str(AL_PYTHON),
            str(AL_SIDE),
            "client",
            "--endpoint",
            endpoint,
            "--concurrency",
            str(in_flight // WORKER_PROCESSES),
            "--scenario",
            scenario,
        ]
        clients = Workers([client] * WORKER_PROCESSES, env, log_dir)

        def check() -> None:
            server.check_alive()
            clients.check_alive()  # type: ignore[union-attr]

        row = steady_state(
            lambda: int(al_stats(endpoint)["completed"]), clients.ps, server.ps, in_flight, window, check
        )
        row["duplicates"] = int(al_stats(endpoint)["duplicates"])
    finally:
        if clients is not None:
            clients.stop(timeout=10)
        server.stop(timeout=10)
    return row


def settings_for(scenarios: list[str], levels: list[int]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for s in scenarios:
        if s == "mock":
            out += [("mock", n) for n in levels]
        else:
            out.append((s, PER_WORKER_FAST * WORKER_PROCESSES))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=10.0, help="seconds of steady state per setting")
    parser.add_argument("--in-flight", default="32,256,1000", help="mock-LLM in-flight levels, comma-separated")
    parser.add_argument("--scenarios", default="noop,mock,big")
    parser.add_argument("--rounds", type=int, default=1, help="times to run every setting (interleaved)")
    parser.add_argument("--skip-al", action="store_true", help="rollq only (no venv, no Agent Lightning)")
    parser.add_argument(
        "--al-without-resources-id",
        dest="al_resources_id",
        action="store_false",
        help="queue AL's tasks without resources_id (each rollout then fetches the latest resources)",
    )
    parser.add_argument("--out", default="al", help="results name: bench/results/<out>.json")
    parser.add_argument(
        "--tasks-per-job", type=int, default=1, help="rollq's tasks per RQ job (packs, docs/rq.md); 1: one job a task"
    )
    args = parser.parse_args()
    rollq_run = functools.partial(run_rollq, tasks_per_job=args.tasks_per_job)
    al = functools.partial(run_al, with_resources_id=args.al_resources_id)
    levels = [int(n) for n in args.in_flight.split(",")]
    al_version = None if args.skip_al else ensure_al_venv()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rollq-bench-al-") as logs:
        for round_ in range(args.rounds):
            for scenario, in_flight in settings_for(args.scenarios.split(","), levels):
                systems = [("rollq", rollq_run)] + ([] if args.skip_al else [("agentlightning", al)])
                if round_ % 2:
                    systems.reverse()
                for system, run in systems:
                    row: dict[str, Any] = {
                        "system": system,
                        "scenario": scenario,
                        "in_flight": in_flight,
                        "round": round_ + 1,
                    }
                    load_before = os.getloadavg()[0]  # this setting's own load, beside the run's in the file
                    row.update(run(scenario, in_flight, args.window, Path(logs)))
                    row["load_1m"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
                    if scenario == "mock":
                        add_ideal(row, in_flight)
                    print(
                        f"  {system:14s} {scenario:4s} {in_flight:5d} in flight: {row['rollouts_per_s']:7.1f}/s"
                        + (f" = {row['percent_of_ideal']:5.1f}% of ideal" if "percent_of_ideal" in row else "")
                        + f"; worker CPU {row['worker_cpu_ms_per_rollout']:.2f} ms/rollout, coordinator "
                        f"{row['coordinator_cpu_ms_per_rollout']:.2f} ms/rollout; dup {row['duplicates']}; "
                        f"other processes {row['other_processes_cpu_cores']:.2f} cores",
                        flush=True,
                    )
                    rows.append(row)
    comparison = []
    for scenario, in_flight in settings_for(args.scenarios.split(","), levels):
        mine = [r for r in rows if r["scenario"] == scenario and r["in_flight"] == in_flight]
        by = {s: [r["rollouts_per_s"] for r in mine if r["system"] == s] for s in ("rollq", "agentlightning")}
        if by["rollq"] and by["agentlightning"]:
            rq_rate = sum(by["rollq"]) / len(by["rollq"])
            al_rate = sum(by["agentlightning"]) / len(by["agentlightning"])
            comparison.append(
                {
                    "scenario": scenario,
                    "in_flight": in_flight,
                    "rollq_rollouts_per_s": round(rq_rate, 1),
                    "al_rollouts_per_s": round(al_rate, 1),
                    "rollq_over_al": round(rq_rate / al_rate, 2) if al_rate else None,
                }
            )
    write_result(
        args.out,
        {
            "agentlightning": al_version,
            "agentlightning_packages": None if args.skip_al else al_packages(),
            "worker_processes": WORKER_PROCESSES,
            "window_seconds": args.window,
            "warmup_seconds": WARMUP_SECONDS,
            "mean_rollout_seconds": MEAN_ROLLOUT_SECONDS,
            "rows": rows,
            "comparison": comparison,
        },
        sys.argv[1:],
        settings=vars(args),
    )


if __name__ == "__main__":
    main()
