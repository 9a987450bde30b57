"""Where a rollout should leave finish.lua's arguments for a payload key of its own (rollq/store/payloads.py).

Run: python bench/payload_threshold.py [--sizes 2000,8000,16000,32000,64000,250000,1000000] [--count 500]

For each size, on a private redis-server, ``--count`` rollouts published one at a time with ``Lifecycle.finish`` and
read back by a consumer group, once inline (the rollout a script argument) and once by reference (SET + the key's
name): Redis's own time per rollout (``INFO commandstats``: the finish, the SET, the reader's XREADGROUP, MGET and
XACK) and the wall time of writing and of reading. Prints its figures; writes no results file.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import time  # noqa: E402

from bench.common import private_redis  # noqa: E402
from rollq.models.contract import Rollout  # noqa: E402
from rollq.models.policy import RolloutStatus  # noqa: E402
from rollq.models.wire import rollout_json  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.store import payloads  # noqa: E402
from rollq.store.replies import Claim  # noqa: E402
from rollq.store.transitions import Finish  # noqa: E402

COMMANDS = ("evalsha", "set", "xreadgroup", "mget", "xack")


def run(size: int, by_reference: bool, count: int) -> tuple[int, float, float, float]:
    """(rollout bytes, Redis µs per rollout, write ms, read ms) for ``count`` rollouts of about ``size`` bytes."""
    payloads.PAYLOAD_THRESHOLD = 0 if by_reference else 1 << 62
    with private_redis() as server:
        producer = Producer.from_url(server.url, "threshold")
        tasks = producer.enqueue_many([{"i": i} for i in range(count)])
        claims = []
        for t in tasks:
            job_id = producer.connection.hget(producer.keys.task(t.rollout_id), "job").decode()  # type: ignore[union-attr]
            claim = producer.lifecycle.claim(t.rollout_id, job_id, "w")
            assert isinstance(claim, Claim), claim
            claims.append(claim)
        reader = iter(producer.rollouts(idle_timeout=5.0, batch=1))
        tokens = list(range(size // 7))
        producer.connection.config_resetstat()
        write = read = 0.0
        data = b""
        for task, claim in zip(tasks, claims, strict=True):
            data = rollout_json(Rollout(rollout_id=task.rollout_id, metadata={"token_ids": tokens}))
            t0 = time.perf_counter()
            producer.lifecycle.finish(
                Finish(
                    rollout_id=task.rollout_id,
                    attempt=claim.attempt,
                    rollout_json=data,
                    status=RolloutStatus.SUCCEEDED,
                    results_maxlen=1000,
                    dead_letter=False,
                    now=time.time(),
                )
            )
            t1 = time.perf_counter()
            next(reader)
            write, read = write + t1 - t0, read + time.perf_counter() - t1
        stats = producer.connection.info("commandstats")
        usec = sum(float(v["usec"]) for k, v in stats.items() if k.removeprefix("cmdstat_") in COMMANDS)
        reader.close()  # type: ignore[attr-defined]
    return len(data), usec / count, 1000 * write / count, 1000 * read / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,8000,16000,32000,64000,250000,1000000")
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        for by_reference in (False, True):
            n, usec, write, read = run(size, by_reference, args.count)
            print(
                f"{n:>9,} bytes {'by reference' if by_reference else 'inline      '}: Redis {usec:7,.0f} µs per "
                f"rollout, wall: write {write:.2f} ms, read {read:.2f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
