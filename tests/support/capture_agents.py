"""Agents that call an OpenAI-compatible endpoint the ways real agents do, for the LLM-capture tests.

Workers load them as ``tests.support.capture_agents:Name``. Each reads ``resources["llm"]``
(whose endpoint the worker has pointed at its capturing proxy) and does what
``task_input["steps"]`` lists, in order; a step is one of

- ``"sync"``, ``"async"``, ``"stream"``, ``"completion"``, ``"httpx"``, ``"curl"``, ``"tools"``:
  one LLM call made with that client (``sync`` = the ``openai`` SDK's sync
  client, ``curl`` = a subprocess);
- ``"sync-on-loop"`` (async agent only): the sync client called on the event loop itself, a 2 s timeout;
- ``"reward:<x>"``: ``emit_reward(x)``;
- ``"sleep:<s>"``: wait that many seconds (between calls);
- ``"until:<path>"`` (async agent only): wait until that file exists (up to 60 s), so a test can hold every
  rollout between two calls for as long as it needs, whatever the machine's load;
- ``"agent:<name>"`` / ``"end_agent"``: open / close an autogen-style
  ``invoke_agent`` span; ``"tool"``: an ``execute_tool`` span (both carry GenAI
  attributes and must not become triplets).

``task_input["sampling"]`` (optional) is sent with every SDK call (``temperature``, ``top_p``, ...), as an
agent with its own sampling settings would. The agent returns what the calls answered, so a test can check the
texts too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from opentelemetry import trace

from rollq.models.contract import LLM, NamedResources
from rollq.worker.agent import LitAgent
from rollq.worker.tracer import emit_reward

_tracer = trace.get_tracer("tests.support.capture_agents")


def _messages(rollout_id: str, i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{rollout_id} question {i}"}]


def _sync_call(step: str, llm: LLM, rollout_id: str, i: int, sampling: dict[str, Any] | None = None) -> str:
    url = llm.endpoint.rstrip("/")
    body = {"model": llm.model, "messages": _messages(rollout_id, i)}
    if step == "sync":
        client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
        messages: Any = body["messages"]
        answer = client.chat.completions.create(model=llm.model, messages=messages, **(sampling or {}))
        return answer.choices[0].message.content or ""
    if step == "httpx":
        answer = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
        answer.raise_for_status()
        return str(answer.json()["choices"][0]["message"]["content"])
    if step == "curl":
        done = subprocess.run(
            ["curl", "-sS", "--fail-with-body", "-H", "Content-Type: application/json", "-d", json.dumps(body),
             f"{url}/chat/completions"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"curl exited {done.returncode}: {done.stderr.strip()} {done.stdout.strip()}")
        return str(json.loads(done.stdout)["choices"][0]["message"]["content"])
    raise AssertionError(f"unknown sync step {step!r}")


async def _async_call(step: str, llm: LLM, rollout_id: str, i: int, sampling: dict[str, Any] | None = None) -> str:
    client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    messages: Any = _messages(rollout_id, i)
    given: Any = sampling or {}
    if step == "async":
        answer = await client.chat.completions.create(model=llm.model, messages=messages, **given)
        return answer.choices[0].message.content or ""
    if step == "stream":
        stream = await client.chat.completions.create(
            model=llm.model, messages=messages, stream=True, stream_options={"include_usage": True}, **given
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    if step == "completion":
        completion = await client.completions.create(model=llm.model, prompt=f"{rollout_id} prompt {i}", **given)
        return completion.choices[0].text
    if step == "tools":
        tools: Any = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
        answer = await client.chat.completions.create(model=llm.model, messages=messages, tools=tools)
        return json.dumps([t.model_dump() for t in answer.choices[0].message.tool_calls or []])
    if step == "httpx":
        async with httpx.AsyncClient(timeout=30) as http:
            body = {"model": llm.model, "messages": messages}
            response = await http.post(f"{llm.endpoint.rstrip('/')}/chat/completions", json=body)
            response.raise_for_status()
            return str(response.json()["choices"][0]["message"]["content"])
    if step == "sync-on-loop":  # the mistake: a blocking call on the agents' loop, with a 2 s timeout
        blocking = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0, timeout=2.0)
        reply = blocking.chat.completions.create(model=llm.model, messages=messages)
        return reply.choices[0].message.content or ""
    return await asyncio.to_thread(_sync_call, step, llm, rollout_id, i, sampling)  # the sync SDK, curl: off the loop


class _Spans:
    """Autogen-style agent and tool spans, opened and closed by steps."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()

    def step(self, step: str) -> bool:
        if step.startswith("reward:"):
            emit_reward(float(step.split(":", 1)[1]))
        elif step.startswith("agent:"):
            name = step.split(":", 1)[1]
            attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
            self.stack.enter_context(_tracer.start_as_current_span(f"invoke_agent {name}", attributes=attributes))
        elif step == "end_agent":
            self.stack.close()
        elif step == "tool":
            attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calc"}
            with _tracer.start_as_current_span("execute_tool calc", attributes=attributes):
                pass
        else:
            return False
        return True


async def _until_exists(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout:g} s")
        await asyncio.sleep(0.05)


class AsyncCaptureAgent(LitAgent):
    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        llm = resources["llm"]
        assert isinstance(llm, LLM)
        spans, answers = _Spans(), []
        for i, step in enumerate(task_input["steps"]):
            if step.startswith("sleep:"):
                await asyncio.sleep(float(step.split(":", 1)[1]))
            elif step.startswith("until:"):
                await _until_exists(Path(step.split(":", 1)[1]))
            elif not spans.step(step):
                answers.append(await _async_call(step, llm, rollout_id, i, task_input.get("sampling")))
        spans.stack.close()
        return task_input.get("returns")


class SyncCaptureAgent(LitAgent):
    def training_rollout(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        llm = resources["llm"]
        assert isinstance(llm, LLM)
        spans = _Spans()
        for i, step in enumerate(task_input["steps"]):
            if step.startswith("sleep:"):
                time.sleep(float(step.split(":", 1)[1]))
            elif not spans.step(step):
                _sync_call(step, llm, rollout_id, i, task_input.get("sampling"))
        spans.stack.close()
        return task_input.get("returns")
