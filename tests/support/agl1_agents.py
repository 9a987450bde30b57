"""Agent Lightning 1.0 agents as AL's own examples write them: plain classes, ``async def run()``, the task in
the environment.

:class:`CalcAgent` is AL 1.0.2's ``examples/calc_x/calc_agent.py`` with the openai SDK in place of AutoGen
and its MCP calculator (the same environment, the same answer format and reward rule, the same reward
event posted with ``httpx`` to ``AGL_EVENT_URL`` with the bearer key): a first call to think, a second
for the answer, so a rollout has two triplets and the reward belongs on the last.
"""

from __future__ import annotations

import os
import re

import httpx
from openai import AsyncOpenAI

OUTPUT_FORMAT = (
    "Output the answer when you are ready. The answer should be surrounded by "
    "three sharps (`###`), in the form of ### ANSWER: <answer> ###."
)


class CalcAgent:
    async def run(self) -> None:
        question = os.environ["QUESTION"]
        result = os.environ["RESULT"]
        agl_key = os.environ["AGL_KEY"]
        event_url = os.environ["AGL_EVENT_URL"]
        client = AsyncOpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=agl_key or "none", max_retries=6)
        messages = [{"role": "user", "content": f"{question} {OUTPUT_FORMAT}"}]
        thought = await client.chat.completions.create(model="auto", messages=messages)  # type: ignore[arg-type]
        messages += [
            {"role": "assistant", "content": thought.choices[0].message.content or ""},
            {"role": "user", "content": "Now the final answer."},
        ]
        response = await client.chat.completions.create(model="auto", messages=messages)  # type: ignore[arg-type]
        raw_answer = response.choices[0].message.content or ""
        match = re.search(r"###\s*ANSWER:\s*(.+?)(\s*###|$)", raw_answer)
        answer = match.group(1).strip() if match else raw_answer.strip()
        reward = 1.0 if answer == result else 0.0
        httpx.post(
            event_url,
            json={"event_type": "reward", "data": {"value": reward}},
            headers={"Authorization": f"Bearer {agl_key}"},
            timeout=10.0,
        ).raise_for_status()


class CrashingAgent:
    async def run(self) -> None:
        raise RuntimeError("the agent fell over")


class SleepingAgent:
    """Writes its pid to ``PIDFILE`` and sleeps: for the tests that cut a rollout short."""

    async def run(self) -> None:
        import asyncio

        with open(os.environ["PIDFILE"], "w") as out:
            out.write(str(os.getpid()))
        await asyncio.sleep(600)
