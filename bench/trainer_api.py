"""What the trainer-side verbs cost: query_tasks walks, get_rollouts, cancel, and AsyncProducer's gathered waits.

Run: python bench/trainer_api.py [--tasks 20000]

On a private redis-server: ``--tasks`` tasks are enqueued, a tenth of them finished by a
fake worker (claim + finish through the Lua transitions, no RQ worker: only the trainer side
is measured). Then: a full ``query_tasks`` walk (all tasks, and one state), ``get_rollouts``
of the finished ones, ``cancel`` of a thousand queued ones, and ``asyncio.gather`` of one
``AsyncProducer.wait`` per finished task. Writes bench/results/trainer_api.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import private_redis, rate, write_result  # noqa: E402
from rollq.models.contract import Rollout  # noqa: E402
from rollq.models.policy import RolloutStatus, TaskState  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.producer.aio import AsyncProducer  # noqa: E402
from rollq.store.connection import connect_async  # noqa: E402
from rollq.store.transitions import Finish  # noqa: E402


def timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    args = parser.parse_args()
    n = args.tasks
    with private_redis() as server:
        producer = Producer.from_url(server.url, "bench")
        ids = [t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(n)])]
        finished = ids[: n // 10]
        for rid in finished:
            claim = producer.lifecycle.claim(rid, producer.keys.job_id(rid), "bench-worker")
            rollout = Rollout(rollout_id=rid, final_reward=1.0, metadata={"status": "succeeded"})
            producer.lifecycle.finish(
                Finish(
                    rollout_id=rid,
                    attempt=claim.attempt,  # type: ignore[union-attr]
                    rollout_json=rollout.model_dump_json(),
                    status=RolloutStatus.SUCCEEDED,
                    results_maxlen=10 * n,
                    dead_letter=False,
                    now=time.time(),
                )
            )

        def walk(state: TaskState | None) -> int:
            seen, cursor = 0, None
            while True:
                page = producer.query_tasks(state=state, limit=1000, cursor=cursor)
                seen += len(page.tasks)
                if page.cursor is None:
                    return seen
                cursor = page.cursor

        walked_all, walk_all_s = timed(lambda: walk(None))
        walked_done, walk_done_s = timed(lambda: walk(TaskState.SUCCEEDED))
        got, get_s = timed(lambda: producer.get_rollouts(finished))
        cancelled, cancel_s = timed(lambda: producer.cancel(ids[-1000:]))

        async def gathered() -> float:
            async with AsyncProducer(connect_async(server.url), producer) as aio:
                start = time.perf_counter()
                await asyncio.gather(*(aio.wait([rid], timeout=60) for rid in finished))
                return time.perf_counter() - start

        gather_s = asyncio.run(gathered())
        result = {
            "tasks": n,
            "query_tasks_all": {
                "tasks": walked_all,
                "seconds": round(walk_all_s, 3),
                "tasks_per_s": rate(n, walk_all_s),
            },
            "query_tasks_succeeded": {"matched": walked_done, "seconds": round(walk_done_s, 3)},
            "get_rollouts": {"rollouts": len(got), "seconds": round(get_s, 3), "per_s": rate(len(got), get_s)},
            "cancel_queued": {"tasks": len(cancelled), "seconds": round(cancel_s, 3), "per_s": rate(1000, cancel_s)},
            "async_gather_waits": {"waits": len(finished), "seconds": round(gather_s, 3)},
        }
        print(result)
        write_result("trainer_api", result, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
