"""Agent Lightning 0.1.2's side of bench/al.py: its server (with the trainer's feeder) and its client processes.

Runs only in the benchmark's own venv (bench/.venv-al, made by bench/al.py), never with rollq installed:
it imports nothing from rollq or bench, so each side pays only for its own code.

    server --port P --depth D --scenario S
        ``AgentLightningServer`` (FastAPI + uvicorn, AL's defaults, including uvicorn's access log),
        plus in the same event loop what AL's trainer does: keep at least D tasks queued
        (``queue_task``) and take finished rollouts (``retrieve_completed_rollouts``) every 0.1 s.
        ``GET /bench/stats`` (added for the benchmark) reports what the trainer received.
    client --endpoint URL --concurrency C --scenario S
        C ``AgentRunner`` loops (AL's own poll -> fetch resources -> run agent -> post loop) in one
        process's event loop, sharing one ``AgentLightningClient``.

Scenarios, the same agents as bench/agents.py: ``noop`` returns a reward at once; ``mock`` runs 3 turns
of an LLM call sleeping U(0.1, 0.5) s, each traced as an OpenTelemetry span plus a reward span, and
returns the trace and 3 triplets; ``big`` returns 8 triplets of 4096 prompt + 512 response token ids.
AL's AgentOps tracer is replaced by a no-op one (the agent builds its own trace, like the rollq agent's
spans), which spares AL the cost of AgentOps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from contextlib import contextmanager
from typing import Any

from agentlightning.client import AgentLightningClient
from agentlightning.litagent import LitAgent
from agentlightning.runner import AgentRunner
from agentlightning.server import AgentLightningServer
from agentlightning.tracer import TripletExporter
from agentlightning.tracer.base import BaseTracer
from agentlightning.types import LLM, Rollout, Triplet
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

TURNS = 3
TURN_SECONDS = (0.1, 0.5)
BIG_TURNS, BIG_PROMPT, BIG_RESPONSE = 8, 4096, 512
_rng = random.Random(7)
PROMPT_IDS = [_rng.randrange(150_000) for _ in range(BIG_PROMPT)]
RESPONSE_IDS = [_rng.randrange(150_000) for _ in range(BIG_RESPONSE)]


class NullTracer(BaseTracer):
    """No AgentOps: the agents below build their own trace."""

    @contextmanager
    def trace_context(self, name: str | None = None) -> Any:
        yield None

    def get_last_trace(self) -> list[Any]:
        return []


class NoopAgent(LitAgent):
    async def training_rollout_async(self, task: Any, rollout_id: str, resources: Any) -> Any:
        return 1.0


class MockLLMAgent(LitAgent):
    async def training_rollout_async(self, task: Any, rollout_id: str, resources: Any) -> Any:
        tracer = trace.get_tracer("bench.al")
        spans, triplets, reward = [], [], 0.0
        for turn in range(TURNS):
            attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "mock-llm"}
            with tracer.start_as_current_span("chat mock-llm", attributes=attributes) as span:
                span.set_attribute("gen_ai.prompt", f"turn {turn} of {task}")
                await asyncio.sleep(random.uniform(*TURN_SECONDS))
                span.set_attribute("gen_ai.completion", f"answer {turn}")
            reward = 0.5 * turn
            with tracer.start_as_current_span("reward", attributes={"reward": reward}) as reward_span:
                pass
            spans += [span, reward_span]
            triplets.append(Triplet(prompt=f"turn {turn} of {task}", response=f"answer {turn}", reward=reward))
        return Rollout(
            rollout_id=rollout_id,
            final_reward=reward,
            triplets=triplets,
            trace=[json.loads(s.to_json()) for s in spans],  # type: ignore[attr-defined]  # as AL's runner does
        )


class BigAgent(LitAgent):
    async def training_rollout_async(self, task: Any, rollout_id: str, resources: Any) -> Any:
        triplets = [
            Triplet(prompt={"token_ids": PROMPT_IDS}, response={"token_ids": RESPONSE_IDS}, reward=float(t))
            for t in range(BIG_TURNS)
        ]
        return Rollout(rollout_id=rollout_id, final_reward=float(BIG_TURNS - 1), triplets=triplets)


AGENTS = {"noop": NoopAgent, "mock": MockLLMAgent, "big": BigAgent}


async def serve(port: int, depth: int, with_resources_id: bool) -> None:
    server = AgentLightningServer(host="127.0.0.1", port=port)
    stats: dict[str, Any] = {"queued_total": 0, "completed": 0, "duplicates": 0, "ready": False}
    seen: set[str] = set()

    @server._app.get("/bench/stats")
    async def bench_stats() -> dict[str, Any]:
        store = server._store
        return {
            **stats,
            "queued": store._task_queue.qsize() if store else 0,
            "processing": len(store._processing_tasks) if store else 0,
        }

    await server.start()
    resources_id = await server.update_resources({"llm": LLM(endpoint="http://127.0.0.1:1/v1", model="mock-llm")})
    # AL's own RL path (its VERL trainer) queues each task with the resources version it was made for; a task
    # without one makes every rollout ask the server for the latest resources (one HTTP request more).
    queued_with = resources_id if with_resources_id else None

    async def feed() -> None:
        n = 0
        while True:
            store = server._store
            if store is not None and store._task_queue.qsize() < depth:
                for _ in range(depth):
                    await server.queue_task({"question": n}, mode="train", resources_id=queued_with)
                    n += 1
                stats["queued_total"] = n
                stats["ready"] = True
            await asyncio.sleep(0.02)

    async def take() -> None:
        while True:
            for rollout in await server.retrieve_completed_rollouts():
                if rollout.rollout_id in seen:
                    stats["duplicates"] += 1
                seen.add(rollout.rollout_id)
                stats["completed"] += 1
            await asyncio.sleep(0.1)

    await asyncio.gather(feed(), take())


async def run_clients(endpoint: str, concurrency: int, scenario: str) -> None:
    trace.set_tracer_provider(TracerProvider())
    client = AgentLightningClient(endpoint=endpoint)
    agent = AGENTS[scenario]()
    runners = [
        AgentRunner(agent=agent, client=client, tracer=NullTracer(), triplet_exporter=TripletExporter(), worker_id=i)
        for i in range(concurrency)
    ]
    await asyncio.gather(*(r.iter_async() for r in runners))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--depth", type=int, required=True)
    s.add_argument("--latest-resources", action="store_true", help="queue tasks without resources_id")
    c = sub.add_parser("client")
    c.add_argument("--endpoint", required=True)
    c.add_argument("--concurrency", type=int, required=True)
    c.add_argument("--scenario", choices=sorted(AGENTS), required=True)
    args = parser.parse_args()
    if args.role == "server":
        asyncio.run(serve(args.port, args.depth, not args.latest_resources))
    else:
        asyncio.run(run_clients(args.endpoint, args.concurrency, args.scenario))


if __name__ == "__main__":
    main()
