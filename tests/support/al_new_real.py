"""Agents written against the real Agent Lightning 0.2.2 / 0.3.0 API (the same code runs on both releases).

Only worker processes started from the test's AL 0.2.2 or 0.3.0 venv load this module
(``ROLLQ_AGENT=tests.support.al_new_real:Name``). Each asks the ``main_llm`` resource one calc question with the
``openai`` SDK, scores the answer and records the score with AL's own ``emit_reward``; none returns a
reward, so the rollout's reward is the one ``emit_reward`` wrote. Each also checks it was called the way
AL's own runner calls it: AL's own ``AttemptedRollout``, AL's own ``LLM`` class.

- ``RolloutAgent``: a ``LitAgent`` implementing ``rollout(task, resources, rollout)``;
- ``AsyncRolloutAgent``: ``rollout_async(task, resources, rollout)``;
- ``LegacyAgent``: a 0.2/0.3 ``LitAgent`` keeping AL 0.1's ``training_rollout(task, rollout_id, resources)``;
- ``rollout_function`` / ``async_rollout_function``: ``@rollout`` function agents taking ``llm``
  (``async_rollout_function`` also ``rollout``); with a ``ProxyLLM`` resource AL turns it into an ``LLM``
  addressed by rollout and attempt, and the ``api_key`` the trainer set must reach the model.
"""

from __future__ import annotations

import os
from typing import Any

from agentlightning import LLM, AttemptedRollout, LitAgent, emit_reward, rollout
from openai import AsyncOpenAI, OpenAI

QUESTION = "{question} Output the answer as ### ANSWER: <answer> ###."


def _messages(task: dict[str, Any]) -> Any:
    return [{"role": "user", "content": QUESTION.format(question=task["question"])}]


def _score(task: dict[str, Any], answer: str | None) -> float:
    return float((answer or "").strip() == f"### ANSWER: {task['result']} ###")


def _key(llm: Any) -> str:
    return getattr(llm, "api_key", None) or os.environ.get("OPENAI_API_KEY", "none")


def _ask(llm: Any, task: dict[str, Any]) -> str | None:
    client = OpenAI(base_url=llm.endpoint, api_key=_key(llm), max_retries=0)
    return client.chat.completions.create(model=llm.model, messages=_messages(task)).choices[0].message.content


async def _ask_async(llm: Any, task: dict[str, Any]) -> str | None:
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=_key(llm), max_retries=0)
    answer = await client.chat.completions.create(model=llm.model, messages=_messages(task))
    return answer.choices[0].message.content


def _check(resources: Any, rollout: Any) -> Any:
    assert isinstance(rollout, AttemptedRollout), type(rollout)
    assert rollout.attempt.sequence_id >= 1 and rollout.attempt.rollout_id == rollout.rollout_id
    llm = resources["main_llm"]
    assert isinstance(llm, LLM), type(llm)
    return llm


class RolloutAgent(LitAgent):
    def rollout(self, task: Any, resources: Any, rollout: Any) -> Any:
        emit_reward(_score(task, _ask(_check(resources, rollout), task)))


class AsyncRolloutAgent(LitAgent):
    async def rollout_async(self, task: Any, resources: Any, rollout: Any) -> Any:
        emit_reward(_score(task, await _ask_async(_check(resources, rollout), task)))


class LegacyAgent(LitAgent):
    # Both methods: under AL 0.2/0.3 the default validation_rollout calls rollout(), not training_rollout()
    # (AL's own runner fails such an agent's val tasks too).
    def training_rollout(self, task: Any, rollout_id: str, resources: Any) -> Any:
        assert isinstance(rollout_id, str) and isinstance(resources["main_llm"], LLM)
        emit_reward(_score(task, _ask(resources["main_llm"], task)))

    def validation_rollout(self, task: Any, rollout_id: str, resources: Any) -> Any:
        return self.training_rollout(task, rollout_id, resources)


@rollout
def rollout_function(task: Any, llm: Any) -> Any:
    emit_reward(_score(task, _ask(llm, task)))


@rollout
async def async_rollout_function(task: Any, llm: Any, rollout: Any) -> Any:
    assert isinstance(llm, LLM) and isinstance(rollout, AttemptedRollout)
    emit_reward(_score(task, await _ask_async(llm, task)))
