"""The sample agent (``rollq demo``'s) against the simulated LLM over HTTP, with the real ``openai`` client."""

from __future__ import annotations

import asyncio

from rollq.ops.sim_llm import SimulatedLLM
from rollq.worker.sample_agent import SampleAgent, sample_inputs, sample_resources


def test_sample_agent_spreads_its_calls_over_a_few_clients_it_keeps() -> None:
    # One openai client for every rollout of a process made its connection pool look at every connection on each
    # request (httpx2): ~15-20% of a worker's CPU at 128 rollouts at once. The calls take turns over a few clients.
    agent = SampleAgent()
    with SimulatedLLM(latency=(0.0, 0.01)) as llm:
        resources = sample_resources(temperature=0.0, endpoint=llm.url)

        async def rollouts() -> list[object]:
            inputs = sample_inputs(3 * SampleAgent.clients)
            await asyncio.gather(*(agent.training_rollout_async(x, f"r{i}", resources) for i, x in enumerate(inputs)))
            first = list(agent._clients)
            await asyncio.gather(*(agent.training_rollout_async(x, f"s{i}", resources) for i, x in enumerate(inputs)))
            return first

        first = asyncio.run(rollouts())

    assert len(first) == SampleAgent.clients
    assert agent._clients == first  # kept, not made anew
