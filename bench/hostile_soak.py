"""Hostile soak: a kill storm, a full Redis, a lagging-replica failover and a misbehaving ``serve-al`` client in
one run; nothing acknowledged lost or delivered twice.

Run: python bench/hostile_soak.py [--storm 60] [--oom 20] [--lag 10] [--lag-ms 1500] [--workers 3]
     [--concurrency 32]

The namespace lives on a Sentinel set started by the script on free ports of 127.0.0.1 (bench.failover's
Servers: a primary, one replica following it through bench/delay_proxy.py, three Sentinels, quorum 2,
down-after 1000 ms), and everything reaches it through the Sentinels' ``redis+sentinel://`` URL with rollq's
defaults (so every transition waits for one replica, ``wait_replicas`` unset). ``--workers`` ``rq worker -w
rollq.worker.RolloutWorker`` processes (bench.soak's SoakAgent), plus one ``rollq serve-al`` gateway on the same
namespace with two AL 0.1-style HTTP clients: a good one that takes tasks and posts their results, and a
hostile one that takes tasks and never posts them (``--max-held 8``, 2 s leases) and posts forged results (ids
without a token, with a made-up one). A trainer reads every rollout through rollq's consumer-group reader
(``Producer.rollouts``), the whole run. Then:

1. kill storm (``--storm`` s): tasks are queued in batches of 200 every second and a random worker is
   SIGKILLed (and replaced) every 1-2 s;
2. full Redis (``--oom`` s): the primary's ``maxmemory`` is set below what it uses (``noeviction``): every
   write is refused. Batches queued meanwhile are refused whole (they count as not acknowledged, and must
   leave no task behind); workers wait; one more worker is killed; then memory is freed;
3. lagging-replica failover: the replication link's proxy delays every byte ``--lag-ms`` each way (longer than
   the 1 s ``WAIT`` timeout by default) for ``--lag`` s while batches of 50 are queued every 0.25 s; then
   the primary and the proxy are SIGKILLed (what was on the wire is lost) and the Sentinels promote the
   lagging replica; queueing goes on through the failover; 5 s after the kill the old primary restarts
   empty and becomes a replica of the new one;
4. drain: every acknowledged task must reach the trainer exactly once, and the new primary's results
   stream must hold exactly one rollout of each.

Prints and writes bench/results/hostile_soak.json; exits 1 if an acknowledged task was lost, one was delivered
twice, a refused batch left a task behind, a forged post was accepted, or a worker exited by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.common import write_result  # noqa: E402
from bench.failover import Servers, Trainer  # noqa: E402
from bench.soak import NAMESPACE, Soak, free_port  # noqa: E402
from rollq.models.errors import RollqError  # noqa: E402
from rollq.producer.producer import Producer  # noqa: E402
from rollq.store.connection import connect  # noqa: E402
from rollq.store.keys import Keys  # noqa: E402
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


def _replica_behind(servers: Servers) -> int | None:
    """Bytes of replication stream the replica has not applied yet (the primary's offset minus the replica's)."""
    try:
        primary: Any = redis.Redis(port=servers.primary_port, socket_timeout=1).info("replication")
        replica: Any = redis.Redis(port=servers.replica_port, socket_timeout=1).info("replication")
        return int(primary["master_repl_offset"]) - int(replica["slave_repl_offset"])
    except (redis.RedisError, KeyError):
        return None


def _stream_counts(client: redis.Redis, stream: str) -> Counter[str]:
    """Entries per rollout id on a results stream."""
    counts: Counter[str] = Counter()
    cursor = "-"
    while True:
        entries: Any = client.xrange(stream, min=cursor, count=5000)
        if cursor != "-":
            entries = entries[1:]
        if not entries:
            return counts
        for _, fields in entries:
            counts[fields[b"rollout_id"].decode()] += 1
        cursor = entries[-1][0].decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storm", type=float, default=60.0, help="seconds of kill storm")
    parser.add_argument("--oom", type=float, default=20.0, help="seconds Redis refuses writes")
    parser.add_argument("--lag", type=float, default=10.0, help="seconds of a lagging replica before the failover")
    parser.add_argument("--lag-ms", type=float, default=1500.0, help="replication link delay each way, ms")
    parser.add_argument("--rejoin-after", type=float, default=5.0, help="seconds from kill to old primary restart")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    args = parser.parse_args()
    soak_args = argparse.Namespace(
        unresponsive=3.0, max_attempts=3, concurrency=args.concurrency, heartbeat=1.0, sleep="0.05-0.3"
    )
    with tempfile.TemporaryDirectory(prefix="rollq-hostile-soak-") as tmp:
        directory = Path(tmp)
        tracebacks: dict[str, int] = {}
        exited: list[str] = []
        rtt_file = directory / "replica-rtt"
        rtt_file.write_text("0 0")
        servers = Servers(directory)
        # failover-timeout 10 min: the Sentinels leave the replica behind its proxy for the whole run.
        servers.start(rtt_file=rtt_file, down_after_ms=1000, failover_timeout_ms=600_000)
        url = servers.url
        soak = Soak(soak_args, url, directory)
        trainer = Trainer(url, NAMESPACE)
        client = redis.Redis(port=servers.primary_port)
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
        failover: dict[str, Any] = {}
        try:
            for _ in range(args.workers):
                soak.start_worker()
            while _http(endpoint + "resources/latest")[0] == 0:
                time.sleep(0.2)
            trainer.start()
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
                time.sleep(1)
            print(f"storm: {len(soak.ids)} queued, {kills} kills, {len(trainer.received)} delivered", flush=True)

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
            print(f"oom: {refused_batches} batches refused whole, memory freed", flush=True)

            # 3. a lagging replica, then the primary dies and the Sentinels promote it
            shortfalls_before = soak.producer.lifecycle.replication_shortfalls
            rtt_file.write_text(f"{2 * args.lag_ms} 0")
            lag_began = time.monotonic()
            acked_before_lag = len(soak.ids)
            behind: list[int] = []
            enqueue_errors = lag_errors = 0
            while time.monotonic() - lag_began < args.lag:
                try:
                    soak.enqueue(50)
                except (redis.RedisError, RollqError):
                    enqueue_errors += 1
                behind.append(_replica_behind(servers) or 0)
                time.sleep(0.25)
            acked_in_lag = len(soak.ids) - acked_before_lag
            lag_errors, enqueue_errors = enqueue_errors, 0
            servers.kill_primary_host()
            killed_at = time.monotonic()
            events: dict[str, float] = {}
            acked_at_kill = len(soak.ids)
            while time.monotonic() - killed_at < args.rejoin_after + 5 or "restarted" not in events:
                try:
                    soak.enqueue(50)
                except (redis.RedisError, RollqError):  # not acknowledged (EnqueueUndoneError: undone by the failover)
                    enqueue_errors += 1
                if "named" not in events and servers.primary_named() == servers.replica_port:
                    events["named"] = time.monotonic() - killed_at
                if "restarted" not in events and time.monotonic() - killed_at >= args.rejoin_after:
                    servers.restart_old_primary()
                    events["restarted"] = time.monotonic() - killed_at
                time.sleep(0.25)
            failover = {
                "lag_ms_each_way": args.lag_ms,
                "replica_behind_bytes_max": max(behind, default=0),
                "replica_behind_bytes_median": sorted(behind)[len(behind) // 2] if behind else 0,
                "acknowledged_while_lagging": acked_in_lag,
                "enqueue_errors_while_lagging": lag_errors,
                "acknowledged_after_kill": len(soak.ids) - acked_at_kill,
                "enqueue_errors_after_kill": enqueue_errors,
                "producer_replication_shortfalls": soak.producer.lifecycle.replication_shortfalls - shortfalls_before,
                "sentinels_named_replica_after_s": round(events["named"], 2) if "named" in events else None,
            }
            print(f"failover: {failover}", flush=True)

            # 4. drain
            deadline = time.monotonic() + args.drain_timeout
            wanted = set(soak.ids)
            while time.monotonic() < deadline:
                if wanted <= {rid for _, rid in trainer.received}:
                    break
                time.sleep(0.5)
            time.sleep(2)
            alive = [name for name, p in soak.workers.items() if p.poll() is None]
            exited = [name for name, p in soak.workers.items() if p.poll() is not None]  # by themselves: not killed
            final = connect(url)
            keys = Keys(NAMESPACE)
            pipe = final.pipeline(transaction=False)
            for rid in refused_ids:
                pipe.exists(keys.task(rid))
            exists = pipe.execute() if refused_ids else []
            left_behind = sum(exists)
            left_batches = sorted({rid.rsplit("-", 1)[0] for rid, e in zip(refused_ids, exists, strict=True) if e})
            stats = {k.decode(): v.decode() for k, v in final.hgetall(keys.stats).items()}
            on_stream = _stream_counts(final, keys.results)
        finally:
            clients.stop.set()
            trainer.stop()
            for process in [*soak.workers.values(), gateway]:
                process.terminate()
            for process in [*soak.workers.values(), gateway]:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
            servers.stop()
            for log in directory.glob("soak-*.log"):
                # The exceptions a worker's log shows a traceback of (handled or not), each with how often.
                for line in log.read_text(errors="replace").splitlines():
                    if re.match(r"[\w.]+(Error|Exception|Exit): ", line) or "unhandled exception" in line:
                        tracebacks[line[:160]] = tracebacks.get(line[:160], 0) + 1

    delivered = Counter(rid for _, rid in trainer.received)
    lost = sorted(set(soak.ids) - set(delivered))
    doubled = sorted(rid for rid, n in delivered.items() if n > 1)
    stream_lost = sorted(set(soak.ids) - set(on_stream))
    stream_twice = sorted(rid for rid, n in on_stream.items() if n > 1)
    result = {
        "acknowledged": len(soak.ids),
        "delivered": sum(delivered.values()),
        "lost": len(lost),
        "delivered_twice": len(doubled),
        "new_primary_stream_missing": len(stream_lost),
        "new_primary_stream_twice": len(stream_twice),
        "statuses": dict(trainer.statuses),
        "kills": kills,
        "workers_alive_at_end": len(alive),
        "oom_batches_refused": refused_batches,
        "oom_refused_tasks_left_behind": left_behind,
        "oom_batches_left_behind": left_batches,
        "oom_refusals": refusals,
        "lagging_replica_failover": failover,
        "trainer_reconnects": trainer.errors,
        "workers_exited_by_themselves": exited,
        "worker_log_exceptions": tracebacks,
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
    }
    print(json.dumps(result, indent=1))
    print(write_result("hostile_soak", result, sys.argv[1:], settings=vars(args)))
    bad = lost or doubled or stream_lost or stream_twice or left_behind or clients.forged_accepted or exited
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
