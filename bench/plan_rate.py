"""Redis's cost per rollout at the 10,000-worker plan's per-process rate, and one trainer process's read rate.

Run: nice -n 10 python bench/plan_rate.py [--processes 4] [--concurrency 64] [--window 120] [--read 20000]
     [--output plan_rate] [--env ROLLQ_X=value ...] [--redis-config name=value[,name=value...]]

The plan of docs/scaling.md: worker processes each holding 64 rollouts in flight, rollouts of 3 LLM calls of
3-10 s (about 20 s), so about 3.2 rollouts/s per process. Here ``--processes`` stock ``rq worker -w
rollq.worker.RolloutWorker`` processes at ``--concurrency`` run bench/agents.py's SlowLLMAgent (3 turns x
U(3, 10) s, traced, a reward per turn: the mock-LLM rollout of bench/idle.py at the plan's length) against a
private redis-server, fed by a producer that keeps a batch queued, read by a trainer (a consumer group)
in this process. Measured:

1. memory per queued task and per rollout in flight: ``MEMORY USAGE`` of every key, summed, before and after
   processes x concurrency tasks are queued (no worker yet), then with all of them claimed and none finished;
2. over ``--window`` seconds of steady state (after twice the slots have finished, so the common start has spread):
   rollouts finished, Redis CPU (``used_cpu_sys`` + ``used_cpu_user`` deltas of ``INFO cpu``) and commands
   (``INFO commandstats``) per rollout, with the heartbeats, dequeue polls and reaper passes of the
   processes included (what the plan's rate spreads over fewer rollouts than a busy benchmark's);
   connections per worker process (``CLIENT LIST`` by name); Redis CPU by command (``usec`` of
   ``INFO commandstats``); then, feeding stopped and every rollout finished, the idle floor: Redis CPU per
   second with the same processes and nothing to do over ``--idle-window`` seconds;
3. one trainer process's read rate: the stream is filled to ``--read`` entries (copies of the run's real
   entries under new rollout ids), then one ``Producer.rollouts(group=...)`` reader, a fresh group, reads
   them all: rollouts/s and MB/s.

``--env`` sets a worker environment variable (repeatable; e.g. ``ROLLQ_ROLLOUT_TRACE=failed``), ``--redis-config``
Redis settings of the private redis-server (``CONFIG SET`` before anything is queued; e.g. compose.yaml's
``stream-node-max-bytes=512,hash-max-listpack-value=256``).

Writes bench/results/plan_rate.json; docs/scaling.md builds the 10,000-worker arithmetic on it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.common import (  # noqa: E402
    commandstats,
    outcomes,
    private_redis,
    rate,
    redis_settings,
    rollq_workers,
    worker_settings,
    write_result,
)
from rollq.producer import Producer  # noqa: E402
from rollq.store.keys import Keys  # noqa: E402

NAMESPACE = "plan"
AGENT = "bench.agents:SlowLLMAgent"


def key_memory(connection: redis.Redis) -> int:
    """``MEMORY USAGE`` of every key, summed: what the data takes, without scripts, clients or allocator slack."""
    total = 0
    pipe = connection.pipeline(transaction=False)
    for key in connection.scan_iter(count=1000):
        pipe.memory_usage(key, samples=0)
    for used in pipe.execute():
        total += int(used or 0)
    return total


def command_usec(connection: redis.Redis) -> dict[str, int]:
    """Microseconds of Redis CPU per command since the server started (``INFO commandstats``)."""
    info: Any = connection.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stats["usec"]) for name, stats in info.items()}


def redis_cpu(connection: redis.Redis) -> float:
    info: Any = connection.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def in_flight(connection: redis.Redis, keys: Keys) -> int:
    return int(connection.zcard(keys.inflight))  # type: ignore[arg-type]


def trainer_read_rate(connection: redis.Redis, url: str, keys: Keys, entries: int) -> dict[str, Any]:
    """Fill the results stream to ``entries`` with copies of its real entries (new rollout ids), then time one
    consumer-group reader of a fresh group reading them all."""
    real: Any = connection.xrange(keys.results, count=2000)
    have = int(connection.xlen(keys.results))  # type: ignore[arg-type]
    pipe = connection.pipeline(transaction=False)
    for i in range(max(0, entries - have)):
        fields: dict[bytes, bytes] = dict(real[i % len(real)][1])
        old = fields[b"rollout_id"]
        new = f"rollout-{uuid.uuid4().hex}".encode()
        copy = {k: v.replace(old, new) for k, v in fields.items()}
        pipe.xadd(keys.results, copy)  # type: ignore[arg-type]
        if len(pipe) >= 500:
            pipe.execute()
    pipe.execute()
    total = int(connection.xlen(keys.results))  # type: ignore[arg-type]
    payload = sum(len(v) for _, f in real for v in f.values()) / len(real)
    reader = Producer.from_url(url, NAMESPACE).rollouts(group="read-rate", consumer="r0", idle_timeout=1.0)
    started = time.perf_counter()
    count = sum(1 for _ in reader)
    seconds = time.perf_counter() - started - 1.0  # less the idle timeout that ended the iteration
    return {
        "stream_entries": total,
        "rollouts_read": count,
        "entry_bytes_mean": round(payload),
        "seconds": round(seconds, 2),
        "rollouts_per_s": rate(count, seconds),
        "mb_per_s": round(count * payload / seconds / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--window", type=float, default=120.0, help="seconds of steady state measured")
    parser.add_argument("--idle-window", type=float, default=30.0, help="seconds of the idle floor measured")
    parser.add_argument("--output", default="plan_rate", help="results file name under bench/results/")
    parser.add_argument("--read", type=int, default=20000, help="stream entries the trainer read rate reads")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help="a worker environment variable")
    parser.add_argument("--redis-config", default="default", help="Redis settings: name=value[,name=value...]")
    args = parser.parse_args()
    slots = args.processes * args.concurrency
    keys = Keys(NAMESPACE)
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-plan-") as logs:
        probe = server.client(client_name="bench-probe")
        for name, value in redis_settings(args.redis_config).items():
            probe.config_set(name, value)
        producer = Producer.from_url(server.url, NAMESPACE)
        empty = key_memory(probe)
        producer.enqueue_many([{"i": i} for i in range(slots)], mode="train")
        queued_memory = key_memory(probe)
        queued_bytes = (queued_memory - empty) / slots
        workers = rollq_workers(
            server.url,
            NAMESPACE,
            args.processes,
            agent=AGENT,
            concurrency=args.concurrency,
            log_dir=Path(logs),
            extra_env=worker_settings(args.env),
        )
        stop = threading.Event()
        enqueued = [slots]
        read: list[str] = []

        def feed() -> None:
            while not stop.is_set():
                if int(probe.llen(keys.rq_queue)) < slots // 2:  # type: ignore[arg-type]
                    producer.enqueue_many([{"i": enqueued[0] + j} for j in range(slots // 2)], mode="train")
                    enqueued[0] += slots // 2
                time.sleep(0.2)

        def train() -> None:
            reader = Producer.from_url(server.url, NAMESPACE).rollouts(group="trainers", consumer="t0", idle_timeout=1)
            while not stop.is_set():
                read.extend(r.rollout_id for r in reader)

        try:
            workers.wait_registered(probe, NAMESPACE)
            deadline = time.monotonic() + 120
            while in_flight(probe, keys) < slots and outcomes(probe, NAMESPACE)[0] == 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("slots did not fill")
                time.sleep(0.1)
            full_at_first_finish = outcomes(probe, NAMESPACE)[0] == 0
            inflight_bytes = (key_memory(probe) - queued_memory) / slots
            threads = [threading.Thread(target=feed, daemon=True), threading.Thread(target=train, daemon=True)]
            for t in threads:
                t.start()
            # Steady state: two rounds of the slots finished, so that the first round's common start has spread out.
            while outcomes(probe, NAMESPACE)[0] < 2 * slots:
                workers.check_alive()
                time.sleep(0.5)
            usec0 = command_usec(probe)
            cpu0, cmd0, done0, t0 = redis_cpu(probe), commandstats(probe), outcomes(probe, NAMESPACE)[0], time.time()
            connections: Counter[str] = Counter()
            samples = 0
            members: Any = probe.smembers(f"rq:workers:{NAMESPACE}")
            worker_names = {m.decode().rsplit(":", 1)[-1] for m in members}
            while time.time() - t0 < args.window:
                workers.check_alive()
                per_name = Counter(c.get("name") for c in probe.client_list())
                for name in worker_names:
                    connections[name] = max(connections[name], per_name.get(name, 0))
                samples += 1
                time.sleep(1.0)
            cpu1, cmd1, done1, t1 = redis_cpu(probe), commandstats(probe), outcomes(probe, NAMESPACE)[0], time.time()
            usec1 = command_usec(probe)
            in_flight_mean = in_flight(probe, keys)
            used: Any = probe.info("memory")
            # The floor: the same processes with nothing to do (feeding stopped, every rollout finished).
            stop.set()
            while in_flight(probe, keys) or int(probe.llen(keys.rq_queue)):  # type: ignore[arg-type]
                workers.check_alive()
                time.sleep(0.5)
            time.sleep(2.0)
            idle_cpu0, idle_t0 = redis_cpu(probe), time.time()
            time.sleep(args.idle_window)
            idle_cpu = (redis_cpu(probe) - idle_cpu0) / (time.time() - idle_t0)
        finally:
            stop.set()
            workers.stop()
        finished = done1 - done0
        seconds = t1 - t0
        commands = sum(cmd1.values()) - sum(cmd0.values()) - samples - 4  # less the probe's own CLIENT LIST, INFOs
        steady = {
            "seconds": round(seconds, 1),
            "rollouts_finished": finished,
            "rollouts_per_s": rate(finished, seconds),
            "rollouts_per_s_per_process": round(finished / seconds / args.processes, 2),
            "in_flight_at_end": in_flight_mean,
            "redis_cpu_seconds": round(cpu1 - cpu0, 3),
            "redis_cpu_ms_per_rollout": round(1000 * (cpu1 - cpu0) / finished, 3) if finished else None,
            "redis_cpu_share_of_a_core": round((cpu1 - cpu0) / seconds, 4),
            "redis_commands_per_rollout": round(commands / finished, 1) if finished else None,
            "redis_command_cpu_ms_per_rollout_top": {
                name: round(delta / 1000 / finished, 4)
                for name, delta in sorted(
                    ((n, usec1.get(n, 0) - usec0.get(n, 0)) for n in usec1), key=lambda kv: -kv[1]
                )[:12]
            }
            if finished
            else {},
            "redis_cpu_share_of_a_core_idle_floor": round(idle_cpu, 4),
            "redis_cpu_ms_per_s_per_idle_process": round(1000 * idle_cpu / args.processes, 3),
            "redis_cpu_ms_per_rollout_above_idle_floor": round(
                1000 * ((cpu1 - cpu0) - idle_cpu * seconds) / finished, 3
            )
            if finished
            else None,
            "worker_connections_max_per_process": max(connections.values(), default=0),
            "used_memory_at_end_mb": round(int(used["used_memory"]) / 1e6, 1),
            "key_memory_at_end_mb": round(key_memory(probe) / 1e6, 1),
            "trainer_read": len(read),
        }
        print(steady, flush=True)
        reading = trainer_read_rate(probe, server.url, keys, args.read)
        print(reading, flush=True)
    write_result(
        args.output,
        {
            "processes": args.processes,
            "concurrency": args.concurrency,
            "agent": AGENT,
            "memory": {
                "bytes_per_queued_task": round(queued_bytes),
                "bytes_per_rollout_in_flight_over_queued": round(inflight_bytes),
                "bytes_per_rollout_in_flight": round(queued_bytes + inflight_bytes),
                "measured_with_all_slots_full_before_any_finish": full_at_first_finish,
            },
            "steady_state": steady,
            "trainer_read": reading,
        },
        sys.argv[1:],
        settings=vars(args),
    )


if __name__ == "__main__":
    main()
