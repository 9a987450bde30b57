"""The measurements, from the driver: one round-trip setting with its own fleet, or one fleet across settings.

The driver starts the proxies, the producer process and the workers, and reads CPU (workers, proxies, Redis)
and load around the window the producer announces; the producer measures Redis and the rollouts received.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import threading
import time
from typing import Any

import psutil

from bench.cluster.fleet import first_claim_summary, fleet_env, worker_command, worker_memory
from bench.cluster.network import (
    PROXY_PORT,
    PYTHON,
    Cluster,
    ping_rtt_ms,
    proxy_stats,
    start_proxies,
    write_rtt,
)
from bench.common import ROOT, sum_over, worker_env
from bench.settings import resolved_settings

MEAN_ROLLOUT_SECONDS = 0.9
DEAD_HOST_PROFILES: dict[str, dict[str, float | None]] = {
    # None: not set, rollq's default applies (WorkerSettings' heartbeat, RolloutPolicy's unresponsive_seconds).
    "defaults": {"heartbeat_seconds": None, "unresponsive_seconds": None},
    "tuned": {"heartbeat_seconds": 1.0, "unresponsive_seconds": 6.0},
}
"""The dead-host phase's profiles (``--profiles``): every rollq default, or heartbeats and reaping tuned fast."""
PROXIED_URL = f"redis://127.0.0.1:{PROXY_PORT}/0"


class Lines(threading.Thread):
    """The producer process's stdout, line by line, into a queue."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream, self.lines = stream, queue.Queue[str]()

    def run(self) -> None:
        for raw in self.stream:
            self.lines.put(raw.decode().rstrip("\n"))

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty as exc:
                raise RuntimeError(f"the producer process did not say {prefix!r} within {timeout:.0f} s") from exc
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
            if line.startswith("ERROR"):
                raise RuntimeError(f"producer process: {line}")


def start_producer(cluster: Cluster, options: list[str], log: str) -> tuple[subprocess.Popen[bytes], Lines]:
    """The producer role in the producer namespace, its stdout read line by line."""
    command = [PYTHON, "-m", "bench.cluster", "--role", "producer", "--url", cluster.producer_url, *options]
    with open(cluster.tmp / log, "wb") as err:
        producer = subprocess.Popen(
            ["ip", "netns", "exec", cluster.producer_ns, *command],
            stdout=subprocess.PIPE,
            stderr=err,
            env=worker_env(),
            cwd=ROOT,
        )
    cluster.processes.append(producer)
    lines = Lines(producer.stdout)
    lines.start()
    return producer, lines


def cpu(group: list[psutil.Process]) -> float:
    return sum_over(group, lambda p: sum(p.cpu_times()[:2]))


def dead_host_settings(profile: str) -> dict[str, Any]:
    """A dead-host profile's settings, defaults resolved to their values (bench/settings.py, as failover.py)."""
    return resolved_settings(**DEAD_HOST_PROFILES[profile])


def run_setting(
    cluster: Cluster,
    args: argparse.Namespace,
    rtt: str,
    dead_host: bool,
    profile: str = "tuned",
    outage: float = 0.0,
) -> dict[str, Any]:
    """One round-trip setting ('direct': no proxy) with a fleet started for it; with ``dead_host``, host 0's link
    goes down for ``outage`` seconds during the window, the heartbeat and policy those of ``profile``."""
    via_proxy = rtt != "direct"
    rtt_ms = 0.0 if rtt == "direct" else float(rtt)
    for path in cluster.tmp.glob("proxy-*.json"):
        path.unlink()
    proxies = start_proxies(cluster, str(rtt_ms), jitter=True) if via_proxy else []
    measured_rtt = ping_rtt_ms(cluster, 0, via_proxy)
    chosen = DEAD_HOST_PROFILES[profile] if dead_host else {}
    namespace = f"c{rtt.replace('.', '_')}" + (f"-dead-{profile}-{outage:g}" if dead_host else "")
    in_flight = cluster.hosts * args.workers_per_host * args.concurrency
    options = ["--namespace", namespace, "--in-flight", str(in_flight),
               "--workers", str(cluster.hosts * args.workers_per_host), "--window", str(args.window)]  # fmt: skip
    if dead_host:
        options += ["--dead-host-tasks", str(args.dead_host_tasks), "--outage", str(outage)]
        options += ["--link-down", f"{cluster.redis_ns}:{cluster.redis_end(0)}"]
        if chosen["unresponsive_seconds"] is not None:
            options += ["--unresponsive-seconds", str(chosen["unresponsive_seconds"])]
    producer, lines = start_producer(cluster, options, f"producer-{namespace}.log")
    lines.expect("QUEUED", 60)
    workers: list[subprocess.Popen[bytes]] = []
    started: dict[str, float] = {}
    heartbeat = chosen.get("heartbeat_seconds")
    env = fleet_env(args.concurrency, **({"ROLLQ_HEARTBEAT_SECONDS": f"{heartbeat:g}"} if heartbeat else {}))
    # Round-robin over the hosts, so a staggered start fills every host alike.
    for j in range(args.workers_per_host):
        for i, ns in enumerate(cluster.host_ns):
            url = PROXIED_URL if via_proxy else cluster.redis_url(i)
            name = f"h{i}w{j}-{namespace}"
            started[name] = time.time()
            workers.append(cluster.spawn(ns, worker_command(url, name, namespace), f"worker-{name}.log", env))
            if args.stagger:
                time.sleep(args.stagger)
    try:
        ps = [psutil.Process(p.pid) for p in workers]
        px = [psutil.Process(p.pid) for p in proxies]
        redis_proc = psutil.Process(cluster.redis.pid)  # type: ignore[union-attr]
        lines.expect("WINDOW_START", max(180, 2 * len(workers)))
        w0, p0, r0, s0 = cpu(ps), cpu(px), sum(redis_proc.cpu_times()[:2]), proxy_stats(cluster)
        load0 = os.getloadavg()
        lines.expect("WINDOW_END", args.window + 600)
        w1, p1, r1, s1 = cpu(ps), cpu(px), sum(redis_proc.cpu_times()[:2]), proxy_stats(cluster)
        load1 = os.getloadavg()
        memory = worker_memory(ps)
        result: dict[str, Any] = json.loads(lines.expect("RESULT", 120))
        alive = {f"h{i}": [] for i in range(cluster.hosts)}  # type: dict[str, list[bool]]
        for name, p in zip(started, workers, strict=True):
            alive[name.split("w", 1)[0]].append(p.poll() is None)
    finally:
        cluster.stop(workers, timeout=30)
        cluster.stop(proxies, timeout=5)
        cluster.stop([producer], timeout=5)
    done = max(result["rollouts_in_window"], 1)
    claims = result.get("first_claim", {})
    row: dict[str, Any] = {
        **(
            {"profile": profile, "outage_asked_seconds": outage, "settings": dead_host_settings(profile)}
            if dead_host
            else {}
        ),  # fmt: skip
        "rtt_setting": rtt,
        "rtt_ms_asked": rtt_ms if via_proxy else None,
        "ping_rtt_ms_measured": measured_rtt,
        "hosts": cluster.hosts,
        "worker_processes": len(workers),
        "in_flight": in_flight,
        **{k: v for k, v in result.items() if k != "first_claim"},
        "worker_cpu_ms_per_rollout": round(1000 * (w1 - w0) / done, 2),
        "redis_cpu_ms_per_rollout": round(1000 * (r1 - r0) / done, 3),
        "redis_cpu_cores": round((r1 - r0) / result["window_seconds"], 3),
        "proxy_cpu_ms_per_rollout": round(1000 * (p1 - p0) / done, 2) if via_proxy else None,
        "client_writes_per_rollout": round((s1.get("up_chunks", 0) - s0.get("up_chunks", 0)) / done, 1)
        if via_proxy
        else None,
        "seconds_to_first_claim": first_claim_summary([claims[n] - t0 for n, t0 in started.items() if n in claims]),
        "redis_connections_per_worker_process": round(result["redis_connections"] / len(workers), 2),
        "load_average_1m": {"window_start": round(load0[0], 2), "window_end": round(load1[0], 2)},
        "worker_memory_mb": memory,
        "workers_alive_at_end": alive,
    }
    if not dead_host:
        row["ideal_rollouts_per_s"] = round(in_flight / MEAN_ROLLOUT_SECONDS, 1)
        row["percent_of_ideal"] = round(100 * row["rollouts_per_s"] / row["ideal_rollouts_per_s"], 1)
    print(json.dumps(row), flush=True)
    return row


def run_kept(cluster: Cluster, args: argparse.Namespace, settings: list[str]) -> list[dict[str, Any]]:
    """Start the fleet once and measure it at each round trip in turn: the proxies change their delay in place.

    Starting 256 processes costs about 150 CPU-seconds of imports here, too much to repeat per setting. Time to
    first claim is measured for the whole fleet at the first setting, and at each later one for host 0's
    processes, restarted under the new round trip while the rest keep working.
    """
    rtt_files = [cluster.tmp / f"rtt-{i}" for i in range(cluster.hosts)]
    for path in rtt_files:
        write_rtt(path, float(settings[0]))
    proxies = start_proxies(cluster, settings[0], rtt_files=rtt_files)
    namespace = "kept"
    processes = cluster.hosts * args.workers_per_host
    in_flight = processes * args.concurrency
    options = ["--namespace", namespace, "--in-flight", str(in_flight), "--workers", str(processes),
               "--window", str(args.window), "--schedule", ",".join(settings), "--rtt-dir", str(cluster.tmp),
               "--hosts", str(cluster.hosts)]  # fmt: skip
    producer, lines = start_producer(cluster, options, "producer-kept.log")
    lines.expect("QUEUED", 60)
    workers: dict[str, subprocess.Popen[bytes]] = {}  # the running ones, by name
    env = fleet_env(args.concurrency)

    def spawn(host: int, j: int, suffix: str) -> tuple[str, float]:
        name = f"h{host}w{j}{suffix}-{namespace}"
        at = time.time()
        command = worker_command(PROXIED_URL, name, namespace)
        workers[name] = cluster.spawn(cluster.host_ns[host], command, f"worker-{name}.log", env)
        if args.stagger:
            time.sleep(args.stagger)
        return name, at

    rows: list[dict[str, Any]] = []
    redis_proc = psutil.Process(cluster.redis.pid)  # type: ignore[union-attr]
    px = [psutil.Process(p.pid) for p in proxies]
    try:
        for k, rtt in enumerate(settings):
            lines.expect("SETTING", 120)
            fresh: dict[str, float] = {}
            if k == 0:
                for j in range(args.workers_per_host):  # round-robin over the hosts
                    for i in range(cluster.hosts):
                        name, at = spawn(i, j, "")
                        fresh[name] = at
            else:
                host0 = [n for n in workers if n.startswith("h0w")]
                cluster.stop([workers.pop(n) for n in host0], timeout=30)
                for j in range(args.workers_per_host):
                    name, at = spawn(0, j, f"r{k}")
                    fresh[name] = at
            (cluster.tmp / f"go-{k}").touch()
            measured_rtt = ping_rtt_ms(cluster, 0, True)
            ps = [psutil.Process(p.pid) for p in workers.values()]
            lines.expect("WINDOW_START", max(180, 2 * len(fresh)))
            w0, p0, r0, s0 = cpu(ps), cpu(px), sum(redis_proc.cpu_times()[:2]), proxy_stats(cluster)
            load0 = os.getloadavg()
            lines.expect("WINDOW_END", args.window + 600)
            w1, p1, r1, s1 = cpu(ps), cpu(px), sum(redis_proc.cpu_times()[:2]), proxy_stats(cluster)
            load1 = os.getloadavg()
            memory = worker_memory(ps)
            result: dict[str, Any] = json.loads(lines.expect("RESULT", 300))
            done = max(result["rollouts_in_window"], 1)
            claims = result.pop("first_claim")
            row: dict[str, Any] = {
                "rtt_setting": rtt,
                "rtt_ms_asked": float(rtt),
                "ping_rtt_ms_measured": measured_rtt,
                "hosts": cluster.hosts,
                "worker_processes": len(workers),
                "in_flight": in_flight,
                **result,
                "worker_cpu_ms_per_rollout": round(1000 * (w1 - w0) / done, 2),
                "redis_cpu_ms_per_rollout": round(1000 * (r1 - r0) / done, 3),
                "redis_cpu_cores": round((r1 - r0) / result["window_seconds"], 3),
                "proxy_cpu_ms_per_rollout": round(1000 * (p1 - p0) / done, 2),
                "client_writes_per_rollout": round((s1.get("up_chunks", 0) - s0.get("up_chunks", 0)) / done, 1),
                "seconds_to_first_claim": {
                    "of": "every process, the fleet starting" if k == 0 else "host 0's processes, restarted",
                    **first_claim_summary([claims[n] - at for n, at in fresh.items() if n in claims]),
                },
                "redis_connections_per_worker_process": round(result["redis_connections"] / len(workers), 2),
                "load_average_1m": {"window_start": round(load0[0], 2), "window_end": round(load1[0], 2)},
                "worker_memory_mb": memory,
                "workers_alive_at_end": sum(1 for p in workers.values() if p.poll() is None),
                "ideal_rollouts_per_s": round(in_flight / MEAN_ROLLOUT_SECONDS, 1),
            }
            row["percent_of_ideal"] = round(100 * row["rollouts_per_s"] / row["ideal_rollouts_per_s"], 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        cluster.stop(list(workers.values()), timeout=30)
        cluster.stop(proxies, timeout=5)
        cluster.stop([producer], timeout=5)
    return rows
