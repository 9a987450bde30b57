"""The simulated network: namespaces joined by veth pairs, the redis-server in its own, the delay proxies.

Host i is 10.231.<i+1>.2 and reaches Redis at 10.231.<i+1>.1; the producer is 10.231.250.2. Only the
namespaces made here hold 10.231.x.y addresses, with no default route and no forwarding: all traffic stays
between them. :meth:`Cluster.close` removes every namespace and stops every process it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, worker_env

PYTHON = sys.executable
PROXY_PORT = 6380
REDIS_PORT = 6379
PRODUCER_SUBNET = 250


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

    def redis_url(self, host: int) -> str:
        """Host ``host``'s way to Redis over its own link, no proxy."""
        return f"redis://10.231.{host + 1}.1:{REDIS_PORT}/0"

    @property
    def producer_url(self) -> str:
        return f"redis://10.231.{PRODUCER_SUBNET}.1:{REDIS_PORT}/0"

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
            "--port", str(REDIS_PORT), "--bind", *binds, "--protected-mode", "no", "--dir", str(self.tmp),
            "--save", "", "--appendonly", "no", "--maxclients", "10000",
        ]  # fmt: skip
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


# -- the delay proxies: bench/delay_proxy.py, one per host, inside the host's namespace ------------------------


def start_proxies(
    cluster: Cluster, rtt_ms: str, *, jitter: bool = False, rtt_files: list[Path] | None = None
) -> list[subprocess.Popen[bytes]]:
    """One proxy per host on 127.0.0.1:PROXY_PORT in its namespace, adding ``rtt_ms`` of round trip to Redis.

    With ``jitter``, up to a tenth of it again at random; with ``rtt_files``, each proxy re-reads its round trip
    from its file (:func:`write_rtt`). Each counts what passed through it in ``proxy-<i>.json``.
    """
    proxies = []
    for i, ns in enumerate(cluster.host_ns):
        command = [
            PYTHON, str(ROOT / "bench" / "delay_proxy.py"), "--listen", f"127.0.0.1:{PROXY_PORT}",
            "--upstream", f"10.231.{i + 1}.1:{REDIS_PORT}", "--rtt-ms", rtt_ms,
        ]  # fmt: skip
        if jitter:
            command += ["--jitter-ms", str(float(rtt_ms) * 0.1)]
        if rtt_files:
            command += ["--rtt-file", str(rtt_files[i])]
        command += ["--stats", str(cluster.tmp / f"proxy-{i}.json")]
        proxies.append(cluster.spawn(ns, command, f"proxy-{i}.log"))
    time.sleep(0.5)
    return proxies


def write_rtt(path: Path, rtt_ms: float) -> None:
    """What a proxy started with ``--rtt-file`` applies within a quarter of a second."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{rtt_ms} {rtt_ms * 0.1}")
    tmp.replace(path)


def proxy_stats(cluster: Cluster) -> dict[str, int]:
    """What the proxies counted so far, summed over the hosts (``up_chunks``: client-to-Redis writes)."""
    total: dict[str, int] = {}
    for i in range(cluster.hosts):
        path = cluster.tmp / f"proxy-{i}.json"
        if path.exists():
            for k, v in json.loads(path.read_text()).items():
                total[k] = total.get(k, 0) + int(v)
    return total


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
