"""Garbage collections in a worker, with its start-up objects in the collector's reach and frozen out of it.

Run: python bench/gc_freeze.py [--rounds 4] [--window 20] [--in-flight 256]

A worker process holds what it imported (rollq, RQ, redis-py, pydantic, the OpenTelemetry SDK, an agent's
``openai``...): about 114,000 objects the cyclic collector tracks, all of which every full collection walks (55 ms
for them alone on this machine, ``gc.collect()`` timed in a process that imported them), though none of them
ever becomes garbage. ``gc.freeze()`` moves every object tracked at that moment into a generation the collector
never walks. This runs sample-agent rollouts (the ``openai`` client, 1-2 calls of 0.1-0.5 s to the demo's simulated
LLM, capture on) at ``--in-flight`` on 2 worker processes, ``bench.agents:GcRecordingSampleAgent`` (a worker as it
is) and ``bench.agents:FrozenSampleAgent`` (the same, what the process has imported frozen when the agent is built)
taking turns, order swapped every round: rollouts/s and worker CPU per rollout over each round's
measurement window (``bench/mock_llm.py``'s), and each worker process's collections by generation over its life
(count, seconds, the longest, the share of the process's CPU). Writes bench/results/gc_freeze.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capture import agents_taking_turns_main  # noqa: E402

AGENTS = {
    "start-up in reach": "bench.agents:GcRecordingSampleAgent",
    "start-up frozen": "bench.agents:FrozenSampleAgent",
}


def main() -> None:
    agents_taking_turns_main("gc_freeze", AGENTS, __doc__ or "", rounds=4, window=20.0, record_gc=True)


if __name__ == "__main__":
    main()
