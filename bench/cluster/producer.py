"""The producer and trainer, run inside the producer namespace (``python -m bench.cluster --role producer``).

They keep tasks queued, read every rollout through a consumer group, and measure Redis over each window; they
talk to the driver (:mod:`bench.cluster.measure`) over stdout, a line each: QUEUED, SETTING, WINDOW_START,
WINDOW_END, RESULT <json>, or ERROR.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.cluster.network import write_rtt


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
    # Not set: RolloutPolicy's default (the dead host's ``defaults`` profile).
    policy = RolloutPolicy(unresponsive_seconds=args.unresponsive_seconds) if args.unresponsive_seconds else None
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
        wanted = set(ids)
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "down"], check=True)
        down_at = time.time()
        at_cut = len(trainer.seen & wanted)
        time.sleep(float(args.outage))
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        up_at = time.time()
        at_restore = len(trainer.seen & wanted)
        deadline = time.monotonic() + 300
        while len(trainer.seen & wanted) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.2)
        all_in_at = time.time()
        outage = {
            "down_for_seconds": round(up_at - down_at, 1),
            "link_down_at": time.strftime("%H:%M:%S", time.gmtime(down_at)) + f".{int(down_at % 1 * 10)} UTC",
            "link_up_at": time.strftime("%H:%M:%S", time.gmtime(up_at)) + f".{int(up_at % 1 * 10)} UTC",
            "received_before_cut": at_cut,
            "received_while_down": at_restore - at_cut,
            "received_after_restore": len(trainer.seen & wanted) - at_restore,
            "seconds_from_restore_to_last_received": round(all_in_at - up_at, 1),
        }
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
                "tasks_last_claimed_by_host0_after_restore": sum(1 for r in host0 if float(r[1] or 0) > up_at),
                **outage,
            }
        )
    say("RESULT " + json.dumps(result))
