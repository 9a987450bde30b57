"""Soak: worker processes SIGKILLed at random under steady load, and nothing lost or delivered twice.

Run: python bench/soak.py [--duration 300] [--tasks 5000] [--workers 4] [--concurrency 8]

Kill storm (issue 11; the figures in docs/benchmarks.md):
    python bench/soak.py --workers 3 --concurrency 64 --kill-every 1-2 --sleep 0.01-0.05 \
        --tasks 20000 --total 20000 --duration 60

A private redis-server (free port, temporary directory) and N ``rq worker -w
rollq.worker.RolloutWorker`` processes whose agent sleeps ``--sleep`` seconds
(default 0.05-0.3). Every ``--kill-every`` seconds (a number, or a range
``lo-hi`` drawn from uniformly) a random worker is SIGKILLed and a new one
started. Tasks are queued in batches until ``--duration`` has passed (or
``--total`` tasks were queued); then the script waits for every task's rollout
and prints tasks in, delivered, lost, duplicated, superseded, and the longest
time from a kill to the requeue of the last task the killed worker had in
flight. Writes bench/results/soak.json with the settings; exits 1 if a task was
lost or delivered twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from rollq.models.policy import RolloutPolicy
from rollq.producer.producer import Producer
from rollq.worker.agent import LitAgent

ROOT = Path(__file__).resolve().parent.parent
RQ = str(Path(sys.executable).parent / "rq")
NAMESPACE = "soak"
SLEEP_SECONDS = (0.05, 0.3)
BATCH = 1000


def seconds_range(text: str) -> tuple[float, float]:
    """``"1.5"`` -> (1.5, 1.5); ``"1-2"`` -> (1.0, 2.0)."""
    lo, _, hi = text.partition("-")
    return float(lo), float(hi or lo)


class SoakAgent(LitAgent):
    """Sleeps ``SOAK_SLEEP`` (default 0.05-0.3) seconds, then returns a reward; imported by the workers as
    ``bench.soak:SoakAgent``."""

    sleep = seconds_range(os.environ.get("SOAK_SLEEP", "")) if os.environ.get("SOAK_SLEEP") else SLEEP_SECONDS

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> float:
        await asyncio.sleep(random.uniform(*self.sleep))
        return 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
         "--appendonly", "no", "--logfile", str(directory / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return process, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            time.sleep(0.05)
    sys.exit(f"redis-server did not start; see {directory / 'redis.log'}")


@dataclass
class Kill:
    """One SIGKILL: when, and the attempts the worker had in flight (rollout id -> attempt)."""

    worker: str
    at: float
    in_flight: dict[str, int]
    requeued_after: float | None = None


@dataclass
class Soak:
    args: argparse.Namespace
    url: str
    log_dir: Path
    producer: Producer = field(init=False)
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: int = 0
    ids: list[str] = field(default_factory=list)
    delivered: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    cursor: str = "0-0"
    kills: list[Kill] = field(default_factory=list)

    def __post_init__(self) -> None:
        policy = RolloutPolicy(unresponsive_seconds=self.args.unresponsive, max_attempts=self.args.max_attempts)
        self.producer = Producer.from_url(self.url, NAMESPACE, policy=policy)

    def start_worker(self) -> None:
        name = f"soak-{self.started}"
        self.started += 1
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p),
            "ROLLQ_AGENT": "bench.soak:SoakAgent",
            "ROLLQ_CONCURRENCY": str(self.args.concurrency),
            "ROLLQ_HEARTBEAT_SECONDS": str(self.args.heartbeat),
            "ROLLQ_RESULTS_MAXLEN": "10000000",
            "SOAK_SLEEP": self.args.sleep,
        }
        with open(self.log_dir / f"{name}.log", "wb") as log:
            self.workers[name] = subprocess.Popen(
                [RQ, "worker", "-w", "rollq.worker.RolloutWorker", "--url", self.url, "--name", name, NAMESPACE],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
            )

    def enqueue(self, n: int) -> None:
        self.ids += [t.rollout_id for t in self.producer.enqueue_many([{"n": len(self.ids) + i} for i in range(n)])]

    def kill_one(self) -> None:
        name = random.choice(sorted(self.workers))
        connection, keys = self.producer.connection, self.producer.keys
        members = [m.decode().rpartition("|") for m in connection.zrange(keys.inflight, 0, -1)]
        pipe = connection.pipeline(transaction=False)
        for rid, _, _ in members:
            pipe.hget(keys.task(rid), "worker")
        owners = pipe.execute()
        in_flight = {rid: int(n) for (rid, _, n), owner in zip(members, owners, strict=True) if owner == name.encode()}
        self.workers.pop(name).kill()
        self.kills.append(Kill(name, time.monotonic(), in_flight))
        self.start_worker()

    def watch_kills(self) -> None:
        """Stamp each kill whose in-flight attempts have all been requeued (or ended) by now."""
        waiting = [k for k in self.kills if k.requeued_after is None]
        if not waiting:
            return
        connection, keys = self.producer.connection, self.producer.keys
        now = time.monotonic()
        for kill in waiting:
            pipe = connection.pipeline(transaction=False)
            for rid in kill.in_flight:
                pipe.hmget(keys.task(rid), "state", "attempt")
            still = [
                rid for rid, (state, attempt) in zip(kill.in_flight, pipe.execute(), strict=True)
                if state == b"running" and int(attempt) == kill.in_flight[rid]
            ]  # fmt: skip
            if not still:
                kill.requeued_after = now - kill.at

    def read_results(self) -> None:
        while True:
            reply = self.producer.connection.xread({self.producer.keys.results: self.cursor}, count=5000)
            if not reply:
                return
            for entry_id, fields in reply[0][1]:
                self.cursor = entry_id.decode()
                self.delivered[fields[b"rollout_id"].decode()] += 1
                self.statuses[json.loads(fields[b"rollout"])["metadata"].get("status", "?")] += 1

    def run(self) -> dict[str, Any]:
        args = self.args
        for _ in range(args.workers):
            self.start_worker()
        began = time.monotonic()
        self.enqueue(args.tasks)
        kill_every = seconds_range(args.kill_every)
        next_kill = began + random.uniform(*kill_every)
        deadline = began + args.duration + args.drain_timeout
        last_report = began
        while time.monotonic() < deadline:
            now = time.monotonic()
            running = now - began < args.duration
            if running and now >= next_kill:
                self.kill_one()
                next_kill = now + random.uniform(*kill_every)
            room = args.total - len(self.ids) if args.total else BATCH
            if running and room > 0 and self.producer.connection.llen(self.producer.keys.rq_queue) < BATCH:
                self.enqueue(min(BATCH, room))
            self.read_results()
            self.watch_kills()
            if now - last_report >= 30:
                last_report = now
                print(f"  {now - began:5.0f}s: {len(self.ids)} queued, {len(self.delivered)} delivered, "
                      f"{len(self.kills)} kills", flush=True)  # fmt: skip
            if (
                not running
                and len(self.delivered) >= len(set(self.ids))
                and all(k.requeued_after is not None for k in self.kills)
            ):
                break
            time.sleep(0.1)
        elapsed = time.monotonic() - began
        self.read_results()
        return self.summary(elapsed)

    def summary(self, elapsed: float) -> dict[str, Any]:
        stats = {k.decode(): float(v) for k, v in self.producer.connection.hgetall(self.producer.keys.stats).items()}
        wanted = set(self.ids)
        lost = sorted(wanted - set(self.delivered))
        duplicated = sorted(rid for rid, n in self.delivered.items() if n > 1)
        timed = [k.requeued_after for k in self.kills if k.requeued_after is not None and k.in_flight]
        return {
            "tasks_in": len(wanted),
            "delivered": len(set(self.delivered) & wanted),
            "lost": len(lost),
            "duplicated": len(duplicated),
            "unexpected": len(set(self.delivered) - wanted),
            "succeeded": self.statuses["succeeded"],
            "failed": self.statuses["failed"],
            "superseded": int(stats.get("superseded", 0)),
            "requeued": {k.split(":", 1)[1]: int(v) for k, v in stats.items() if k.startswith("requeued:")},
            "kills": len(self.kills),
            "kills_with_tasks_in_flight": len(timed),
            "kill_to_requeue_max_s": round(max(timed), 2) if timed else None,
            "kill_to_requeue_mean_s": round(sum(timed) / len(timed), 2) if timed else None,
            "kills_never_requeued": sum(1 for k in self.kills if k.requeued_after is None),
            "elapsed_s": round(elapsed, 1),
            "rollouts_per_s": round(len(self.delivered) / elapsed, 1),
            "lost_ids": lost[:20],
            "duplicated_ids": duplicated[:20],
        }

    def stop(self) -> None:
        for process in self.workers.values():
            process.send_signal(signal.SIGTERM)
        for process in self.workers.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300, help="seconds of load and kills (default 300)")
    parser.add_argument("--tasks", type=int, default=5000, help="tasks queued at the start (default 5000)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kill-every", default="5", help="seconds between SIGKILLs, or a range lo-hi (default 5)")
    parser.add_argument("--sleep", default="0.05-0.3", help="the agent's sleep per task, lo-hi seconds")
    parser.add_argument("--total", type=int, default=0, help="queue no more than this many tasks (0: no cap)")
    parser.add_argument("--unresponsive", type=float, default=5, help="the policy's unresponsive_seconds (default 5)")
    parser.add_argument("--heartbeat", type=float, default=1, help="ROLLQ_HEARTBEAT_SECONDS (default 1)")
    parser.add_argument("--max-attempts", type=int, default=20, help="high, so that repeated kills do not fail tasks")
    parser.add_argument("--drain-timeout", type=float, default=600, help="how long to wait for the last rollouts")
    args = parser.parse_args()
    # Here, not at the top: the workers import this module for its agent, and need none of it.
    sys.path.insert(0, str(ROOT))
    from bench.common import write_result

    with tempfile.TemporaryDirectory(prefix="rollq-soak-") as directory:
        redis_process, url = start_redis(Path(directory))
        soak = Soak(args, url, Path(directory))
        try:
            print(f"soak: {args.workers} workers x {args.concurrency}, a SIGKILL every {args.kill_every}s "
                  f"for {args.duration:g}s; tasks sleep {args.sleep}s; unresponsive after {args.unresponsive:g}s",
                  flush=True)  # fmt: skip
            summary = soak.run()
        finally:
            soak.stop()
            redis_process.terminate()
            redis_process.wait(timeout=30)

    for key, value in summary.items():
        if not key.endswith("_ids") or value:
            print(f"{key:28} {value}")
    write_result("soak", {"cpus": os.cpu_count(), **summary}, sys.argv[1:], settings=vars(args))
    if summary["lost"] or summary["duplicated"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
