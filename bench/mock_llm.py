"""Mock LLM agents at 32, 256 and 1000 rollouts in flight: rollq (2 worker processes) beside plain RQ.

Run: python bench/mock_llm.py [--in-flight 32,256,1000] [--window 30] [--rq-max-processes 256]

Each rollout is 3 turns; a turn is an LLM call that sleeps 0.1-0.5 s (uniform,
so a rollout takes 0.9 s on average) traced as an LLM-call span, then a reward
span. The ideal rate is in-flight / 0.9 s.

- rollq: 2 ``RolloutWorker`` processes, each with concurrency in-flight / 2,
  running the async :class:`bench.agents.MockLLMAgent`;
- plain RQ: one job per process, so in-flight = processes: ``rq worker-pool``
  of SimpleWorkers (RQ's own way to fork many workers; forked children share
  pages, so the RSS sum counts shared memory again in every process; the USS
  sum is what they take on their own) running the sync twin
  :func:`bench.rq_jobs.mock_llm`, at most ``--rq-max-processes`` of them.

The producer keeps at least in-flight tasks queued so the workers never run
dry. After a warm-up (5 s and at least in-flight completions), completions are
counted over ``--window`` seconds, with the CPU (user + system) the worker
processes and redis-server used meanwhile, and four times a second how many
rollouts were running (rollq's in-flight set; RQ's started registry) and how
many tasks were queued. Writes bench/results/mock_llm.json and docs/throughput.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import redis  # noqa: E402
from rq import Queue  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from bench.common import (  # noqa: E402
    ROOT,
    RQ,
    RQ_JSON,
    RedisServer,
    Workers,
    outcomes,
    private_redis,
    rate,
    rollq_workers,
    sum_over,
    worker_env,
    write_result,
)
from bench.rq_jobs import TURN_SECONDS, TURNS  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.store.keys import Keys  # noqa: E402

MEAN_ROLLOUT_SECONDS = TURNS * sum(TURN_SECONDS) / 2
WORKER_PROCESSES = 2
WARMUP_SECONDS = 5.0

PLOT = ROOT / "docs" / "throughput.png"


class Processes:
    """The worker processes to measure: each started process and every child it forked."""

    def __init__(self, workers: Workers) -> None:
        self.ps: list[psutil.Process] = []
        for p in workers.ps:
            self.ps += [p, *p.children(recursive=True)]

    def cpu_seconds(self) -> float:
        return sum_over(self.ps, lambda p: sum(p.cpu_times()[:2]))

    def context_switches(self) -> int:
        return int(sum_over(self.ps, lambda p: sum(p.num_ctx_switches())))

    def memory(self) -> tuple[int, int]:
        """(RSS sum, USS sum) in bytes."""
        rss = uss = 0
        for p in self.ps:
            try:
                info = p.memory_full_info()
            except psutil.NoSuchProcess:
                continue
            rss, uss = rss + info.rss, uss + info.uss
        return rss, uss


class Feeder(threading.Thread):
    """Keeps at least ``depth`` tasks queued, topping up in batches of ``depth``.

    ``ahead=(read, n)``: and no more than ``n`` tasks ahead of ``read()``, the rollouts the trainer has read, as a
    trainer that queues work as it consumes it would; without it, workers that publish faster than the trainer reads
    grow a backlog on the results stream, on CPU the trainer then does not get (bench/big.py ``--ahead``)."""

    def __init__(
        self,
        connection: redis.Redis,
        queue_key: str,
        depth: int,
        enqueue: Callable[[int], object],
        ahead: tuple[Callable[[], int], int] | None = None,
    ) -> None:
        super().__init__(daemon=True, name="feeder")
        self.connection, self.queue_key, self.depth, self.enqueue = connection, queue_key, depth, enqueue
        self.ahead = ahead
        self.enqueued = 0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def _room(self) -> bool:
        return self.ahead is None or self.enqueued - self.ahead[0]() < self.ahead[1]

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                if self._room() and self.connection.llen(self.queue_key) < self.depth:
                    self.enqueue(self.depth)
                    self.enqueued += self.depth
                else:
                    self.stop_event.wait(0.02 if self.ahead is None else 0.005)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)


class Gauge(threading.Thread):
    """Samples, four times a second, how many rollouts are running and how many tasks are queued."""

    def __init__(self, connection: redis.Redis, running_key: str, queue_key: str) -> None:
        super().__init__(daemon=True, name="gauge")
        self.connection, self.running_key, self.queue_key = connection, running_key, queue_key
        self.samples: list[tuple[int, int]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.25):
            with self.connection.pipeline(transaction=False) as pipe:
                pipe.zcard(self.running_key)
                pipe.llen(self.queue_key)
                running, queued = pipe.execute()
            self.samples.append((int(running), int(queued)))

    def stop(self) -> tuple[float, int]:
        """(mean running, fewest queued) over the samples."""
        self.stop_event.set()
        self.join(timeout=10)
        return sum(r for r, _ in self.samples) / max(len(self.samples), 1), min((q for _, q in self.samples), default=0)


def add_ideal(row: dict[str, Any], in_flight: int, mean_rollout_seconds: float = MEAN_ROLLOUT_SECONDS) -> None:
    """The row's ideal rate (``in_flight`` over the agent's mean rollout time: every slot always busy, nothing else
    costing time) and its ``rollouts_per_s`` as a percentage of it."""
    ideal = in_flight / mean_rollout_seconds
    row["ideal_rollouts_per_s"] = round(ideal, 1)
    row["percent_of_ideal"] = round(100 * row["rollouts_per_s"] / ideal, 1)


def measure(
    server: RedisServer,
    *,
    system: str,
    in_flight: int,
    processes: int,
    workers: Workers,
    queue_name: str,
    running_key: str,
    enqueue: Callable[[int], object],
    completions: Callable[[], tuple[int, int]],
    window: float,
    mean_rollout_seconds: float | None = MEAN_ROLLOUT_SECONDS,
) -> dict[str, Any]:
    """The rate, CPU and memory of ``workers`` over ``window`` s, fed ``in_flight`` deep. ``mean_rollout_seconds``:
    the agent's mean rollout time, the ideal rate's denominator (the mock agent's by default); None for an agent
    with none known (the sample agent's rollouts last as long as its LLM answers): the row then has no ideal rate."""
    connection = server.client()
    workers.wait_registered(connection, queue_name, expected=processes)
    procs = Processes(workers)
    redis_proc = psutil.Process(server.process.pid)  # type: ignore[union-attr]
    me = psutil.Process()
    feeder = Feeder(server.client(), f"rq:queue:{queue_name}", in_flight, enqueue)
    feeder.start()
    try:
        started = time.monotonic()
        while time.monotonic() - started < WARMUP_SECONDS or sum(completions()) < in_flight:
            workers.check_alive()
            if feeder.error:
                raise feeder.error
            time.sleep(0.2)
        ok0, failed0 = completions()
        cpu0, rcpu0, t0 = procs.cpu_seconds(), sum(redis_proc.cpu_times()[:2]), time.monotonic()
        wall0 = time.time()
        switches0, me0, idle0 = procs.context_switches(), sum(me.cpu_times()[:2]), psutil.cpu_times().idle
        gauge = Gauge(server.client(), running_key, f"rq:queue:{queue_name}")
        gauge.start()
        time.sleep(window)
        mean_running, min_queued = gauge.stop()
        ok1, failed1 = completions()
        cpu1, rcpu1, t1 = procs.cpu_seconds(), sum(redis_proc.cpu_times()[:2]), time.monotonic()
        wall1 = time.time()
        switches1, me1, idle1 = procs.context_switches(), sum(me.cpu_times()[:2]), psutil.cpu_times().idle
        if feeder.error:
            raise feeder.error
        rss, uss = procs.memory()
    finally:
        feeder.stop()
        workers.stop(timeout=30)
    done = (ok1 - ok0) + (failed1 - failed0)
    elapsed = t1 - t0
    machine_busy = psutil.cpu_count() - (idle1 - idle0) / elapsed
    row = {
        "system": system,
        "in_flight": in_flight,
        "worker_processes": processes,
        "rollouts": done,
        "failed": failed1 - failed0,
        "seconds": round(elapsed, 2),
        "rollouts_per_s": rate(done, elapsed),
        "mean_running": round(mean_running, 1),
        "min_queued": min_queued,
        "worker_rss_mb": round(rss / 2**20, 1),
        "worker_uss_mb": round(uss / 2**20, 1),
        "worker_cpu_ms_per_rollout": round(1000 * (cpu1 - cpu0) / max(done, 1), 2),
        "worker_cpu_cores": round((cpu1 - cpu0) / (t1 - t0), 2),
        "worker_context_switches_per_rollout": round((switches1 - switches0) / max(done, 1), 1),
        "redis_cpu_ms_per_rollout": round(1000 * (rcpu1 - rcpu0) / max(done, 1), 3),
        "producer_cpu_cores": round((me1 - me0) / elapsed, 2),
        "redis_cpu_cores": round((rcpu1 - rcpu0) / elapsed, 2),
        "machine_busy_cores": round(machine_busy, 2),
        "other_processes_cpu_cores": round(machine_busy - ((cpu1 - cpu0) + (rcpu1 - rcpu0) + (me1 - me0)) / elapsed, 2),
        "window_wall_time": [round(wall0, 3), round(wall1, 3)],
    }
    of_ideal = ""
    if mean_rollout_seconds is not None:
        add_ideal(row, in_flight, mean_rollout_seconds)
        of_ideal = f" = {row['percent_of_ideal']:5.1f}% of ideal"
    print(
        f"  {system:5s} in flight {in_flight:5d} ({processes:3d} processes): {row['rollouts_per_s']:7.1f} rollouts/s"
        f"{of_ideal}; {row['mean_running']:6.1f} running, "
        f">= {row['min_queued']} queued; RSS {row['worker_rss_mb']:7.1f} MB (USS {row['worker_uss_mb']:7.1f}); "
        f"{row['worker_cpu_ms_per_rollout']:5.2f} ms worker CPU/rollout; cores: workers {row['worker_cpu_cores']:.2f}, "
        f"redis {row['redis_cpu_cores']:.2f}, producer {row['producer_cpu_cores']:.2f}, "
        f"other processes {row['other_processes_cpu_cores']:.2f} of {psutil.cpu_count()}",
        flush=True,
    )
    return row


def run_rollq(
    server: RedisServer,
    in_flight: int,
    window: float,
    log_dir: Path,
    tasks_per_job: int | None = None,
    *,
    namespace: str | None = None,
    system: str = "rollq",
    agent: str = "bench.agents:MockLLMAgent",
    inputs: Callable[[int], list[Any]] | None = None,
    resources: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
    mean_rollout_seconds: float | None = MEAN_ROLLOUT_SECONDS,
) -> dict[str, Any]:
    """rollq's workers running ``agent`` on ``inputs(n)`` tasks (mock-LLM questions by default) with ``resources``
    published, measured as :func:`measure` does (``mean_rollout_seconds`` with it). ``tasks_per_job``: the
    producer's and the workers' packs (docs/rq.md); None: ``ROLLQ_TASKS_PER_JOB``, as set."""
    namespace = namespace or f"rollq-{in_flight}"
    producer = Producer.from_url(server.url, namespace, tasks_per_job=tasks_per_job)
    if resources is not None:
        producer.update_resources(resources)
    connection = server.client()

    def enqueue(n: int) -> None:
        producer.enqueue_many(inputs(n) if inputs else [{"question": i} for i in range(n)], mode="train")

    def completions() -> tuple[int, int]:
        return outcomes(connection, namespace)

    if tasks_per_job is not None:
        extra_env = {**(extra_env or {}), "ROLLQ_TASKS_PER_JOB": str(tasks_per_job)}
    workers = rollq_workers(
        server.url,
        namespace,
        WORKER_PROCESSES,
        agent=agent,
        concurrency=in_flight // WORKER_PROCESSES,
        log_dir=log_dir,
        extra_env=extra_env,
    )
    return measure(
        server,
        system=system,
        in_flight=in_flight,
        processes=WORKER_PROCESSES,
        workers=workers,
        queue_name=namespace,
        running_key=Keys(namespace).inflight,
        enqueue=enqueue,
        completions=completions,
        window=window,
        mean_rollout_seconds=mean_rollout_seconds,
    )


def run_rq(server: RedisServer, in_flight: int, processes: int, window: float, log_dir: Path) -> dict[str, Any]:
    queue_name = f"rq-{processes}"
    connection = server.client()
    queue = Queue(queue_name, connection=connection, serializer=JSONSerializer)

    def enqueue(n: int) -> None:
        queue.enqueue_many([Queue.prepare_data("bench.rq_jobs.mock_llm") for _ in range(n)])

    def completions() -> tuple[int, int]:
        with connection.pipeline(transaction=False) as pipe:
            pipe.zcard(queue.finished_job_registry.key)
            pipe.zcard(queue.failed_job_registry.key)
            ok, failed = pipe.execute()
        return int(ok), int(failed)

    command = [
        RQ,
        "worker-pool",
        "-n",
        str(processes),
        "-w",
        "rq.worker.SimpleWorker",
        "-S",
        RQ_JSON,
        "--url",
        server.url,
        "--quiet",
        queue_name,
    ]
    workers = Workers([command], worker_env(), log_dir)
    return measure(
        server,
        system="rq",
        in_flight=processes,
        processes=processes,
        workers=workers,
        queue_name=queue_name,
        running_key=queue.started_job_registry.key,
        enqueue=enqueue,
        completions=completions,
        window=window,
    )


def plot(mock: dict[str, Any]) -> None:
    """docs/throughput.png: rollouts/s and worker memory against rollouts in flight, rollq beside plain RQ."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", default="32,256,1000", help="rollouts in flight to run, comma-separated")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of steady state to count")
    parser.add_argument(
        "--rq-max-processes",
        type=int,
        default=256,
        help="most RQ worker processes to start (each holds one rollout in flight); 0 skips RQ",
    )
    args = parser.parse_args()
    levels = [int(n) for n in args.in_flight.split(",")]

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rollq-bench-logs-") as logs:
        print(f"steady state over {args.window:g} s per setting:")
        for in_flight in levels:
            with private_redis() as server:
                rows.append(run_rollq(server, in_flight, args.window, Path(logs)))
        for processes in sorted({min(n, args.rq_max_processes) for n in levels} - {0}):
            with private_redis() as server:
                rows.append(run_rq(server, processes, processes, args.window, Path(logs)))

    rq_rows = {r["in_flight"]: r for r in rows if r["system"] == "rq"}
    comparison = []
    for row in (r for r in rows if r["system"] == "rollq" and rq_rows):
        rq = rq_rows[min(row["in_flight"], args.rq_max_processes)]
        comparison.append(
            {
                "in_flight": row["in_flight"],
                "rollq_rollouts_per_s": row["rollouts_per_s"],
                "rq_processes": rq["worker_processes"],
                "rq_rollouts_per_s": rq["rollouts_per_s"],
                "throughput_ratio": round(row["rollouts_per_s"] / rq["rollouts_per_s"], 2),
                "rss_ratio": round(row["worker_rss_mb"] / rq["worker_rss_mb"], 3),
                "cpu_per_rollout_ratio": round(row["worker_cpu_ms_per_rollout"] / rq["worker_cpu_ms_per_rollout"], 2),
            }
        )
    path = write_result(
        "mock_llm",
        {
            "mean_rollout_seconds": MEAN_ROLLOUT_SECONDS,
            "window_seconds": args.window,
            "rq_max_processes": args.rq_max_processes,
            "rows": rows,
            "comparison": comparison,
            "targets": {"percent_of_ideal_at_256": 90, "rollouts_per_s_at_1000": 500},
        },
        sys.argv[1:],
        settings=vars(args),
    )
    plot(json.loads(path.read_text()))


if __name__ == "__main__":
    main()
