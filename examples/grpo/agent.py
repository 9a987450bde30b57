"""The agent the workers run: ask the policy to reverse a word, score the answer.

It uses the ``openai`` SDK against the LLM resource's endpoint, which a rollq worker points at its capturing
proxy: the triplet gets the exact token ids and logprobs the server sampled, with the resources version the call
ran against. Start workers with ``ROLLQ_AGENT=examples.grpo.agent:ReverseAgent`` from the repository root.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from rollq.models.contract import LLM, NamedResources
from rollq.worker.agent import LitAgent

PROMPT_PREFIX = "reverse: "  # policy.PROMPT_PREFIX; the agent does not import torch


def score(word: str, answer: str) -> float:
    """The share of positions where ``answer`` has the reversed word's letter (policy.reward, without torch)."""
    target = word[::-1]
    return sum(1.0 for a, b in zip(answer.strip().lower(), target, strict=False) if a == b) / len(target)


class ReverseAgent(LitAgent):
    _client: AsyncOpenAI | None = None

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> float:
        llm = resources["policy"]
        assert isinstance(llm, LLM)
        word = str(task_input["word"])
        # One HTTP client per process; each rollout talks to its own address on the worker's capturing proxy.
        if self._client is None:
            self._client = AsyncOpenAI(base_url=llm.endpoint, api_key="unused", max_retries=2)
        reply = await self._client.with_options(base_url=llm.endpoint).chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": PROMPT_PREFIX + word}],
            max_tokens=len(word),
        )
        return score(word, reply.choices[0].message.content or "")
