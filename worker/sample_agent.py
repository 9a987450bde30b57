"""The sample agent ``rollq demo`` runs: arithmetic questions against a simulated LLM.

It shows the parts a real agent uses: an ``LLM`` resource (model, sampling
temperature), a ``PromptTemplate`` resource, one GenAI span per LLM call and a
reward span per turn, from which rollq derives triplets and the final reward.
No network: the "LLM" answers after a short sleep, right more often when the
temperature is low.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from rollq.models.contract import LLM, NamedResources, PromptTemplate

from .agent import LitAgent
from .tracer import emit_reward, llm_call_span


def sample_resources(temperature: float = 0.3) -> dict[str, Any]:
    """The resources the sample agent expects."""
    return {
        "main_llm": LLM(endpoint="sim://local", model="sim-arith-1", sampling_parameters={"temperature": temperature}),
        "system_prompt": PromptTemplate(template="Compute {a} + {b}. Answer with a number.", engine="f-string"),
    }


def sample_inputs(n: int, seed: int = 0) -> list[dict[str, int]]:
    """``n`` addition questions."""
    rng = random.Random(seed)
    return [{"a": rng.randint(0, 99), "b": rng.randint(0, 99)} for _ in range(n)]


class SampleAgent(LitAgent):
    """Answers ``a + b`` in up to two turns, retrying once when the first answer is wrong."""

    latency = (0.02, 0.1)

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> None:
        llm = resources["main_llm"]
        template = resources["system_prompt"]
        assert isinstance(llm, LLM) and isinstance(template, PromptTemplate)
        temperature = float(llm.sampling_parameters.get("temperature", 0.5))
        prompt = template.template.format(**task_input)
        truth = task_input["a"] + task_input["b"]
        for _turn in range(2):
            with llm_call_span(llm.model, prompt) as span:
                await asyncio.sleep(random.uniform(*self.latency))
                answer = truth if random.random() > temperature else truth + random.choice((-1, 1))
                span.set_attribute("gen_ai.completion", str(answer))
            emit_reward(1.0 if answer == truth else 0.0)
            if answer == truth:
                return None
        return None
