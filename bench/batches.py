"""Training batches at 1000 rollouts in flight: complete groups per second the trainer receives.

Two stock worker processes run ``bench.agents:GroupMemberAgent`` (U(0.2, 0.6) s, a random reward) with
``--in-flight`` rollouts between them, kept full by an enqueuer thread (``enqueue_many(group_size=8,
max_pending=...)``). The trainer side reads for ``--seconds`` in one of two ways, alternating rounds, each on a
fresh namespace:

- ``batches``: ``Producer.batches(batch_size=16)`` (groups, advantages, staleness check, acknowledgements);
- ``hand-written``: what a user would otherwise write: ``Producer.rollouts()`` and a dict of group id -> members,
  a group handed over when its size is reached (no advantages, no failure or staleness policy, no restart).

Reported per round: groups/s, rollouts/s, the trainer process's CPU per group, and the ideal rate
(in-flight / mean agent seconds / group size).

    python bench/batches.py [--in-flight 1000] [--seconds 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import private_redis, rollq_workers, write_result  # noqa: E402
from rollq.models.groups import membership  # noqa: E402
from rollq.producer import Producer  # noqa: E402

GROUP_SIZE = 8
MEAN_AGENT_SECONDS = 0.4


def _enqueuer(producer: Producer, in_flight: int, stop: threading.Event) -> None:
    while not stop.is_set():
        producer.enqueue_many(
            [{"n": 0}] * 8, mode="train", group_size=GROUP_SIZE, max_pending=in_flight, pending_timeout=5
        )


def _read_batches(producer: Producer, seconds: float) -> tuple[int, int]:
    reader = producer.batches(16, timeout=5)
    groups = rollouts = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        batch = reader.next_batch()
        groups += len(batch.groups)
        rollouts += len(batch.rollouts)
    reader.close()
    return groups, rollouts


def _read_by_hand(producer: Producer, seconds: float) -> tuple[int, int]:
    pending: dict[str, list[Any]] = {}
    groups = rollouts = 0
    end = time.monotonic() + seconds
    for rollout in producer.rollouts(group="by-hand", idle_timeout=5):
        found = membership(rollout.rollout_id, rollout.metadata)
        key = found.group_id if found else rollout.rollout_id
        members = pending.setdefault(key, [])
        members.append(rollout)
        if len(members) == (found.size if found else 1):
            del pending[key]
            groups += 1
            rollouts += len(members)
        if time.monotonic() >= end:
            break
    return groups, rollouts


def run_round(url: str, way: str, in_flight: int, seconds: float, log_dir: Path) -> dict[str, Any]:
    namespace = f"bench-batches-{uuid.uuid4().hex[:8]}"
    producer = Producer.from_url(url, namespace)
    workers = rollq_workers(
        url, namespace, 2, agent="bench.agents:GroupMemberAgent", concurrency=in_flight // 2 + 8, log_dir=log_dir
    )
    stop = threading.Event()
    feeder = threading.Thread(target=_enqueuer, args=(producer, in_flight, stop), daemon=True)
    try:
        workers.wait_registered(producer.connection, namespace)
        feeder.start()
        time.sleep(5)  # warm up: the workers fill up to in_flight
        cpu0, t0 = time.process_time(), time.monotonic()
        groups, rollouts = (_read_batches if way == "batches" else _read_by_hand)(producer, seconds)
        elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    finally:
        stop.set()
        feeder.join(timeout=10)
        workers.stop()
    return {
        "way": way,
        "groups_per_second": round(groups / elapsed, 1),
        "rollouts_per_second": round(rollouts / elapsed, 1),
        # The enqueuer thread shares this process: its CPU is in both ways' figures alike.
        "trainer_process_cpu_ms_per_group": round(1000 * cpu / max(groups, 1), 3),
        "seconds": round(elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rounds: list[dict[str, Any]] = []
    with private_redis() as server, tempfile.TemporaryDirectory(prefix="rollq-bench-batches-") as logs:
        for n in range(args.rounds):
            for way in ("batches", "hand-written") if n % 2 == 0 else ("hand-written", "batches"):
                result = run_round(server.url, way, args.in_flight, args.seconds, Path(logs))
                result["round"] = n + 1
                print(result, flush=True)
                rounds.append(result)
    ideal = args.in_flight / MEAN_AGENT_SECONDS / GROUP_SIZE
    summary = {
        way: statistics.fmean(r["groups_per_second"] for r in rounds if r["way"] == way)
        for way in ("batches", "hand-written")
    }
    ratios = [
        round(b["groups_per_second"] / h["groups_per_second"], 3)
        for b, h in zip(
            [r for r in rounds if r["way"] == "batches"], [r for r in rounds if r["way"] == "hand-written"], strict=True
        )
    ]
    write_result(
        "batches",
        {
            "settings": {"in_flight": args.in_flight, "group_size": GROUP_SIZE, "batch_size": 16, "workers": 2},
            "ideal_groups_per_second": round(ideal, 1),
            "mean_groups_per_second": summary,
            "batches_over_hand_written_per_round": ratios,
            "rounds": rounds,
        },
        sys.argv[1:],
    )
    print(f"ideal {ideal:.1f} groups/s; batches {summary['batches']:.1f}, hand-written {summary['hand-written']:.1f}")


if __name__ == "__main__":
    main()
