"""Hostile soak: a kill storm, a full Redis and a misbehaving ``serve-al`` client in one run; nothing lost or doubled.

Run: python bench/hostile_soak.py [--storm 60] [--oom 20] [--workers 3] [--concurrency 32]

A private redis-server and ``--workers`` ``rq worker -w rollq.worker.RolloutWorker`` processes (bench.soak's
SoakAgent), plus one ``rollq serve-al`` gateway on the same namespace with two AL 0.1-style HTTP clients: a
good one that takes tasks and posts their results, and a hostile one that takes tasks and never posts them
(``--max-held 8``, 2 s leases) and posts forged results (ids without a token, with a made-up one). Then:

1. kill storm (``--storm`` s): tasks are queued in batches of 200 every second and a random worker is
   SIGKILLed (and replaced) every 1-2 s;
2. full Redis (``--oom`` s): ``maxmemory`` is set below what Redis uses (``noeviction``): every write is
   refused. Batches queued meanwhile are refused whole (they count as not acknowledged, and must leave no
   task behind); workers wait; one more worker is killed; then memory is freed;
3. drain: every acknowledged task must end with exactly one rollout on the results stream.

A lagging-replica failover is not part of this run (issue 25, h-failover). Prints and writes
bench/results/hostile_soak.json; exits 1 if an acknowledged task was lost, one was delivered twice, a refused
batch left a task behind, or a forged post was accepted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.common import write_result  # noqa: E402
from bench.soak import NAMESPACE, Soak, free_port, start_redis  # noqa: E402
from rollq.producer.producer import Producer  # noqa: E402
from rollq.store.connection import connect  # noqa: E402
from rollq.store.stats import StatsField  # noqa: E402

ROLLQ = str(Path(sys.executable).parent / "rollq")
BATCH = 200


def _http(url: str, payload: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), {}
    except OSError:
        return 0, {}


class Clients:
    """The serve-al gateway's two clients, each a thread: one that posts what it takes, one that does not."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.stop = threading.Event()
        self.posted = self.held = self.forged = self.forged_accepted = 0
        self.threads = [
            threading.Thread(target=self._good, daemon=True),
            threading.Thread(target=self._bad, daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _good(self) -> None:
        while not self.stop.is_set():
            status, answer = _http(self.endpoint + "task")
            if status != 200 or not answer.get("is_available"):
                time.sleep(0.2)
                continue
            handed = answer["task"]["rollout_id"]
            status, _ = _http(self.endpoint + "rollout", {"rollout_id": handed, "final_reward": 1.0})
            self.posted += status == 200

    def _bad(self) -> None:
        while not self.stop.is_set():
            status, answer = _http(self.endpoint + "task")
            if status == 200 and answer.get("is_available"):
                self.held += 1
                rid = answer["task"]["rollout_id"].partition("#")[0]
                for forged in (f"{rid}#1", f"{rid}#1#{'0' * 32}", rid):
                    status, _ = _http(self.endpoint + "rollout", {"rollout_id": forged, "final_reward": -1000.0})
                    self.forged += 1
                    self.forged_accepted += status == 200
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storm", type=float, default=60.0, help="seconds of kill storm")
    parser.add_argument("--oom", type=float, default=20.0, help="seconds Redis refuses writes")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    args = parser.parse_args()
    soak_args = argparse.Namespace(
        unresponsive=3.0, max_attempts=3, concurrency=args.concurrency, heartbeat=1.0, sleep="0.05-0.3"
    )
    with tempfile.TemporaryDirectory(prefix="rollq-hostile-soak-") as tmp:
        directory = Path(tmp)
        exits: dict[str, str] = {}
        redis_process, url = start_redis(directory)
        soak = Soak(soak_args, url, directory)
        client = redis.Redis.from_url(url)
        port = free_port()
        gateway = subprocess.Popen(
            [ROLLQ, "--url", url, "-n", NAMESPACE, "serve-al", "--port", str(port), "--lease", "2",
             "--heartbeat", "0.5", "--max-held", "8"],
            stdout=(directory / "serve-al.log").open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        endpoint = f"http://127.0.0.1:{port}/"
        clients = Clients(endpoint)
        refused_ids: list[str] = []
        refusals: list[str] = []
        refused_batches = kills = 0
        try:
            for _ in range(args.workers):
                soak.start_worker()
            while _http(endpoint + "resources/latest")[0] == 0:
                time.sleep(0.2)
            clients.start()
            began = time.monotonic()

            # 1. kill storm
            next_kill = began + random.uniform(1, 2)
            while time.monotonic() - began < args.storm:
                soak.enqueue(BATCH)
                if time.monotonic() >= next_kill:
                    soak.kill_one()
                    kills += 1
                    next_kill = time.monotonic() + random.uniform(1, 2)
                soak.read_results()
                time.sleep(1)
            print(f"storm: {len(soak.ids)} queued, {kills} kills, {sum(soak.delivered.values())} delivered")

            # 2. a full Redis
            quick = Producer(connect(url, retries=1), NAMESPACE)
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", max(1, int(client.info("memory")["used_memory"]) - 1024))
            oom_began = time.monotonic()
            killed_in_oom = False
            tried = 0
            while time.monotonic() - oom_began < args.oom:
                tried += 1
                batch = [f"oom-{tried}-{i}" for i in range(BATCH)]
                try:
                    quick.enqueue_many([{"n": i} for i in range(BATCH)], rollout_ids=batch)
                    soak.ids += batch  # accepted after all: acknowledged
                except redis.RedisError as exc:
                    refused_batches += 1
                    refused_ids += batch
                    refusals.append(f"{type(exc).__name__}: {str(exc)[:120]}")
                if not killed_in_oom and time.monotonic() - oom_began > args.oom / 2:
                    soak.kill_one()
                    kills += 1
                    killed_in_oom = True
                time.sleep(1)
            client.config_set("maxmemory", 0)
            print(f"oom: {refused_batches} batches refused whole, memory freed")

            # 3. drain
            deadline = time.monotonic() + args.drain_timeout
            wanted = set(soak.ids)
            while time.monotonic() < deadline:
                soak.read_results()
                if wanted <= set(soak.delivered):
                    break
                time.sleep(0.5)
            time.sleep(2)
            soak.read_results()
            alive = [name for name, p in soak.workers.items() if p.poll() is None]
            pipe = client.pipeline(transaction=False)
            for rid in refused_ids:
                pipe.exists(soak.producer.keys.task(rid))
            exists = pipe.execute() if refused_ids else []
            left_behind = sum(exists)
            left_batches = sorted({rid.rsplit("-", 1)[0] for rid, e in zip(refused_ids, exists, strict=True) if e})
            stats = {k.decode(): v.decode() for k, v in client.hgetall(soak.producer.keys.stats).items()}
        finally:
            clients.stop.set()
            for process in [*soak.workers.values(), gateway]:
                process.terminate()
            for process in [*soak.workers.values(), gateway]:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
            redis_process.terminate()
            redis_process.wait()
            for log in directory.glob("soak-*.log"):
                text = log.read_text(errors="replace")
                if "unhandled exception" in text or "Traceback" in text:
                    exits[log.stem] = text[-1500:]

    lost = sorted(set(soak.ids) - set(soak.delivered))
    doubled = sorted(rid for rid, n in soak.delivered.items() if n > 1)
    result = {
        "acknowledged": len(soak.ids),
        "delivered": sum(soak.delivered.values()),
        "lost": len(lost),
        "delivered_twice": len(doubled),
        "statuses": dict(soak.statuses),
        "kills": kills,
        "workers_alive_at_end": len(alive),
        "oom_batches_refused": refused_batches,
        "oom_refused_tasks_left_behind": left_behind,
        "oom_batches_left_behind": left_batches,
        "oom_refusals": refusals,
        "worker_exits": exits,
        "serve_al": {
            "posted_by_good_client": clients.posted,
            "taken_by_hostile_client": clients.held,
            "forged_posts": clients.forged,
            "forged_posts_accepted": clients.forged_accepted,
            "refused_counted": int(stats.get(StatsField.GATEWAY_REFUSED, 0)),
            "leases_handed_back": int(stats.get(StatsField.GATEWAY_RELEASED, 0)),
        },
        "redis_refusals_waited_out": int(stats.get(StatsField.REDIS_REFUSALS, 0)),
        "lost_sample": lost[:10],
        "doubled_sample": doubled[:10],
        "settings": vars(args),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}, indent=1))
    print(write_result("hostile_soak", result, sys.argv[1:]))
    bad = lost or doubled or left_behind or clients.forged_accepted
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
