"""The results stream's Redis memory per payload byte, and what finish.lua's trimming costs.

Run: python bench/results_stream.py [--rollouts 400]

For rollouts of about 2 kB (a reward and a short trace), 50 kB and 230 kB (8 turns
of 4k prompt + 512 response token ids, as JSON), ``--rollouts`` tasks are
enqueued, claimed and finished through rollq's own Lua scripts on a private
redis-server, with a byte limit that makes trimming run. Reported per size: the
payload bytes rollq counts (rollout JSON + id, kept in the stats hash), Redis's
``MEMORY USAGE`` of the stream (SAMPLES 0, exact) and the ratio, the time of
``MEMORY USAGE`` itself (SAMPLES 0 walks the whole stream, so rollq keeps its
own counter instead), and the mean time of a finish call beside a plain
``XADD MAXLEN ~`` of the same payloads (what rollq did before). Writes
bench/results/results_stream.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import private_redis, write_result  # noqa: E402
from rollq.models.contract import Rollout, Triplet  # noqa: E402
from rollq.models.policy import RolloutPolicy, RolloutStatus  # noqa: E402
from rollq.producer import Producer  # noqa: E402
from rollq.store.replies import Claim  # noqa: E402
from rollq.store.transitions import Finish  # noqa: E402


def rollout_json(rollout_id: str, turns: int, prompt_tokens: int, response_tokens: int) -> str:
    rng = random.Random(rollout_id)
    triplets = [
        Triplet(
            prompt={"token_ids": [rng.randrange(150_000) for _ in range(prompt_tokens)]},
            response={"token_ids": [rng.randrange(150_000) for _ in range(response_tokens)]},
            reward=1.0,
        )
        for _ in range(turns)
    ]
    return Rollout(rollout_id=rollout_id, final_reward=1.0, triplets=triplets).model_dump_json()


SIZES = {"2kB": (1, 150, 150), "50kB": (2, 3000, 400), "230kB": (8, 4096, 512)}


def measure(size: str, rollouts: int) -> dict[str, float]:
    turns, prompt, response = SIZES[size]
    with private_redis() as server:
        connection = server.client()
        # A limit holding about half the rollouts: routine trimming keeps about a quarter of them.
        sample = rollout_json("sample", turns, prompt, response)
        limit = len(sample) * rollouts // 2
        producer = Producer(connection, "bench", results_max_bytes=limit, results_maxlen=10**9)
        tasks = producer.enqueue_many([None] * rollouts, policy=RolloutPolicy())
        life = producer.lifecycle
        payloads = [rollout_json(t.rollout_id, turns, prompt, response) for t in tasks]
        elapsed = 0.0
        for task, payload in zip(tasks, payloads, strict=True):
            claim = life.claim(task.rollout_id, producer.keys.job_id(task.rollout_id), "bench")
            started = time.perf_counter()
            life.finish(
                Finish(
                    rollout_id=task.rollout_id,
                    attempt=1,
                    rollout_json=payload,
                    status=RolloutStatus.SUCCEEDED,
                    results_maxlen=10**9,
                    dead_letter=False,
                    now=time.time(),
                )
            )
            elapsed += time.perf_counter() - started
            assert isinstance(claim, Claim), claim
        # Baseline: the plain XADD MAXLEN ~ rollq used before, same payloads, same number kept.
        kept = connection.xlen(producer.keys.results)
        started = time.perf_counter()
        for task, payload in zip(tasks, payloads, strict=True):
            connection.xadd("baseline", {"rollout_id": task.rollout_id, "rollout": payload}, maxlen=kept)
        baseline = time.perf_counter() - started
        counted = int(connection.hget(producer.keys.stats, "results:bytes") or 0)
        started = time.perf_counter()
        used = int(connection.memory_usage(producer.keys.results, samples=0) or 0)
        memory_usage_ms = (time.perf_counter() - started) * 1000
        return {
            "rollout_json_bytes": len(sample),
            "entries_kept": connection.xlen(producer.keys.results),
            "payload_bytes_counted": counted,
            "memory_usage_bytes": used,
            "memory_per_payload_byte": round(used / counted, 3),
            "memory_usage_command_ms": round(memory_usage_ms, 2),
            "finish_mean_ms": round(elapsed / rollouts * 1000, 3),
            "plain_xadd_maxlen_mean_ms": round(baseline / rollouts * 1000, 3),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=400)
    args = parser.parse_args()
    results = {size: measure(size, args.rollouts) for size in SIZES}
    print(json.dumps(results, indent=2))
    argv = ["--rollouts", str(args.rollouts)] if args.rollouts != 400 else []
    print(write_result("results_stream", {"rollouts": args.rollouts, "sizes": results}, argv, settings=vars(args)))


if __name__ == "__main__":
    main()
