"""The sample agent with one ``openai`` client for all its rollouts beside the same agent with several, in one run.

Run: python bench/sample_clients.py [--rounds 2] [--window 15] [--in-flight 256]

Sample-agent rollouts (the ``openai`` client, 1-2 calls of 0.1-0.5 s to the demo's simulated LLM, capture on) on 2
worker processes, ``bench.agents:OneClientSampleAgent`` (one client) and ``rollq.worker.sample_agent:SampleAgent``
(``SampleAgent.clients``) taking turns, their order swapped every round: rollouts/s and worker CPU per rollout over each
round's measurement window (``bench/mock_llm.py``'s). The client's connection pool looks at every connection it
holds whenever a request starts or ends (docs/workers.md, "Many rollouts, one openai client"). Writes
bench/results/sample_clients.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capture import agents_taking_turns_main  # noqa: E402
from rollq.worker.sample_agent import SampleAgent  # noqa: E402

AGENTS = {
    "1 client": "bench.agents:OneClientSampleAgent",
    f"{SampleAgent.clients} clients": "rollq.worker.sample_agent:SampleAgent",
}


def main() -> None:
    agents_taking_turns_main("sample_clients", AGENTS, __doc__ or "", rounds=2, window=15.0)


if __name__ == "__main__":
    main()
