"""Redis failover under load, at default and tuned settings: a primary, a replica, 3 Sentinels; SIGKILL the primary.

Run: nice -n 10 python bench/failover.py [--profiles defaults,tuned,tuned-no-wait] [--tasks 2400] [--rate 80]
     [--runs 1] [--kill-after 10] [--workers 2] [--concurrency 32] [--replica-rtt-ms 10] [--wait-timeout-ms 1000]
     [--no-cost]

Profiles (``--runs`` failovers each, e.g. ``--runs 20`` or ``--runs defaults=20,tuned=5``; each profile's
settings, defaults resolved to their values, are written next to its figures):

- ``defaults``: what a deployment gets without tuning anything: Sentinel ``down-after-milliseconds`` 30000
  (Redis's default), the workers' default heartbeat and the policy's default ``unresponsive_seconds``, and
  ``wait_replicas`` unset (one replica behind a Sentinel URL). The old primary restarts 45 s after the kill,
  once the Sentinels have failed over (restarted empty sooner, it would be primary again with nothing).
- ``tuned``: down-after 1000 ms, 1 s heartbeats, ``unresponsive_seconds`` 5, ``wait_replicas`` unset; the old
  primary restarts 5 s after the kill.
- ``tuned-no-wait``: ``tuned`` with ``wait_replicas=0`` everywhere (what 0.2 did by default).

Everything is local and private: redis-servers and ``redis-server --sentinel`` processes on free
ports of 127.0.0.1, each in a temporary directory (no persistence), stopped at the end. rollq connects
only through the Sentinels, with ``redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/rollq/0``
(store/connection.py): the producer, the trainer (a consumer-group reader) and ``rollq worker``
processes running the mock-LLM agent (3 turns x U(0.1, 0.5) s), 1 s heartbeats, tasks with
``unresponsive_seconds`` 5. The replica follows the primary through a delaying TCP proxy
(bench/delay_proxy.py, ``--replica-rtt-ms``), as a replica in another zone does: on loopback the
replication lag is microseconds and a failover has nothing to lose. The producer enqueues ``--rate``
tasks per second in batches of 10 until ``--tasks``; ``--kill-after`` seconds in, the primary and its
end of the replication link (the proxy) get SIGKILL; ``--rejoin-after`` seconds later the old primary
restarts empty and the Sentinels make it a replica of the new one. Sentinels: quorum 2.

Reported for each run: when the Sentinels named the new primary, how long until work resumed, tasks
whose enqueue Redis acknowledged but which the new primary does not hold (lost tasks), rollouts never received,
rollouts received twice (after the trainer's own de-duplication by rollout id and generation: what a training
loop sees), tasks run more than once, transitions that fell short of wait_replicas, workers that went degraded
(no replica: transitions stop waiting until one is back), the stats the new primary holds. Then each
transition's cost: one enqueue's latency and the no-op rollouts/s of one worker, with and without
wait_replicas=1, with the replica on loopback and ``--replica-rtt-ms`` away. For each profile, over its runs:
tasks lost (total, worst run), rollouts received twice and tasks run twice (total, runs with any), and the
median and worst of each time. Writes bench/results/failover.json after every run (``"complete": false``
until the last).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.common import free_port, rate, worker_env, write_result  # noqa: E402
from bench.settings import resolved_settings  # noqa: E402
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
        self.proxy: subprocess.Popen[bytes] | None = None

    def _start(self, name: str, args: list[str]) -> None:
        directory = self.tmp / name
        directory.mkdir()
        with open(directory / "log", "wb") as log:
            self.processes[name] = subprocess.Popen(
                [self.binary, *args, "--dir", str(directory)], stdout=log, stderr=subprocess.STDOUT
            )

    def start(
        self,
        replica_rtt_ms: float = 0.0,
        sentinels: bool = True,
        down_after_ms: int = 1000,
        *,
        rtt_file: Path | None = None,
        failover_timeout_ms: int = 60000,
    ) -> None:
        """The servers; with ``replica_rtt_ms`` > 0 (or an ``rtt_file``, which the proxy reads again four times a
        second: a lag set during the run) the replica reaches the primary through a delaying proxy
        (bench/delay_proxy.py), the replication link of a replica in another zone."""
        common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self._start("primary", ["--port", str(self.primary_port), *common])
        upstream = self.primary_port
        if replica_rtt_ms > 0 or rtt_file is not None:
            upstream = free_port()
            delay = ["--rtt-ms", str(replica_rtt_ms)] + (["--rtt-file", str(rtt_file)] if rtt_file else [])
            self.proxy = subprocess.Popen(
                [sys.executable, str(Path(__file__).parent / "delay_proxy.py"), "--listen", f"127.0.0.1:{upstream}"]
                + ["--upstream", f"127.0.0.1:{self.primary_port}", *delay],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            time.sleep(0.5)
        self._start("replica", ["--port", str(self.replica_port), *common, "--replicaof", "127.0.0.1", str(upstream)])
        for i, port in enumerate(self.sentinel_ports if sentinels else []):
            config = self.tmp / f"sentinel-{i}.conf"
            # failover-timeout (60 s): Sentinels "fix" a replica that follows another address than the primary's
            # (here: the proxy) once failover-timeout has passed; the run is over by then.
            config.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self._start(f"sentinel-{i}", [str(config), "--sentinel"])
        replica = redis.Redis(port=self.replica_port)
        deadline = time.monotonic() + 30
        while True:
            try:
                if dict(replica.info("replication")).get("master_link_status") == "up":  # type: ignore[arg-type]
                    if not sentinels:
                        return
                    sentinels_seen: list[Any] = [
                        redis.Redis(port=p).sentinel_master(SERVICE) for p in self.sentinel_ports
                    ]
                    if all(
                        int(s.get("num-other-sentinels", 0)) >= 2 and int(s.get("num-slaves", 0)) >= 1
                        for s in sentinels_seen
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

    def kill_primary_host(self) -> None:
        """SIGKILL the primary and its end of the replication link: what was still on the wire is lost."""
        self.processes["primary"].send_signal(signal.SIGKILL)
        if self.proxy is not None:
            self.proxy.send_signal(signal.SIGKILL)

    def restart_old_primary(self) -> None:
        """Start the killed primary again, empty, as an operator would; the Sentinels make it a replica."""
        self.processes["primary"].wait()
        common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        (self.tmp / "primary").rename(self.tmp / f"primary-killed-{time.monotonic_ns()}")
        self._start("primary", ["--port", str(self.primary_port), *common])

    def stop(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.kill()
            self.proxy.wait()
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

    def __init__(self, url: str, namespace: str = NAMESPACE) -> None:
        super().__init__(daemon=True, name="trainer")
        self.url = url
        self.namespace = namespace
        self.received: list[tuple[float, str]] = []
        self.statuses: Counter[str] = Counter()
        self.errors = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        producer = Producer(connect(self.url), self.namespace)
        # One reader for the whole run, iterated again after an error: it remembers what it handed over and
        # skips a second copy of a run (see producer/results.py, Delivered).
        reader = producer.rollouts(consumer="trainer", idle_timeout=0.5)
        while not self.stop_event.is_set():
            try:
                for rollout in reader:
                    self.received.append((time.time(), rollout.rollout_id))
                    self.statuses[str(rollout.metadata.get("status", "?"))] += 1
                    if self.stop_event.is_set():
                        return
            except redis.RedisError:
                self.errors += 1
                time.sleep(0.2)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


def shortfalls_in_logs(paths: list[Path]) -> int:
    """Transitions the workers' logs say fell short of wait_replicas (each log line carries the running count)."""
    total = 0
    for path in paths:
        counts = [int(m) for m in re.findall(r"\((\d+) such transitions so far\)", path.read_text(errors="replace"))]
        total += max(counts, default=0)
    return total


PROFILES: dict[str, dict[str, Any]] = {
    # None: not set, the default applies (wait_replicas: 1 behind Sentinel; heartbeat and unresponsive_seconds:
    # WorkerSettings' and RolloutPolicy's).
    "defaults": {
        "sentinel_down_after_ms": 30000,
        "heartbeat_seconds": None,
        "unresponsive_seconds": None,
        "wait_replicas": None,
        "rejoin_after_seconds": 45.0,
    },
    "tuned": {
        "sentinel_down_after_ms": 1000,
        "heartbeat_seconds": 1.0,
        "unresponsive_seconds": 5.0,
        "wait_replicas": None,
        "rejoin_after_seconds": 5.0,
    },
    "tuned-no-wait": {
        "sentinel_down_after_ms": 1000,
        "heartbeat_seconds": 1.0,
        "unresponsive_seconds": 5.0,
        "wait_replicas": 0,
        "rejoin_after_seconds": 5.0,
    },
}


def failover_run(args: argparse.Namespace, profile: str, tmp: Path) -> dict[str, Any]:
    """One failover under load at ``profile``'s settings; what it lost and when work resumed."""
    settings = PROFILES[profile]
    wait_replicas = settings["wait_replicas"]
    servers = Servers(tmp)
    workers: list[subprocess.Popen[bytes]] = []
    result: dict[str, Any] = {"profile": profile, "settings": settings}
    try:
        servers.start(args.replica_rtt_ms, down_after_ms=settings["sentinel_down_after_ms"])
        url = servers.url
        unresponsive = settings["unresponsive_seconds"]
        producer = Producer(
            connect(url),
            NAMESPACE,
            policy=RolloutPolicy(unresponsive_seconds=unresponsive) if unresponsive else RolloutPolicy(),
            wait_replicas=wait_replicas,
            wait_timeout_ms=args.wait_timeout_ms,
        )
        result["producer_wait_replicas"] = producer.lifecycle.wait_replicas
        trainer = Trainer(url)
        trainer.start()
        env = worker_env(ROLLQ_AGENT="bench.agents:MockLLMAgent", ROLLQ_WAIT_TIMEOUT_MS=str(args.wait_timeout_ms))
        if wait_replicas is not None:
            env["ROLLQ_WAIT_REPLICAS"] = str(wait_replicas)
        else:
            env.pop("ROLLQ_WAIT_REPLICAS", None)
        for i in range(args.workers):
            command = [ROLLQ, "--url", url, "--namespace", NAMESPACE, "worker", "--concurrency"]
            command += [str(args.concurrency), "--name", f"fo-{i}"]
            if settings["heartbeat_seconds"]:
                command += ["--heartbeat-seconds", str(settings["heartbeat_seconds"])]
            command += ["--logging-level", "WARNING"]
            with open(tmp / f"worker-{i}.log", "wb") as log:
                workers.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
        acked: list[str] = []
        batch_ms_before_kill: list[float] = []
        enqueue_errors = 0
        started = time.monotonic()
        killed_at: float | None = None
        events: dict[str, float] = {}
        new = redis.Redis(port=servers.replica_port, socket_timeout=2)

        def watch() -> None:
            """Note when the Sentinels name the replica, restart the old primary, note when it replicates again."""
            if killed_at is None:
                return
            if "new_primary" not in events and servers.primary_named() == servers.replica_port:
                events["new_primary"] = time.time()
            if "restarted" not in events and time.time() - killed_at >= settings["rejoin_after_seconds"]:
                servers.restart_old_primary()
                events["restarted"] = time.time()
            if "restarted" in events and "rejoined" not in events:
                with contextlib.suppress(redis.RedisError):
                    info: Any = new.info("replication")
                    if info.get("role") == "master" and info.get("slave0", {}).get("state") == "online":
                        events["rejoined"] = time.time()

        while len(acked) < args.tasks or killed_at is None:
            now = time.monotonic()
            if killed_at is None and now - started >= args.kill_after:
                servers.kill_primary_host()
                killed_at = time.time()
            watch()
            due = min(args.tasks, int((now - started) * args.rate))
            if len(acked) < due:
                try:
                    sent = time.perf_counter()
                    batch = producer.enqueue_many([{"i": len(acked) + j} for j in range(10)], mode="train")
                    if killed_at is None:
                        batch_ms_before_kill.append(1000 * (time.perf_counter() - sent))
                    acked += [t.rollout_id for t in batch]
                except redis.RedisError:
                    enqueue_errors += 1
            time.sleep(0.02)
        deadline = time.monotonic() + args.deadline
        while time.monotonic() < deadline:
            watch()
            if {rid for _, rid in trainer.received} >= set(acked) and "rejoined" in events:
                break
            time.sleep(0.5)
        time.sleep(2.0)
        trainer.stop()
        for p in workers:
            p.send_signal(signal.SIGTERM)
        assert killed_at is not None
        keys = Keys(NAMESPACE)
        with new.pipeline(transaction=False) as pipe:
            for rid in acked:
                pipe.hmget(keys.task(rid), "state", "claims")
            records = pipe.execute()
        stats = {k.decode(): v.decode() for k, v in new.hgetall(keys.stats).items()}  # type: ignore[union-attr]
        received_ids = [rid for _, rid in trainer.received]
        after_kill = [t for t, _ in trainer.received if t > killed_at]
        first_new: Any = new.xrange(keys.results, min=f"{int(killed_at * 1000)}-0", count=1)
        published = int(first_new[0][0].decode().split("-")[0]) / 1000 if first_new else None

        def since_kill(at: float | None) -> float | None:
            return round(at - killed_at, 2) if at is not None else None  # type: ignore[operator]

        batch_ms_before_kill.sort()
        result |= {
            "enqueue_batch_of_10_ms_median_before_kill": round(batch_ms_before_kill[len(batch_ms_before_kill) // 2], 2),
            "tasks_enqueued_acknowledged": len(acked),
            "enqueue_errors_during_failover": enqueue_errors,
            "sentinel_named_new_primary_after_seconds": since_kill(events.get("new_primary")),
            "workers_published_again_after_seconds": since_kill(published),
            "trainer_received_again_after_seconds": since_kill(min(after_kill) if after_kill else None),
            "old_primary_restarted_after_seconds": since_kill(events.get("restarted")),
            "old_primary_replicating_again_after_seconds": since_kill(events.get("rejoined")),
            "tasks_lost": sum(1 for r in records if r[0] is None),
            "rollouts_never_received": len(set(acked) - set(received_ids)),
            "rollouts_received_twice": len(received_ids) - len(set(received_ids)),
            "tasks_run_more_than_once": sum(1 for r in records if r[1] and int(r[1]) > 1),
            "states_on_new_primary": {
                s: sum(1 for r in records if (r[0] or b"missing").decode() == s)
                for s in {(r[0] or b"missing").decode() for r in records}
            },
            "stats_on_new_primary": {k: v for k, v in stats.items() if not k.startswith(("duration", "reward"))},
            "producer_replication_shortfalls": producer.lifecycle.replication_shortfalls,
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
        logs = sorted(tmp.glob("worker-*.log"))
        result["worker_replication_shortfalls"] = shortfalls_in_logs(logs)
        result["workers_that_went_degraded"] = sum(
            "Degraded: transitions no longer wait" in p.read_text() for p in logs
        )
        result["workers_that_waited_again"] = sum("online again after" in p.read_text() for p in logs)
        # What went wrong in the workers (each distinct line naming an error, with how often).
        errors: dict[str, int] = {}
        for log_path in logs:
            for line in log_path.read_text(errors="replace").splitlines():
                if ("Error" in line or line.startswith("rollq:")) and not line.startswith(" "):
                    key = line.split(" ", 2)[-1] if line[:4].isdigit() else line
                    errors[key[:200]] = errors.get(key[:200], 0) + 1
        result["worker_error_lines"] = errors
        anomalous = any(result.get(k) for k in ("tasks_lost", "rollouts_received_twice", "tasks_run_more_than_once"))
        keep = args.keep_logs or (args.anomaly_logs if anomalous or "tasks_lost" not in result else None)
        if keep:  # a run that lost or duplicated something keeps its logs to find out why
            result["logs"] = str(Path(keep) / f"{profile}-{time.strftime('%H%M%S')}")
            shutil.copytree(tmp, result["logs"], dirs_exist_ok=True)
    return result


def transition_cost(replica_rtt_ms: float, tasks: int, rounds: int) -> dict[str, Any]:
    """With and without wait_replicas=1 on a primary and one replica (``replica_rtt_ms`` apart): one enqueue's
    latency, and the rollouts/s of one worker (concurrency 16) running no-op rollouts, where rollq's own
    transitions are all the work."""
    with tempfile.TemporaryDirectory(prefix="rollq-wait-") as directory:
        pair = Servers(Path(directory))
        try:
            pair.start(replica_rtt_ms, sentinels=False)
            url = f"redis://127.0.0.1:{pair.primary_port}/0"
            producers = {w: Producer(connect(url), f"cost-{w}", wait_replicas=w) for w in (0, 1)}
            latency: dict[int, list[float]] = {0: [], 1: []}
            for i in range(rounds):
                for w, producer in producers.items():  # interleaved, so drift hits both alike
                    t = time.perf_counter()
                    producer.enqueue({"i": i}, mode="train")
                    latency[w].append(1000 * (time.perf_counter() - t))
            assert all(p.lifecycle.replication_shortfalls == 0 for p in producers.values())
            rates = {w: worker_rate(url, w, tasks, Path(directory)) for w in (0, 1)}
        finally:
            pair.stop()
    out: dict[str, Any] = {"replica_rtt_ms": replica_rtt_ms, "enqueue_rounds": rounds, "rollouts": tasks}
    for w in (0, 1):
        values = sorted(latency[w])
        out[f"wait_replicas_{w}"] = {
            "enqueue_ms_median": round(values[len(values) // 2], 3),
            "enqueue_ms_p99": round(values[int(len(values) * 0.99)], 3),
            "worker_rollouts_per_s": rates[w],
        }
    return out


def worker_rate(url: str, wait_replicas: int, tasks: int, log_dir: Path) -> float:
    """No-op rollouts/s of one worker process (concurrency 16) at ``wait_replicas``, after a warm-up."""
    namespace = f"rate-{wait_replicas}"
    producer = Producer(connect(url), namespace)
    env = worker_env(ROLLQ_AGENT="bench.agents:NoopAgent", ROLLQ_WAIT_REPLICAS=str(wait_replicas))

    command = [ROLLQ, "--url", url, "--namespace", namespace, "worker", "--concurrency", "16"]
    command += ["--logging-level", "WARNING"]
    with open(log_dir / f"rate-{wait_replicas}.log", "wb") as log:
        worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        producer.wait([t.rollout_id for t in producer.enqueue_many([{"warm": i} for i in range(50)])], timeout=120)
        ids = [t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(tasks)])]
        started = time.perf_counter()
        producer.wait(ids, timeout=600)
        return rate(tasks, time.perf_counter() - started)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)


def parse_runs(text: str, profiles: list[str]) -> dict[str, int]:
    """``--runs``: one count for every profile (``20``) or per profile (``defaults=20,tuned=5``; others 1)."""
    if text.isdigit():
        return {p: int(text) for p in profiles}
    counts = {p: 1 for p in profiles}
    for part in text.split(","):
        name, _, count = part.partition("=")
        if name not in counts or not count.isdigit():
            raise SystemExit(f"--runs: expected N or profile=N,... over {profiles}, got {part!r}")
        counts[name] = int(count)
    return counts


def effective_settings(profile: str, args: argparse.Namespace) -> dict[str, Any]:
    """The settings a profile's runs had, defaults resolved to their values: what its figures depend on."""
    chosen = PROFILES[profile]
    return {
        "sentinel_down_after_milliseconds": chosen["sentinel_down_after_ms"],
        "sentinel_quorum": 2,
        "sentinel_failover_timeout_ms": 60000,
        **resolved_settings(
            heartbeat_seconds=chosen["heartbeat_seconds"],
            unresponsive_seconds=chosen["unresponsive_seconds"],
            url_scheme="redis+sentinel",
        ),
        "wait_replicas": 1 if chosen["wait_replicas"] is None else chosen["wait_replicas"],
        "wait_replicas_from": "default behind Sentinel" if chosen["wait_replicas"] is None else "profile",
        "wait_timeout_ms": args.wait_timeout_ms,
        "sentinel_client_timeout_seconds": 1.0,
        "old_primary_restarted_after_seconds": chosen["rejoin_after_seconds"],
        "replica_rtt_ms": args.replica_rtt_ms,
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One profile's runs summed up: losses and duplicates over all of them, resume times' median and worst."""
    done = [r for r in runs if "tasks_lost" in r]

    def values(key: str) -> list[float]:
        return [r[key] for r in done if r.get(key) is not None]

    def total(key: str) -> int:
        return int(sum(values(key)))

    def runs_with(key: str) -> int:
        return sum(1 for v in values(key) if v > 0)

    out: dict[str, Any] = {
        "runs": len(runs),
        "runs_completed": len(done),
        "runs_failed": [r.get("error") for r in runs if "tasks_lost" not in r],
        "tasks_enqueued_acknowledged_total": total("tasks_enqueued_acknowledged"),
        "tasks_lost_total": total("tasks_lost"),
        "tasks_lost_max_in_a_run": int(max(values("tasks_lost"), default=0)),
        "rollouts_never_received_total": total("rollouts_never_received"),
        "rollouts_received_twice_total": total("rollouts_received_twice"),
        "runs_with_a_rollout_received_twice": runs_with("rollouts_received_twice"),
        "tasks_run_more_than_once_total": total("tasks_run_more_than_once"),
        "runs_with_a_task_run_twice": runs_with("tasks_run_more_than_once"),
        "enqueue_errors_during_failover_total": total("enqueue_errors_during_failover"),
        "runs_with_workers_degraded": runs_with("workers_that_went_degraded"),
        "workers_alive_at_end_min": int(min(values("workers_alive"), default=0)),
    }
    for key in (
        "sentinel_named_new_primary_after_seconds",
        "workers_published_again_after_seconds",
        "trainer_received_again_after_seconds",
        "old_primary_replicating_again_after_seconds",
        "enqueue_batch_of_10_ms_median_before_kill",
    ):
        measured = values(key)
        out[key] = {"p50": _percentile(measured, 0.5), "max": max(measured, default=None), "runs": len(measured)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2400)
    parser.add_argument("--rate", type=float, default=80.0, help="tasks enqueued per second")
    parser.add_argument("--kill-after", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--replica-rtt-ms", type=float, default=10.0, help="round trip of the replication link")
    parser.add_argument("--profiles", default="defaults,tuned", help="comma-separated: " + ", ".join(PROFILES))
    parser.add_argument("--runs", default="1", help="failovers per profile: N, or profile=N,... (others 1)")
    parser.add_argument("--no-cost", action="store_true", help="skip the per-transition cost measures")
    parser.add_argument("--wait-timeout-ms", type=int, default=1000)
    parser.add_argument("--cost-tasks", type=int, default=1000, help="no-op rollouts per worker rollouts/s run")
    parser.add_argument("--cost-rounds", type=int, default=300, help="single enqueues per latency measure")
    parser.add_argument("--deadline", type=float, default=120.0, help="seconds to wait for every rollout")
    parser.add_argument("--keep-logs", help="copy the servers' and workers' logs to this directory")
    parser.add_argument(
        "--anomaly-logs",
        default=str(Path(tempfile.gettempdir()) / "rollq-failover-anomalies"),
        help="where the logs of a run that lost, duplicated or broke are copied",
    )
    parser.add_argument("--output", default="failover", help="results file name under bench/results/")
    args = parser.parse_args()
    profiles = args.profiles.split(",")
    unknown = [p for p in profiles if p not in PROFILES]
    if unknown:
        raise SystemExit(f"unknown profiles {unknown}; known: {', '.join(PROFILES)}")
    counts = parse_runs(args.runs, profiles)
    results: dict[str, dict[str, Any]] = {
        p: {"settings": effective_settings(p, args), "aggregate": {}, "runs": []} for p in profiles
    }
    cost: list[dict[str, Any]] = []

    def write(complete: bool) -> None:
        for entry in results.values():
            entry["aggregate"] = aggregate(entry["runs"])
        write_result(
            args.output,
            {
                "complete": complete,
                "run_settings": {
                    "tasks_per_run": args.tasks,
                    "rate_per_s": args.rate,
                    "kill_after_seconds": args.kill_after,
                    "workers": args.workers,
                    "concurrency": args.concurrency,
                    "runs_per_profile": counts,
                },
                "profiles": results,
                "transition_cost": cost,
            },
            sys.argv[1:],
            settings=vars(args),
        )

    for profile in profiles:
        for i in range(counts[profile]):
            with tempfile.TemporaryDirectory(prefix="rollq-failover-") as tmp:
                try:
                    run = failover_run(args, profile, Path(tmp))
                except Exception as exc:  # one broken run is a figure too; the others still run
                    run = {"profile": profile, "error": f"{type(exc).__name__}: {exc}"[:500]}
            run["run"] = i + 1
            run.pop("settings", None)  # the profile's settings are written once, next to its aggregate
            results[profile]["runs"].append(run)
            write(complete=False)
            print(profile, i + 1, aggregate(results[profile]["runs"]), flush=True)
    if not args.no_cost:
        cost = [transition_cost(rtt, args.cost_tasks, args.cost_rounds) for rtt in sorted({0.0, args.replica_rtt_ms})]
        print(cost, flush=True)
    write(complete=True)


if __name__ == "__main__":
    main()
