"""Redis failover under load: a primary, a replica, 3 Sentinels; SIGKILL the primary while rollouts run.

Run: python bench/failover.py [--tasks 2400] [--rate 80] [--kill-after 10] [--workers 2] [--concurrency 32]

Everything is local and private: redis-servers and ``redis-server --sentinel`` processes on free
ports of 127.0.0.1, each in a temporary directory (no persistence), stopped at the end. rollq connects
only through the Sentinels, with ``redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/rollq/0``
(store/connection.py): the producer, the trainer (a consumer-group reader) and ``rollq worker``
processes running the mock-LLM agent (3 turns x U(0.1, 0.5) s), 1 s heartbeats, tasks with
``unresponsive_seconds`` 5. The producer enqueues ``--rate`` tasks per second in batches of 10 (so
enqueues are in flight when the primary dies) until ``--tasks``; ``--kill-after`` seconds in, the
primary gets SIGKILL. Sentinels: down-after 1000 ms, quorum 2.

Reported: when the Sentinels named the new primary, how long until the trainer received rollouts
again; tasks whose enqueue Redis acknowledged but which the new
primary does not hold (lost tasks), rollouts never received, rollouts received twice, tasks run more
than once, and the stats the new primary holds (requeued, superseded). Then the cost of ``WAIT 1``
after a transition: the round trip of one enqueue with and without ``WAIT 1 1000`` against the
replica. Writes bench/results/failover.json.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.common import free_port, worker_env, write_result  # noqa: E402
from rollq.models.policy import RolloutPolicy  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.store.connection import connect  # noqa: E402
from rollq.store.keys import Keys  # noqa: E402

SERVICE = "rollq"
NAMESPACE = "failover"
ROLLQ = str(Path(sys.executable).parent / "rollq")


class Servers:
    """The primary, the replica and the Sentinels, all on 127.0.0.1 in one temporary directory."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.binary = shutil.which("redis-server") or sys.exit("redis-server is not installed")
        self.primary_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def _start(self, name: str, args: list[str]) -> None:
        directory = self.tmp / name
        directory.mkdir()
        with open(directory / "log", "wb") as log:
            self.processes[name] = subprocess.Popen(
                [self.binary, *args, "--dir", str(directory)], stdout=log, stderr=subprocess.STDOUT
            )

    def start(self) -> None:
        common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self._start("primary", ["--port", str(self.primary_port), *common])
        self._start(
            "replica", ["--port", str(self.replica_port), *common, "--replicaof", "127.0.0.1", str(self.primary_port)]
        )
        for i, port in enumerate(self.sentinel_ports):
            config = self.tmp / f"sentinel-{i}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self._start(f"sentinel-{i}", [str(config), "--sentinel"])
        replica = redis.Redis(port=self.replica_port)
        deadline = time.monotonic() + 30
        while True:
            try:
                if dict(replica.info("replication")).get("master_link_status") == "up":  # type: ignore[arg-type]
                    sentinels: list[Any] = [redis.Redis(port=p).sentinel_master(SERVICE) for p in self.sentinel_ports]
                    if all(
                        int(s.get("num-other-sentinels", 0)) >= 2 and int(s.get("num-slaves", 0)) >= 1
                        for s in sentinels
                    ):
                        return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica or Sentinels not ready; logs in {self.tmp}")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports) + f"/{SERVICE}/0"

    def primary_named(self) -> int | None:
        for port in self.sentinel_ports:
            try:
                addr = redis.Redis(port=port, socket_timeout=0.5).sentinel_get_master_addr_by_name(SERVICE)
                if addr:
                    return int(addr[1])  # type: ignore[index]
            except redis.RedisError:
                continue
        return None

    def stop(self) -> None:
        for p in self.processes.values():
            if p.poll() is None:
                p.terminate()
        for p in self.processes.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Trainer(threading.Thread):
    """Reads every rollout through a consumer group, reconnecting through the Sentinels after errors."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="trainer")
        self.url = url
        self.received: list[tuple[float, str]] = []
        self.errors = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        producer = Producer(connect(self.url), NAMESPACE)
        while not self.stop_event.is_set():
            try:
                for rollout in producer.rollouts(consumer="trainer", idle_timeout=0.5):
                    self.received.append((time.time(), rollout.rollout_id))
                    if self.stop_event.is_set():
                        return
            except redis.RedisError:
                self.errors += 1
                time.sleep(0.2)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


def wait_cost(port: int, rounds: int = 300) -> dict[str, Any]:
    """One enqueue's round trip with and without a following WAIT 1 (the replica acknowledging it)."""
    producer = Producer(redis.Redis(port=port), "wait-cost")
    client = redis.Redis(port=port)
    plain, waited = [], []
    for i in range(rounds):
        t = time.perf_counter()
        producer.enqueue({"i": i}, mode="train")
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        producer.enqueue({"i": i}, mode="train")
        acked = client.wait(1, 1000)
        waited.append(time.perf_counter() - t)
        assert acked >= 1
    plain.sort()
    waited.sort()
    return {
        "rounds": rounds,
        "enqueue_ms_median": round(1000 * plain[rounds // 2], 3),
        "enqueue_plus_wait_ms_median": round(1000 * waited[rounds // 2], 3),
        "enqueue_ms_p99": round(1000 * plain[int(rounds * 0.99)], 3),
        "enqueue_plus_wait_ms_p99": round(1000 * waited[int(rounds * 0.99)], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2400)
    parser.add_argument("--rate", type=float, default=80.0, help="tasks enqueued per second")
    parser.add_argument("--kill-after", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--deadline", type=float, default=90.0, help="seconds to wait for every rollout")
    parser.add_argument("--keep-logs", help="copy the servers' and workers' logs to this directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollq-failover-") as tmp:
        servers = Servers(Path(tmp))
        workers: list[subprocess.Popen[bytes]] = []
        result: dict[str, Any] = {}
        try:
            servers.start()
            url = servers.url
            producer = Producer(connect(url), NAMESPACE, policy=RolloutPolicy(unresponsive_seconds=5.0))
            trainer = Trainer(url)
            trainer.start()
            env = worker_env(ROLLQ_AGENT="bench.agents:MockLLMAgent")
            for i in range(args.workers):
                command = [ROLLQ, "--url", url, "--namespace", NAMESPACE, "worker", "--concurrency"]
                command += [str(args.concurrency), "--heartbeat-seconds", "1", "--name", f"fo-{i}"]
                command += ["--logging-level", "WARNING"]
                with open(Path(tmp) / f"worker-{i}.log", "wb") as log:
                    workers.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
            acked: list[str] = []
            enqueue_errors = 0
            started = time.monotonic()
            killed_at: float | None = None
            new_primary_at: float | None = None
            while len(acked) < args.tasks or killed_at is None:
                now = time.monotonic()
                if killed_at is None and now - started >= args.kill_after:
                    servers.processes["primary"].send_signal(signal.SIGKILL)
                    killed_at = time.time()
                if killed_at is not None and new_primary_at is None and servers.primary_named() == servers.replica_port:
                    new_primary_at = time.time()
                due = min(args.tasks, int((now - started) * args.rate))
                if len(acked) < due:
                    try:
                        batch = producer.enqueue_many([{"i": len(acked) + j} for j in range(10)], mode="train")
                        acked += [t.rollout_id for t in batch]
                    except redis.RedisError:
                        enqueue_errors += 1
                time.sleep(0.02)
            while new_primary_at is None:
                if servers.primary_named() == servers.replica_port:
                    new_primary_at = time.time()
                time.sleep(0.05)
            deadline = time.monotonic() + args.deadline
            while time.monotonic() < deadline:
                got = {rid for _, rid in trainer.received}
                if got >= set(acked):
                    break
                time.sleep(0.5)
            time.sleep(2.0)
            trainer.stop()
            for p in workers:
                p.send_signal(signal.SIGTERM)
            new = redis.Redis(port=servers.replica_port)
            keys = Keys(NAMESPACE)
            with new.pipeline(transaction=False) as pipe:
                for rid in acked:
                    pipe.hmget(keys.task(rid), "state", "claims")
                records = pipe.execute()
            stats = {k.decode(): v.decode() for k, v in new.hgetall(keys.stats).items()}  # type: ignore[union-attr]
            claims_after: Any = new.zrange(keys.inflight, 0, -1, withscores=True)
            missing = sorted(set(acked) - {rid for _, rid in trainer.received})[:5]
            # What the new primary says about rollouts the trainer never got: the first few, whole.
            unreceived = {
                rid: {k.decode(): v.decode()[:200] for k, v in new.hgetall(keys.task(rid)).items()}  # type: ignore[union-attr]
                for rid in missing
            }
            received_ids = [rid for _, rid in trainer.received]
            after_kill = [t for t, _ in trainer.received if t > killed_at]  # type: ignore[operator]
            resumed = min(after_kill) if after_kill else None
            # Stream ids are millisecond timestamps: the first entry the new primary got after the kill is
            # when workers published again, whatever the trainer was doing.
            first_new: Any = new.xrange(keys.results, min=f"{int(killed_at * 1000)}-0", count=1)  # type: ignore[operator]
            published = int(first_new[0][0].decode().split("-")[0]) / 1000 if first_new else None
            result |= {
                "tasks_enqueued_acknowledged": len(acked),
                "enqueue_errors_during_failover": enqueue_errors,
                "sentinel_named_new_primary_after_seconds": round(new_primary_at - killed_at, 2),  # type: ignore[operator]
                "workers_published_again_after_seconds": round(published - killed_at, 2) if published else None,  # type: ignore[operator]
                "trainer_received_again_after_seconds": round(resumed - killed_at, 2) if resumed else None,
                "tasks_lost": sum(1 for r in records if r[0] is None),
                "rollouts_never_received": len(set(acked) - set(received_ids)),
                "rollouts_received_twice": len(received_ids) - len(set(received_ids)),
                "tasks_run_more_than_once": sum(1 for r in records if r[1] and int(r[1]) > 1),
                "states_on_new_primary": {
                    s: sum(1 for r in records if (r[0] or b"missing").decode() == s)
                    for s in {(r[0] or b"missing").decode() for r in records}
                },
                "stats_on_new_primary": stats,
                "still_in_flight": [(m.decode(), round(score - time.time(), 1)) for m, score in claims_after[:5]],
                "unreceived_records": unreceived,
                "trainer_reconnects": trainer.errors,
                "workers_alive": sum(1 for p in workers if p.poll() is None),
            }
            print(result, flush=True)
        finally:
            for p in workers:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in workers:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            servers.stop()
            # What went wrong in the workers (each distinct line naming an error, with how often).
            errors: dict[str, int] = {}
            for log_path in Path(tmp).glob("worker-*.log"):
                for line in log_path.read_text(errors="replace").splitlines():
                    if ("Error" in line or line.startswith("rollq:")) and not line.startswith(" "):
                        key = line.split(" ", 2)[-1] if line[:4].isdigit() else line
                        errors[key[:200]] = errors.get(key[:200], 0) + 1
            result["worker_error_lines"] = errors
            if args.keep_logs:
                shutil.copytree(tmp, args.keep_logs, dirs_exist_ok=True)
        # WAIT's cost, on a fresh pair (primary + replica), no Sentinels needed.
        with tempfile.TemporaryDirectory(prefix="rollq-wait-") as tmp2:
            pair = Servers(Path(tmp2))
            try:
                pair._start("primary", ["--port", str(pair.primary_port), "--bind", "127.0.0.1", "--save", ""])
                pair._start(
                    "replica",
                    [
                        "--port",
                        str(pair.replica_port),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                        "--replicaof",
                        "127.0.0.1",
                        str(pair.primary_port),
                    ],
                )
                replica = redis.Redis(port=pair.replica_port)
                while True:
                    try:
                        if replica.info("replication").get("master_link_status") == "up":
                            break
                    except redis.ConnectionError:
                        pass
                    time.sleep(0.1)
                cost = wait_cost(pair.primary_port)
            finally:
                pair.stop()
        print(cost, flush=True)
    write_result(
        "failover",
        {
            "settings": {
                "tasks": args.tasks,
                "rate_per_s": args.rate,
                "kill_after_seconds": args.kill_after,
                "workers": args.workers,
                "concurrency": args.concurrency,
                "heartbeat_seconds": 1,
                "unresponsive_seconds": 5,
                "sentinel_down_after_ms": 1000,
                "quorum": 2,
            },
            **result,
            "wait_cost": cost,
        },
        sys.argv[1:],
    )


if __name__ == "__main__":
    main()
