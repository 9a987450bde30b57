"""What the GIL switch interval costs a worker: the sample agent at the proxy's 1 ms, at 5 ms and at 0.25 ms.

Run: python bench/switch_interval.py [--rounds 6] [--window 20] [--in-flight 256]

The capturing proxy lowers its worker process's switch interval to 1 ms while its thread serves a call over its socket
(``rollq/worker/capture/gil.py``): the proxy's thread waits for the GIL while the agents' loop runs Python, up to one
interval per step of a call. ``bench/capture.py --switch-interval 0.00025 --base HEAD`` measures what 0.25 ms does to
the proxy's added latency; this measures what it costs the agents: sample-agent rollouts (the ``openai`` client, 1-2
calls of 0.1-0.5 s to the demo's simulated LLM, capture on) at ``--in-flight`` on 2 worker processes:
``bench.agents:SwitchIntervalSampleAgent`` (the proxy's 1 ms throughout: the stock sample agent had it until the proxy
lowered it only for its own calls, commit 4c4ec23, and ran this row until then), ``bench.agents:LongSwitchSampleAgent``
(the same agent at the interpreter's default 5 ms, as if the proxy left the interval alone) and
``bench.agents:ShortSwitchSampleAgent`` (0.25 ms) taking turns, their order reversed every round: rollouts/s and worker
CPU per rollout over each round's measurement window (``bench/mock_llm.py``'s). Writes
bench/results/switch_interval.json."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agents import LongSwitchSampleAgent, ShortSwitchSampleAgent  # noqa: E402
from bench.capture import agents_taking_turns_main  # noqa: E402
from rollq.worker.capture.gil import SWITCH_INTERVAL_SECONDS  # noqa: E402

AGENTS = {
    f"{SWITCH_INTERVAL_SECONDS * 1000:g} ms": "bench.agents:SwitchIntervalSampleAgent",
    f"{LongSwitchSampleAgent.interval * 1000:g} ms": "bench.agents:LongSwitchSampleAgent",
    f"{ShortSwitchSampleAgent.interval * 1000:g} ms": "bench.agents:ShortSwitchSampleAgent",
}


def main() -> None:
    agents_taking_turns_main("switch_interval", AGENTS, __doc__ or "", rounds=6, window=20.0)


if __name__ == "__main__":
    main()
