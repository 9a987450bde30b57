"""The sample agent ``rollq demo`` runs: arithmetic questions asked of an LLM with the ``openai`` client.

It shows the parts a real agent uses: an ``LLM`` resource (endpoint, model,
sampling temperature), a ``PromptTemplate`` resource, plain ``openai`` calls and
one ``emit_reward`` per answer. It knows nothing of rollq's capture: the worker
points the endpoint at its capturing proxy, which records each call with its
token ids, and rollq makes one triplet per call. ``rollq demo`` serves a
simulated LLM over HTTP (:mod:`rollq.ops.sim_llm`); with the endpoint
``sim://local`` (the compose sample) the agent simulates the answers in process.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from rollq.models.contract import LLM, NamedResources, PromptTemplate

from .agent import LitAgent
from .tracer import emit_reward, llm_call_span

IN_PROCESS = "sim://local"


def sample_resources(temperature: float = 0.3, endpoint: str = IN_PROCESS) -> dict[str, Any]:
    """The resources the sample agent expects; ``endpoint`` is an OpenAI-compatible base URL or ``sim://local``."""
    return {
        "main_llm": LLM(endpoint=endpoint, model="sim-arith-1", sampling_parameters={"temperature": temperature}),
        "system_prompt": PromptTemplate(template="Compute {a} + {b}. Answer with a number.", engine="f-string"),
    }


def sample_inputs(n: int, seed: int = 0) -> list[dict[str, int]]:
    """``n`` addition questions."""
    rng = random.Random(seed)
    return [{"a": rng.randint(0, 99), "b": rng.randint(0, 99)} for _ in range(n)]


class SampleAgent(LitAgent):
    """Answers ``a + b`` in up to two turns, retrying once when the first answer is wrong."""

    latency = (0.02, 0.1)

    clients = 8
    """Clients (connection pools) the process's rollouts take turns with. The ``openai`` client's pool (httpx2)
    looks at every connection it holds, a ``poll()`` on each idle one, whenever a request starts or ends
    (pydantic/httpx2#1169): with one client for 128 rollouts at once that was ~15-20% of a worker's CPU."""

    def __init__(self) -> None:
        self._clients: list[Any] = []
        self._turn = 0

    def _openai(self, endpoint: str) -> Any:
        import openai

        # A few connection pools shared by every rollout of this process; each rollout has its own base URL.
        if len(self._clients) < self.clients:
            self._clients.append(
                openai.AsyncOpenAI(base_url=endpoint, api_key="sample", max_retries=0, **self._client_options())
            )
        self._turn += 1
        return self._clients[self._turn % len(self._clients)].with_options(base_url=endpoint)

    def _client_options(self) -> dict[str, Any]:
        """More keyword arguments for each ``openai.AsyncOpenAI`` client (none here; a benchmark's agent passes
        an ``http_client`` that times each call)."""
        return {}

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> None:
        llm = resources["main_llm"]
        template = resources["system_prompt"]
        assert isinstance(llm, LLM) and isinstance(template, PromptTemplate)
        temperature = float(llm.sampling_parameters.get("temperature", 0.5))
        prompt = template.template.format(**task_input)
        truth = task_input["a"] + task_input["b"]
        messages: list[Any] = [{"role": "user", "content": prompt}]
        for _turn in range(2):
            if llm.endpoint == IN_PROCESS:
                answer = await self._simulate(llm.model, prompt, truth, temperature)
            else:
                reply = await self._openai(llm.endpoint).chat.completions.create(
                    model=llm.model, messages=messages, temperature=temperature
                )
                answer = reply.choices[0].message.content or ""
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": prompt}]
            correct = answer.strip() == str(truth)
            emit_reward(1.0 if correct else 0.0)
            if correct:
                return None
        return None

    async def _simulate(self, model: str, prompt: str, truth: int, temperature: float) -> str:
        with llm_call_span(model, prompt) as span:
            await asyncio.sleep(random.uniform(*self.latency))
            answer = str(truth if random.random() > temperature else truth + random.choice((-1, 1)))
            span.set_attribute("gen_ai.completion", answer)
        return answer
