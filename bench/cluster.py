"""A simulated cluster on one box: hosts in network namespaces, latency to Redis, a dead host. Needs root.

Run (as root): python bench/cluster.py [--hosts 4] [--workers-per-host 2] [--concurrency 16]
               [--rtts direct,0,0.5,2,10] [--window 10] [--rounds 1] [--outage 12] [--skip-dead-host]
               [--stagger 0] [--out cluster]
The 256-process run (writes bench/results/cluster_256.json):
               python bench/cluster.py --hosts 8 --workers-per-host 32 --concurrency 4 --stagger 0.25
               --rtts 0.5,2,10 --window 20 --skip-dead-host --keep-workers --out cluster_256
(``--keep-workers`` starts the 256 processes once and changes the proxies' delay in place between settings:
starting them costs about 150 CPU-seconds here; without it each setting starts its processes afresh, and
``--budget`` skips the settings that would not end in time)

What it builds, and removes again on exit, Ctrl+C or SIGTERM included (a ``finally`` and signal
handlers; every process it started is stopped by its pid, every namespace it made deleted):

- a "redis" network namespace running one redis-server, and N "host" namespaces plus one "producer"
  namespace, each joined to the redis namespace by a veth pair of its own: host i is 10.231.<i+1>.2
  and reaches Redis at 10.231.<i+1>.1; the producer is 10.231.250.2. Only these namespaces hold
  10.231.x.y addresses; there is no default route and no forwarding anywhere, and nothing links them
  to the machine's own network, so all traffic stays between the namespaces made here.
- per host, bench/delay_proxy.py on 127.0.0.1:6380 inside the host namespace, forwarding to Redis
  with half the round trip added each way (this kernel has no netem qdisc). ``direct`` runs without
  the proxy, ``0`` through it with no delay: the proxy's own cost.
- per host, ``--workers-per-host`` stock ``rq worker -w rollq.worker.RolloutWorker`` processes on the
  mock-LLM agent (3 turns x U(0.1, 0.5) s with spans), concurrency ``--concurrency`` each;
- the producer and trainer in the producer namespace (this script run again there with ``--role
  producer``): it keeps tasks queued, reads every rollout through a consumer group, and measures Redis.

Per round-trip setting: rollouts/s and % of the ideal rate (in flight / 0.9 s), the
round trip a PING actually took through the proxy, Redis connections, commands/s and CPU, worker CPU
per rollout, proxy CPU, client->Redis writes per rollout seen by the proxies (each is one round
trip: a command, a pipeline or a Lua call), and each worker's time from its start to its first claim.

Per setting also: the machine's load average at the window's start and end, and the resident and unique
memory of the worker processes (psutil RSS and USS: USS is what one more process really costs, RSS
counts the shared libraries again in every process). ``--stagger`` spaces the worker starts (each
costs about 0.6 CPU-seconds of imports), so 256 processes do not all import at once.

Dead host (at the 2 ms setting unless ``--skip-dead-host``): a fixed task list with
``unresponsive_seconds`` 6 and 1 s heartbeats; a few seconds in, host 0's link is taken down for
``--outage`` seconds, then restored. Reported: rollouts received, lost and duplicated, attempts
requeued as unresponsive, late results kept as superseded, tasks host 0 claimed after the link came
back, and whether its workers were all still running.

The defaults (4 hosts x 2 processes x 16 in flight = 128 in flight) are what 2 shared cores carry at
full speed. 8 hosts x 32 processes x 4 in flight (1024 in flight) runs on them too, CPU-bound: there
the figures are connections, Redis load and start-up at fleet size, not the fleet's rollout rate
(the machine's cores, not Redis, set it). It needs about 51 MB of memory per worker process (USS); the
script checks MemAvailable first. Writes bench/results/<--out>.json (cluster.json by default).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
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

import psutil  # noqa: E402

from bench.common import ROOT, RQ, sum_over, worker_env, write_result  # noqa: E402

PYTHON = sys.executable
PROXY_PORT = 6380
REDIS_PORT = 6379
MEAN_ROLLOUT_SECONDS = 0.9
PRODUCER_SUBNET = 250
WORKER_MB = 55
"""Memory one more mock-LLM `rq worker` process (concurrency 4) takes: 51 MB unique (USS) measured, 69 MB resident
counting the shared libraries again; with some margin."""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


class Cluster:
    """The namespaces, links and processes of one run; :meth:`close` removes all of them."""

    def __init__(self, hosts: int, tmp: Path) -> None:
        tag = f"rqc{os.getpid() % 100000}"
        self.tag, self.tmp, self.hosts = tag, tmp, hosts
        self.redis_ns = f"{tag}-redis"
        self.host_ns = [f"{tag}-h{i}" for i in range(hosts)]
        self.producer_ns = f"{tag}-prod"
        self.namespaces: list[str] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.redis: subprocess.Popen[bytes] | None = None

    # -- topology --------------------------------------------------------------------------------

    def build(self) -> None:
        for ns in [self.redis_ns, *self.host_ns, self.producer_ns]:
            sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for i, ns in enumerate(self.host_ns):
            self._link(ns, i + 1, f"{self.tag}h{i}", f"{self.tag}r{i}")
        self._link(self.producer_ns, PRODUCER_SUBNET, f"{self.tag}hp", f"{self.tag}rp")

    def _link(self, ns: str, subnet: int, host_end: str, redis_end: str) -> None:
        sh(
            "ip",
            "link",
            "add",
            host_end,
            "netns",
            ns,
            "type",
            "veth",
            "peer",
            "name",
            redis_end,
            "netns",
            self.redis_ns,
        )
        sh("ip", "-n", ns, "addr", "add", f"10.231.{subnet}.2/24", "dev", host_end)
        sh("ip", "-n", self.redis_ns, "addr", "add", f"10.231.{subnet}.1/24", "dev", redis_end)
        sh("ip", "-n", ns, "link", "set", host_end, "up")
        sh("ip", "-n", self.redis_ns, "link", "set", redis_end, "up")

    def redis_end(self, host: int) -> str:
        return f"{self.tag}r{host}"

    def set_link(self, host: int, up: bool) -> None:
        sh("ip", "-n", self.redis_ns, "link", "set", self.redis_end(host), "up" if up else "down")

    # -- processes -------------------------------------------------------------------------------

    def spawn(
        self, ns: str, command: list[str], log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.tmp / log, "ab") as out:
            p = subprocess.Popen(
                ["ip", "netns", "exec", ns, *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env or worker_env(),
                cwd=ROOT,
            )
        self.processes.append(p)
        return p

    def start_redis(self) -> None:
        binds = [f"10.231.{i + 1}.1" for i in range(self.hosts)] + [f"10.231.{PRODUCER_SUBNET}.1"]
        command = [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(REDIS_PORT),
            "--bind",
            *binds,
            "--protected-mode",
            "no",
            "--dir",
            str(self.tmp),
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxclients",
            "10000",
        ]
        self.redis = self.spawn(self.redis_ns, command, "redis.log")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = ["ip", "netns", "exec", self.producer_ns, "redis-cli", "-h", f"10.231.{PRODUCER_SUBNET}.1"]
            if sh(*probe, "-p", str(REDIS_PORT), "ping", check=False).stdout.strip() == "PONG":
                return
            time.sleep(0.1)
        raise RuntimeError("redis-server in the redis namespace did not answer")

    def stop(self, processes: list[subprocess.Popen[bytes]], timeout: float = 30) -> None:
        for p in processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in processes:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self) -> None:
        self.stop([p for p in self.processes if p is not self.redis], timeout=15)
        if self.redis is not None:
            self.stop([self.redis], timeout=10)
        for ns in reversed(self.namespaces):
            # Anything still running in a namespace made here was started here.
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)  # deleting a namespace removes its veth ends
        self.namespaces.clear()


def ping_rtt_ms(cluster: Cluster, host: int, via_proxy: bool) -> float:
    """Median round trip of 50 PINGs from inside a host namespace."""
    target = ("127.0.0.1", PROXY_PORT) if via_proxy else (f"10.231.{host + 1}.1", REDIS_PORT)
    code = (
        "import redis,time,statistics;"
        f"r=redis.Redis(host='{target[0]}',port={target[1]});r.ping();t=[]\n"
        "for _ in range(50):\n"
        " s=time.perf_counter();r.ping();t.append(time.perf_counter()-s)\n"
        "print(statistics.median(t)*1000)"
    )
    out = sh("ip", "netns", "exec", cluster.host_ns[host], PYTHON, "-c", code)
    return round(float(out.stdout.strip()), 3)


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


def proxy_stats(cluster: Cluster) -> dict[str, int]:
    total: dict[str, int] = {}
    for i in range(cluster.hosts):
        path = cluster.tmp / f"proxy-{i}.json"
        if path.exists():
            for k, v in json.loads(path.read_text()).items():
                total[k] = total.get(k, 0) + int(v)
    return total


def worker_memory(processes: list[psutil.Process]) -> dict[str, float]:
    """Median and max RSS and USS of the worker processes, in MB."""
    rss: list[float] = []
    uss: list[float] = []
    for p in processes:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss.append(info.rss / 2**20)
        uss.append(info.uss / 2**20)
    if not rss:
        return {}
    rss.sort()
    uss.sort()
    return {
        "rss_median": round(rss[len(rss) // 2], 1),
        "rss_max": round(rss[-1], 1),
        "uss_median": round(uss[len(uss) // 2], 1),
        "uss_max": round(uss[-1], 1),
        "uss_total": round(sum(uss)),
    }


def check_memory(processes: int) -> None:
    """Refuse to start when the worker processes would not fit in the memory available now."""
    needed = processes * WORKER_MB + 1024
    available = psutil.virtual_memory().available / 2**20
    if available < needed:
        sys.exit(
            f"{processes} worker processes need about {needed / 1024:.1f} GB ({WORKER_MB} MB each and 1 GB to "
            f"spare); only {available / 1024:.1f} GB is available"
        )


def run_setting(cluster: Cluster, args: argparse.Namespace, rtt: str, dead_host: bool) -> dict[str, Any]:
    via_proxy = rtt != "direct"
    rtt_ms = 0.0 if rtt == "direct" else float(rtt)
    proxies: list[subprocess.Popen[bytes]] = []
    for path in cluster.tmp.glob("proxy-*.json"):
        path.unlink()
    if via_proxy:
        for i, ns in enumerate(cluster.host_ns):
            command = [
                PYTHON,
                str(ROOT / "bench" / "delay_proxy.py"),
                "--listen",
                f"127.0.0.1:{PROXY_PORT}",
                "--upstream",
                f"10.231.{i + 1}.1:{REDIS_PORT}",
                "--rtt-ms",
                str(rtt_ms),
                "--jitter-ms",
                str(rtt_ms * 0.1),
                "--stats",
                str(cluster.tmp / f"proxy-{i}.json"),
            ]
            proxies.append(cluster.spawn(ns, command, f"proxy-{i}.log"))
        time.sleep(0.5)
    measured_rtt = ping_rtt_ms(cluster, 0, via_proxy)
    namespace = f"c{rtt.replace('.', '_')}{'-dead' if dead_host else ''}"
    in_flight = cluster.hosts * args.workers_per_host * args.concurrency
    producer_url = f"redis://10.231.{PRODUCER_SUBNET}.1:{REDIS_PORT}/0"
    command = [
        PYTHON,
        str(Path(__file__).resolve()),
        "--role",
        "producer",
        "--url",
        producer_url,
        "--namespace",
        namespace,
        "--in-flight",
        str(in_flight),
        "--workers",
        str(cluster.hosts * args.workers_per_host),
        "--window",
        str(args.window),
    ]
    if dead_host:
        command += ["--dead-host-tasks", str(args.dead_host_tasks), "--outage", str(args.outage)]
        command += ["--link-down", f"{cluster.redis_ns}:{cluster.redis_end(0)}"]
    with open(cluster.tmp / f"producer-{namespace}.log", "wb") as err:
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
    lines.expect("QUEUED", 60)
    workers: list[subprocess.Popen[bytes]] = []
    started: dict[str, float] = {}
    extra = {"ROLLQ_HEARTBEAT_SECONDS": "1"} if dead_host else {}
    # Round-robin over the hosts, so a staggered start fills every host alike.
    for j in range(args.workers_per_host):
        for i, ns in enumerate(cluster.host_ns):
            url = f"redis://127.0.0.1:{PROXY_PORT}/0" if via_proxy else f"redis://10.231.{i + 1}.1:{REDIS_PORT}/0"
            name = f"h{i}w{j}-{namespace}"
            env = worker_env(ROLLQ_AGENT="bench.agents:MockLLMAgent", ROLLQ_CONCURRENCY=str(args.concurrency), **extra)
            rq = [RQ, "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, "--name", name, "--quiet", namespace]
            started[name] = time.time()
            workers.append(cluster.spawn(ns, rq, f"worker-{name}.log", env))
            if args.stagger:
                time.sleep(args.stagger)
    try:
        ps = [psutil.Process(p.pid) for p in workers]
        px = [psutil.Process(p.pid) for p in proxies]
        redis_proc = psutil.Process(cluster.redis.pid)  # type: ignore[union-attr]

        def cpu(group: list[psutil.Process]) -> float:
            return sum_over(group, lambda p: sum(p.cpu_times()[:2]))

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
    first_claims = sorted(
        result["first_claim"][name] - t0 for name, t0 in started.items() if name in result.get("first_claim", {})
    )
    row: dict[str, Any] = {
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
        "seconds_to_first_claim": {
            "workers": len(first_claims),
            "min": round(first_claims[0], 2) if first_claims else None,
            "median": round(first_claims[len(first_claims) // 2], 2) if first_claims else None,
            "p95": round(first_claims[min(len(first_claims) - 1, int(0.95 * len(first_claims)))], 2)
            if first_claims
            else None,
            "max": round(first_claims[-1], 2) if first_claims else None,
        },
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


# -- one fleet at several round trips (--keep-workers) ---------------------------------------------


def write_rtt(path: Path, rtt_ms: float) -> None:
    """What a proxy started with ``--rtt-file`` applies within a quarter of a second."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{rtt_ms} {rtt_ms * 0.1}")
    tmp.replace(path)


def first_claim_summary(first_claims: list[float]) -> dict[str, Any]:
    first_claims = sorted(first_claims)
    if not first_claims:
        return {"workers": 0}
    return {
        "workers": len(first_claims),
        "min": round(first_claims[0], 2),
        "median": round(first_claims[len(first_claims) // 2], 2),
        "p95": round(first_claims[min(len(first_claims) - 1, int(0.95 * len(first_claims)))], 2),
        "max": round(first_claims[-1], 2),
    }


def run_kept(cluster: Cluster, args: argparse.Namespace, settings: list[str]) -> list[dict[str, Any]]:
    """Start the fleet once and measure it at each round trip in turn: the proxies change their delay in place.

    Starting 256 processes costs about 150 CPU-seconds of imports here, too much to repeat per setting. Time to
    first claim is measured for the whole fleet at the first setting, and at each later one for host 0's
    processes, restarted under the new round trip while the rest keep working.
    """
    rtt_files = [cluster.tmp / f"rtt-{i}" for i in range(cluster.hosts)]
    for path in rtt_files:
        write_rtt(path, float(settings[0]))
    proxies: list[subprocess.Popen[bytes]] = []
    for i, ns in enumerate(cluster.host_ns):
        command = [
            PYTHON,
            str(ROOT / "bench" / "delay_proxy.py"),
            "--listen",
            f"127.0.0.1:{PROXY_PORT}",
            "--upstream",
            f"10.231.{i + 1}.1:{REDIS_PORT}",
            "--rtt-ms",
            settings[0],
            "--rtt-file",
            str(rtt_files[i]),
            "--stats",
            str(cluster.tmp / f"proxy-{i}.json"),
        ]
        proxies.append(cluster.spawn(ns, command, f"proxy-{i}.log"))
    time.sleep(0.5)
    namespace = "kept"
    processes = cluster.hosts * args.workers_per_host
    in_flight = processes * args.concurrency
    command = [
        PYTHON,
        str(Path(__file__).resolve()),
        "--role",
        "producer",
        "--url",
        f"redis://10.231.{PRODUCER_SUBNET}.1:{REDIS_PORT}/0",
        "--namespace",
        namespace,
        "--in-flight",
        str(in_flight),
        "--workers",
        str(processes),
        "--window",
        str(args.window),
        "--schedule",
        ",".join(settings),
        "--rtt-dir",
        str(cluster.tmp),
        "--hosts",
        str(cluster.hosts),
    ]
    with open(cluster.tmp / "producer-kept.log", "wb") as err:
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
    lines.expect("QUEUED", 60)
    workers: dict[str, subprocess.Popen[bytes]] = {}  # the running ones, by name
    env = worker_env(ROLLQ_AGENT="bench.agents:MockLLMAgent", ROLLQ_CONCURRENCY=str(args.concurrency))
    url = f"redis://127.0.0.1:{PROXY_PORT}/0"

    def spawn(host: int, j: int, suffix: str) -> tuple[str, float]:
        name = f"h{host}w{j}{suffix}-{namespace}"
        rq = [RQ, "worker", "-w", "rollq.worker.RolloutWorker", "--url", url, "--name", name, "--quiet", namespace]
        at = time.time()
        workers[name] = cluster.spawn(cluster.host_ns[host], rq, f"worker-{name}.log", env)
        if args.stagger:
            time.sleep(args.stagger)
        return name, at

    rows: list[dict[str, Any]] = []
    redis_proc = psutil.Process(cluster.redis.pid)  # type: ignore[union-attr]
    px = [psutil.Process(p.pid) for p in proxies]

    def cpu(group: list[psutil.Process]) -> float:
        return sum_over(group, lambda p: sum(p.cpu_times()[:2]))

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


def wait_registered(connection: Any, namespace: str, workers: int) -> int:
    """Every worker registered, or (one that failed to start must not hang a 256-process run) 90% of them and
    no new one for 30 s. The number registered."""
    registered, grew_at = 0, time.monotonic()
    while registered < workers:
        now_registered = int(connection.scard(f"rq:workers:{namespace}"))
        if now_registered > registered:
            registered, grew_at = now_registered, time.monotonic()
        elif registered >= 0.9 * workers and time.monotonic() - grew_at > 30:
            break
        time.sleep(0.1)
    return registered


def producer_schedule(args: argparse.Namespace) -> None:
    """The producer of --keep-workers: sets each round trip on the proxies, then measures a window at it."""
    import redis

    from bench.al import Trainer
    from bench.mock_llm import Feeder
    from rollq.producer import Producer
    from rollq.store.keys import Keys

    def say(line: str) -> None:
        print(line, flush=True)

    connection = redis.Redis.from_url(args.url)
    keys = Keys(args.namespace)
    producer = Producer(connection, args.namespace)
    trainer = Trainer(Producer(redis.Redis.from_url(args.url), args.namespace))
    trainer.start()
    ids: list[str] = []
    feeder = Feeder(
        redis.Redis.from_url(args.url),
        f"rq:queue:{args.namespace}",
        args.in_flight,
        lambda n: ids.extend(t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(n)], mode="train")),
    )
    feeder.start()
    say("QUEUED")
    tmp = Path(args.rtt_dir)
    for k, rtt in enumerate(args.schedule.split(",")):
        for i in range(args.hosts):
            write_rtt(tmp / f"rtt-{i}", float(rtt))
        say(f"SETTING {rtt}")
        while not (tmp / f"go-{k}").exists():
            time.sleep(0.1)
        registered = wait_registered(connection, args.namespace, args.workers)
        started, received = time.monotonic(), trainer.received
        # Settle at the new round trip: a few seconds, and a full turn of the slots.
        while time.monotonic() - started < 5.0 or trainer.received - received < args.in_flight:
            time.sleep(0.1)
        info0, n0, t0 = connection.info(), trainer.received, time.monotonic()
        say("WINDOW_START")
        time.sleep(args.window)
        info1, n1, t1 = connection.info(), trainer.received, time.monotonic()
        say("WINDOW_END")
        with connection.pipeline(transaction=False) as pipe:
            for rid in ids:
                pipe.hmget(keys.task(rid), "worker", "last_claim")
            records = pipe.execute()
        first_claim: dict[str, float] = {}
        for worker, last_claim in records:
            if worker and last_claim:
                name = worker.decode()
                first_claim[name] = min(first_claim.get(name, float("inf")), float(last_claim))
        commands = info1["total_commands_processed"] - info0["total_commands_processed"]
        result = {
            "window_seconds": round(t1 - t0, 2),
            "rollouts_in_window": n1 - n0,
            "rollouts_per_s": round((n1 - n0) / (t1 - t0), 1),
            "redis_commands_per_s": round(commands / (t1 - t0)),
            "redis_commands_per_rollout": round(commands / max(n1 - n0, 1), 1),
            "redis_connections": info1["connected_clients"],
            "workers_registered": registered,
            "redis_used_memory_mb": round(info1["used_memory"] / 2**20, 1),
            "duplicates": trainer.duplicates,
            "first_claim": first_claim,
        }
        say("RESULT " + json.dumps(result))
    feeder.stop()
    trainer.stop()


# -- the producer role, run inside the producer namespace ------------------------------------------


def producer_role(args: argparse.Namespace) -> None:
    """Feed, read, measure; talk to the driver over stdout (QUEUED, WINDOW_START, WINDOW_END, RESULT)."""
    import redis

    from bench.al import Trainer
    from bench.mock_llm import Feeder
    from rollq.models.policy import RolloutPolicy
    from rollq.producer import Producer
    from rollq.store.keys import Keys

    def say(line: str) -> None:
        print(line, flush=True)

    connection = redis.Redis.from_url(args.url)
    keys = Keys(args.namespace)
    policy = RolloutPolicy(unresponsive_seconds=6.0) if args.dead_host_tasks else None
    producer = Producer(connection, args.namespace, policy=policy)
    trainer = Trainer(Producer(redis.Redis.from_url(args.url), args.namespace))
    trainer.start()
    ids: list[str] = []
    feeder = None
    if args.dead_host_tasks:
        ids = [
            t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(args.dead_host_tasks)], mode="train")
        ]
    else:
        feeder = Feeder(
            redis.Redis.from_url(args.url),
            f"rq:queue:{args.namespace}",
            args.in_flight,
            lambda n: ids.extend(
                t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(n)], mode="train")
            ),
        )
        feeder.start()
    say("QUEUED")
    registered = wait_registered(connection, args.namespace, args.workers)
    started = time.monotonic()
    warm = min(args.in_flight, args.dead_host_tasks or args.in_flight)
    while time.monotonic() - started < 4.0 or trainer.received < warm:
        time.sleep(0.1)
    info0, n0, t0 = connection.info(), trainer.received, time.monotonic()
    say("WINDOW_START")
    outage: dict[str, Any] = {}
    if args.dead_host_tasks:
        ns, dev = args.link_down.split(":")
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "down"], check=True)
        down_at = time.time()
        time.sleep(args.outage)
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        up_at = time.time()
        outage = {"down_for_seconds": round(up_at - down_at, 1)}
        deadline = time.monotonic() + 300
        while len(trainer.seen & set(ids)) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3.0)  # late results of the cut-off host arrive after their tasks finished elsewhere
    else:
        time.sleep(args.window)
    info1, n1, t1 = connection.info(), trainer.received, time.monotonic()
    say("WINDOW_END")
    if feeder is not None:
        feeder.stop()
    trainer.stop()
    elapsed = t1 - t0
    with connection.pipeline(transaction=False) as pipe:
        for rid in ids:
            pipe.hmget(keys.task(rid), "worker", "last_claim", "claims")
        records = pipe.execute()
    first_claim: dict[str, float] = {}
    for worker, last_claim, _ in records:
        if worker and last_claim:
            name = worker.decode()
            first_claim[name] = min(first_claim.get(name, float("inf")), float(last_claim))
    stats = {k.decode(): v.decode() for k, v in connection.hgetall(keys.stats).items()}  # type: ignore[union-attr]
    result: dict[str, Any] = {
        "window_seconds": round(elapsed, 2),
        "rollouts_in_window": n1 - n0,
        "rollouts_per_s": round((n1 - n0) / elapsed, 1),
        "redis_commands_per_s": round(
            (info1["total_commands_processed"] - info0["total_commands_processed"]) / elapsed
        ),
        "redis_commands_per_rollout": round(
            (info1["total_commands_processed"] - info0["total_commands_processed"]) / max(n1 - n0, 1), 1
        ),
        "redis_connections": info1["connected_clients"],
        "workers_registered": registered,
        "redis_used_memory_mb": round(info1["used_memory"] / 2**20, 1),
        "duplicates": trainer.duplicates,
        "first_claim": first_claim,
    }
    if args.dead_host_tasks:
        host0 = [r for r in records if r[0] and r[0].decode().startswith("h0w")]
        result.update(
            {
                "tasks": len(ids),
                "received": len(trainer.seen & set(ids)),
                "lost": len(set(ids) - trainer.seen),
                "tasks_claimed_more_than_once": sum(1 for r in records if r[2] and int(r[2]) > 1),
                "requeued_or_superseded": {k: v for k, v in stats.items() if k.startswith(("requeued", "superseded"))},
                "tasks_last_claimed_by_host0_after_restore": sum(
                    1 for r in host0 if float(r[1] or 0) > down_at + args.outage
                ),
                **outage,
            }
        )
    say("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--workers-per-host", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rtts", default="direct,0,0.5,2,10", help="'direct' (no proxy) or round trips in ms")
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1, help="times to run every round-trip setting")
    parser.add_argument("--outage", type=float, default=12.0, help="seconds host 0's link stays down")
    parser.add_argument("--dead-host-tasks", type=int, default=3000)
    parser.add_argument("--dead-host-rtt", default="2")
    parser.add_argument("--skip-dead-host", action="store_true")
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds between worker process starts")
    parser.add_argument("--out", default="cluster", help="results name: bench/results/<out>.json")
    parser.add_argument(
        "--budget", type=float, default=0.0, help="seconds: skip a setting that would end past them (0: no limit)"
    )
    # Internal: the producer process inside its namespace.
    parser.add_argument("--role", default="driver", choices=["driver", "producer"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--in-flight", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--link-down", help=argparse.SUPPRESS)
    parser.add_argument("--schedule", help=argparse.SUPPRESS)
    parser.add_argument("--rtt-dir", help=argparse.SUPPRESS)
    parser.add_argument(
        "--keep-workers",
        action="store_true",
        help="start the worker processes once and change the proxies' round trip in place (needs delayed settings)",
    )
    args = parser.parse_args()
    if args.role == "producer":
        try:
            if args.schedule:
                producer_schedule(args)
                return
            if not args.link_down:
                args.dead_host_tasks = 0
            producer_role(args)
        except Exception as exc:
            print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
            raise
        return
    if os.geteuid() != 0:
        sys.exit("bench/cluster.py needs root (network namespaces and veth pairs): run it with sudo")
    if shutil.which("ip") is None:
        sys.exit("bench/cluster.py needs iproute2's `ip`")

    def interrupted(signum: int, frame: Any) -> None:
        raise SystemExit(f"interrupted by signal {signum}; cleaning up")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    if args.keep_workers and "direct" in args.rtts.split(","):
        sys.exit("--keep-workers changes the proxies' delay: 'direct' (no proxy) cannot be one of its settings")
    check_memory(args.hosts * args.workers_per_host)
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    dead: dict[str, Any] | None = None
    skipped: list[str] = []
    longest = 0.0  # the longest setting so far: the next one is assumed to take as long
    with tempfile.TemporaryDirectory(prefix="rollq-cluster-") as tmp:
        cluster = Cluster(args.hosts, Path(tmp))
        try:
            cluster.build()
            cluster.start_redis()
            if args.keep_workers:
                rows = [{**row, "round": 1} for row in run_kept(cluster, args, args.rtts.split(","))]
            for round_ in range(0 if args.keep_workers else args.rounds):
                settings = args.rtts.split(",")
                # Alternate the order round by round, so that drift on the shared machine hits every setting alike.
                for rtt in settings if round_ % 2 == 0 else list(reversed(settings)):
                    if args.budget and time.monotonic() - began + longest > args.budget:
                        print(f"skipping the {rtt} setting: it would end past --budget {args.budget:.0f} s", flush=True)
                        skipped.append(rtt)
                        continue
                    at = time.monotonic()
                    rows.append({**run_setting(cluster, args, rtt, dead_host=False), "round": round_ + 1})
                    longest = max(longest, time.monotonic() - at)
            if not args.skip_dead_host:
                dead = run_setting(cluster, args, args.dead_host_rtt, dead_host=True)
        finally:
            cluster.close()
    processes = args.hosts * args.workers_per_host
    note = (
        "2 shared cores: 4 hosts x 2 worker processes stand in for the issue's 8 x 32"
        if processes < 256
        else f"{processes} worker processes x {args.concurrency} in flight on 2 shared cores: CPU-bound, so "
        "rollouts/s and % of ideal show the machine's cores; connections, Redis load and start-up are the fleet's"
    )
    write_result(
        args.out,
        {
            "hosts": args.hosts,
            "workers_per_host": args.workers_per_host,
            "concurrency": args.concurrency,
            "stagger_seconds": args.stagger,
            "note": note,
            "run_seconds": round(time.monotonic() - began),
            "rows": rows,
            "settings_skipped_for_time": skipped,
            "dead_host": dead,
        },
        sys.argv[1:],
        script="cluster",
        settings=vars(args),
    )


if __name__ == "__main__":
    main()
