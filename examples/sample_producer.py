"""A sample producer: publish the sample agent's resources, queue addition tasks, wait for their rollouts.

Run it against the Redis your workers use (compose.yaml runs it as the ``producer`` service)::

    ROLLQ_REDIS_URL=redis://:password@localhost:6379/0 python examples/sample_producer.py --tasks 100
"""

from __future__ import annotations

import argparse
import os
import statistics

from rollq.producer import Producer
from rollq.worker.sample_agent import sample_inputs, sample_resources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100, help="tasks to queue (default 100)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for every rollout (default 600)")
    args = parser.parse_args()

    # The URL (with its password) comes from ROLLQ_REDIS_URL, never the command line.
    producer = Producer.from_url(None, os.environ.get("ROLLQ_NAMESPACE", "rollq"))
    resources_id = producer.update_resources(sample_resources())
    tasks = producer.enqueue_many(sample_inputs(args.tasks), mode="train", resources_id=resources_id)
    print(f"queued {len(tasks)} tasks in namespace {producer.namespace!r} with resources {resources_id}", flush=True)

    rollouts = producer.wait([task.rollout_id for task in tasks], timeout=args.timeout)
    rewards = [r.final_reward for r in rollouts if r.final_reward is not None]
    succeeded = sum(1 for r in rollouts if r.metadata.get("status") == "succeeded")
    mean = statistics.fmean(rewards) if rewards else 0.0
    print(f"{len(rollouts)} rollouts back: {succeeded} succeeded, mean reward {mean:.3f}")


if __name__ == "__main__":
    main()
