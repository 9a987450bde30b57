"""What every benchmark shares: a private redis-server, worker subprocesses, measuring them, writing results.

Every benchmark starts its own redis-server on a free port in a temporary
directory and never talks to any other Redis.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis
from redis.connection import Connection

from rollq.store.keys import Keys
from rollq.store.scripts import script_source

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
RQ = str(Path(sys.executable).parent / "rq")
RQ_JSON = "rq.serializers.JSONSerializer"


def sum_over(processes: Sequence[psutil.Process], measure: Callable[[psutil.Process], float]) -> float:
    """``measure`` summed over the processes still alive (a worker may exit between listing and reading)."""
    total = 0.0
    for p in processes:
        try:
            total += measure(p)
        except psutil.NoSuchProcess:
            continue
    return total


def cpu_split(process: psutil.Process) -> tuple[float, float]:
    """User + system CPU seconds of ``process`` and of its live children (a forwarder that runs a binary of its
    own): ``(own, children's)``."""
    children = sum_over(process.children(recursive=True), lambda p: sum(p.cpu_times()[:2]))
    return sum(process.cpu_times()[:2]), children


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A redis-server of the benchmark's own: free port, temporary directory, no persistence."""

    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            sys.exit("redis-server is not installed (apt-get install redis-server)")
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


@contextmanager
def base_tree(commit: str | None) -> Iterator[Path | None]:
    """A temporary ``git worktree`` of ``commit`` (its scripts run with it first on PYTHONPATH, so their rollq is
    that commit's): the "before" of a before/after measured in one run. None when ``commit`` is None."""
    if commit is None:
        yield None
        return
    tree = Path(tempfile.mkdtemp(prefix="rollq-bench-base-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True,
                   capture_output=True)  # fmt: skip
    try:
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        shutil.rmtree(tree.parent, ignore_errors=True)


def commit_of(commit: str) -> str:
    """``commit`` as its short hash."""
    return _git("rev-parse", "--short", commit)


@contextmanager
def private_redis() -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="rollq-bench-") as directory:
        server = RedisServer(Path(directory)).start()
        try:
            yield server
        finally:
            server.stop()


def worker_env(**extra: str) -> dict[str, str]:
    """The environment of a worker subprocess: the repository root importable, so ``bench.agents`` is."""
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


class Workers:
    """Worker subprocesses of one kind, their logs in a temporary directory."""

    def __init__(self, commands: Sequence[list[str]], env: dict[str, str], log_dir: Path) -> None:
        self.logs = [log_dir / f"worker-{i}-{time.monotonic_ns()}.log" for i in range(len(commands))]
        self.processes = []
        for command, log in zip(commands, self.logs, strict=True):
            with open(log, "wb") as out:
                self.processes.append(
                    subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
                )
        self.ps = [psutil.Process(p.pid) for p in self.processes]

    def wait_registered(
        self,
        connection: redis.Redis,
        queue: str,
        expected: int | None = None,
        timeout: float = 180,
        registry_key: str | None = None,
    ) -> None:
        """Until ``expected`` workers (default: one per process) have registered; they are then about to dequeue.

        RQ workers register in RQ's per-queue worker set; other workers name the set they add themselves to.
        """
        deadline = time.monotonic() + timeout
        while connection.scard(registry_key or f"rq:workers:{queue}") < (expected or len(self.processes)):
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not register within {timeout}s; logs: {self.logs[0].parent}")
            time.sleep(0.1)

    def check_alive(self) -> None:
        for p, log in zip(self.processes, self.logs, strict=True):
            if p.poll() is not None:
                raise RuntimeError(f"worker {p.pid} exited with {p.returncode}:\n{log.read_text()[-3000:]}")

    def cpu_seconds(self) -> float:
        """User + system CPU of the workers and their reaped children (RQ's forked work horses)."""
        return sum_over(self.ps, lambda p: sum(p.cpu_times()[:4]))

    def rss_bytes(self) -> int:
        return int(sum_over(self.ps, lambda p: p.memory_info().rss))

    def stop(self, timeout: float = 60) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.processes:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def redis_settings(text: str) -> dict[str, str]:
    """Redis settings for ``CONFIG SET`` from a command line: ``default`` -> {}; ``a=1,b=2`` -> {"a": "1", "b": "2"}."""
    if text in ("", "default"):
        return {}
    return dict(item.split("=", 1) for item in text.split(",") if item)


def worker_settings(items: Sequence[str] | None) -> dict[str, str]:
    """Worker environment variables from a command line's repeated ``KEY=VALUE``."""
    return dict(item.split("=", 1) for item in items or ())


def rollq_workers(
    url: str,
    namespace: str,
    count: int,
    *,
    agent: str,
    concurrency: int,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
) -> Workers:
    """``count`` stock ``rq worker -w rollq.worker.RolloutWorker`` processes."""
    command = [RQ, "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, "--quiet", namespace]
    env = worker_env(ROLLQ_AGENT=agent, ROLLQ_CONCURRENCY=str(concurrency), **(extra_env or {}))
    return Workers([command] * count, env, log_dir)


def rq_workers(url: str, queue: str, count: int, *, worker_class: str, log_dir: Path) -> Workers:
    """``count`` stock ``rq worker`` processes of ``worker_class`` with the JSON serializer."""
    command = [RQ, "worker", "-w", worker_class, "-S", RQ_JSON, "--url", url, "--quiet", queue]
    return Workers([command] * count, worker_env(), log_dir)


def outcomes(connection: redis.Redis, namespace: str) -> tuple[int, int]:
    """(succeeded, failed) rollouts of a rollq namespace so far, from its stats hash."""
    stats: dict[bytes, bytes] = connection.hgetall(Keys(namespace).stats)  # type: ignore[assignment]
    succeeded = sum(int(v) for k, v in stats.items() if k.startswith(b"succeeded:"))
    failed = sum(int(v) for k, v in stats.items() if k.startswith(b"failed:"))
    return succeeded, failed


def commandstats(connection: redis.Redis) -> dict[str, int]:
    """Calls per command since the server started (commands run by Lua scripts included)."""
    info = connection.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stats["calls"]) for name, stats in info.items()}


def commands_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Commands run between two :func:`commandstats` readings, minus the INFO call that took the second one."""
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    delta["info"] = delta.get("info", 0) - 1
    return {k: v for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v > 0}


_COMMAND = re.compile(rb"\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n(?:\$\d+\r\n([0-9a-f]{40})\r\n)?")
# The SHA Redis knows each script by: its source as rollq loads it, with the generated header.
_SCRIPTS = {
    hashlib.sha1(script_source(f.stem).encode()).hexdigest().encode(): f.stem
    for f in (ROOT / "rollq" / "store" / "lua").glob("*.lua")
}


class CountingConnection(Connection):
    """A redis-py connection that counts round trips: every packed send is one (a pipeline sends once).

    Each is also tallied by what it was: the command, the rollq Lua script, or
    ``pipeline(...)`` with the first command of the batch.
    """

    round_trips = 0
    by_label: Counter[str] = Counter()
    _single = threading.local()

    @classmethod
    def reset(cls) -> None:
        cls.round_trips = 0
        cls.by_label = Counter()

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        CountingConnection._single.on = True
        try:
            super().send_command(*args, **kwargs)
        finally:
            CountingConnection._single.on = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.round_trips += 1
        first = command if isinstance(command, (bytes, str)) else command[0]
        match = _COMMAND.match(first.encode() if isinstance(first, str) else bytes(first))
        name = match.group(1).decode().upper() if match else "?"
        if match and name == "EVALSHA" and match.group(2):
            name = f"EVALSHA {_SCRIPTS.get(match.group(2), 'other')}.lua"
        single = getattr(CountingConnection._single, "on", False)
        CountingConnection.by_label[name if single else f"pipeline({name} ...)"] += 1
        super().send_packed_command(command, check_health)


def counting_client(port: int) -> redis.Redis:
    pool = redis.ConnectionPool(connection_class=CountingConnection, host="127.0.0.1", port=port)
    return redis.Redis(connection_pool=pool)


PACKAGES = ("openai", "httpx", "httpx2", "opentelemetry-sdk", "pydantic", "orjson", "uvloop", "httptools", "aiohttp")
"""The libraries on a measured path besides RQ and redis-py, whose versions a results file records: a new release
of one can move a figure as much as a change to rollq (the sample agent's CPU is mostly the ``openai`` SDK's)."""


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """The installed version of each of ``names`` (those not installed left out), from their metadata."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def python_loop_ms(runs: int = 3) -> float:
    """The machine's speed at plain Python: ms for ``sum(i * i for i in range(10**6))``, the best of ``runs``.

    Machines of the same kind differed by 2-3x from one session to the next (``MACHINES_NOTE`` in
    bench/report.py): this one figure in every results file says how fast the one that wrote it was."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        sum(i * i for i in range(10**6))
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import redis as redis_py
    import rq

    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
    return {
        "cpu": model or platform.processor(),
        "cores": psutil.cpu_count(logical=True),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "redis_server": next((w.split("=", 1)[1] for w in server if w.startswith("v=")), "?"),
        "rq": rq.__version__,
        "redis_py": redis_py.__version__,
        "packages": package_versions(),
        "python_loop_ms": python_loop_ms(),
        "python_loop_ms_at_start": STARTED["python_loop_ms"],
    }


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def source_commit() -> dict[str, Any]:
    """The commit the benchmark measures: ``git rev-parse HEAD`` and whether the tree differed from it.

    ``dirty`` counts tracked files changed outside ``bench/results/`` and the generated report (a run of
    bench/run_all.py rewrites those as it goes; they are not the code being measured). Outside a git
    checkout the commit is None.
    """
    try:
        commit = _git("rev-parse", "HEAD")
        changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{p}" for p in _OUTPUTS))
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(changed)}


def cpu_ticks() -> tuple[int, int]:
    """(all, stolen) CPU ticks of the machine so far (``/proc/stat``): what the hypervisor gave other guests."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:8]), fields[7]


def steal_percent(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the machine's CPU time between two :func:`cpu_ticks` readings that the hypervisor took."""
    return round(100 * (after[1] - before[1]) / max(1, after[0] - before[0]), 1)


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages: how busy the shared machine was (2 cores: 2.0 is saturated)."""
    return [round(x, 2) for x in os.getloadavg()]


# What the run found when it began: every benchmark imports this module first thing, so the load "before"
# is the machine's load before the benchmark started its servers and workers, the Python speed the machine's at
# the start (``machine()`` measures it again at the end), and the commit is the one it started from (a tree edited
# during a long run does not change what was measured).
_OUTPUTS = ("bench/results", "docs/benchmarks.md", "docs/throughput.png", "docs/scaling.png")
STARTED: dict[str, Any] = {
    "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    "load_average": load_average(),
    "python_loop_ms": python_loop_ms(),
    **source_commit(),
}


def _running_script() -> str | None:
    """The name of the ``bench/<name>.py`` script this process runs, None when it runs something else."""
    path = Path(sys.argv[0]).resolve()
    return path.stem if path.parent == RESULTS.parent and path.suffix == ".py" else None


def write_result(
    name: str,
    data: dict[str, Any],
    argv: Sequence[str] = (),
    *,
    script: str | None = None,
    module: str | None = None,
    settings: dict[str, Any] | None = None,
) -> Path:
    """``bench/results/<name>.json``: the figures with their provenance.

    Provenance: the date, the commit measured (and whether the tree was dirty), the machine, its load
    average when the benchmark started and when it wrote this file, the command that reproduces it
    (``python -m <module>``, or ``python bench/<script>.py``: by default the bench script this process runs, so
    that a run written under another name still names its script; then ``argv``) and the ``settings`` it ran
    with (its parsed arguments).
    """
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    program = ["-m", module] if module else [f"bench/{script or _running_script() or name}.py"]
    document = {
        "benchmark": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "started": STARTED["date"],
        "commit": STARTED["commit"],
        "dirty": STARTED["dirty"],
        "command": " ".join(["python", *program, *argv]),
        "settings": settings if settings is not None else {},
        "machine": machine(),
        "load_average": {"before": STARTED["load_average"], "after": load_average()},
        "niceness": os.nice(0),
        **data,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def rate(count: float, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0
