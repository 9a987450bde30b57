"""Code that imports the real ``agentlightning`` 0.1.2; only processes in the test's AL venv load it.

- ``CalcAgent`` / ``AsyncCalcAgent``: AL LitAgent subclasses as an AL user writes them, run
  unchanged by ``rq worker -w rollq.worker.RolloutWorker`` (``ROLLQ_AGENT=tests.support.al_real:CalcAgent``);
- ``python tests/support/al_real.py ENDPOINT MARKER_DIR``: an AL 0.1 client process, AL's own
  ``Trainer(...).fit(agent, client)`` pulling from ``rollq serve-al``;
- ``CalcXAgent``: AL's calc_x example as 0.1.2 ships it, minus autogen and the MCP calculator (one chat call
  with the ``openai`` SDK to the ``main_llm`` resource): the answer between ``###`` is scored by an
  ``@reward`` function, and the agent returns nothing, so the reward reaches the rollout only through the
  span ``@reward`` writes;
- ``python tests/support/al_real.py own LLM_URL TASKS_JSON OUT_JSON``: the same agent run by AL 0.1.2 itself (its
  ``AgentLightningServer`` in a child process, ``Trainer`` and default ``AgentOpsTracer`` with its local
  AgentOps server), the rollouts written to OUT_JSON for comparison;
- ``ApoAgent``: AL's APO example client, which builds its OpenAI client from ``OPENAI_API_BASE``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentlightning import LitAgent, Rollout, Triplet, reward
from agentlightning.tracer.base import BaseTracer


class CalcAgent(LitAgent):
    """Sync AL agent: returns AL Triplets; checks it was handed AL-shaped resources and its worker."""

    def __init__(self) -> None:
        super().__init__(trained_agents="calc")

    def training_rollout(self, task: Any, rollout_id: str, resources: Any) -> Any:
        llm = resources["main_llm"]
        assert self.trainer is not None and self.runner is not None  # set through AL's set_trainer/set_runner
        answer = task["a"] + task["b"]
        return [
            Triplet(
                prompt={"text": f"{task['a']}+{task['b']}"},
                response={"text": str(answer)},
                reward=1.0,
                metadata={"model": llm.model, "trained_agents": self.trained_agents},
            )
        ]

    def validation_rollout(self, task: Any, rollout_id: str, resources: Any) -> Any:
        return Rollout(rollout_id=rollout_id, final_reward=0.5, metadata={"validated": True})


class AsyncCalcAgent(LitAgent):
    async def training_rollout_async(self, task: Any, rollout_id: str, resources: Any) -> Any:
        await asyncio.sleep(0.01)
        return float(task["a"] + task["b"] == 5)


class NoTracer(BaseTracer):
    """AL's tracer interface with nothing behind it: the test needs no AgentOps."""

    @contextmanager
    def trace_context(self, name: str | None = None) -> Any:
        yield None

    def get_last_trace(self) -> list[Any]:
        return []


class ClientAgent(LitAgent):
    """The agent AL clients run: the first attempt of a task asking for it hangs, after saying where."""

    def __init__(self, marker_dir: Path) -> None:
        super().__init__()
        self.marker_dir = marker_dir

    def training_rollout(self, task: Any, rollout_id: str, resources: Any) -> Any:
        if task.get("hang_first") and rollout_id.rpartition("#")[0].endswith("#1"):
            (self.marker_dir / f"hung-{os.getpid()}").write_text(rollout_id)
            time.sleep(120)
        return float(task["a"] + task["b"]) + (0.5 if resources["main_llm"].model == "m-al" else 0.0)


OUTPUT_FORMAT = (
    "Output the answer when you are ready. The answer should be surrounded by three sharps (`###`), "
    "in the form of ### ANSWER: <answer> ###."
)


@reward
async def calc_reward(prediction: str, ground_truth: str) -> float:
    """calc_x's ``eval``: 1.0 when the numbers agree."""
    try:
        return float(abs(float(prediction) - float(ground_truth)) < 1e-2)
    except ValueError:
        return float(prediction.strip() == ground_truth.strip())


class CalcXAgent(LitAgent):
    async def training_rollout_async(self, task: Any, rollout_id: str, resources: Any) -> Any:
        from openai import AsyncOpenAI

        llm = resources["main_llm"]
        client = AsyncOpenAI(base_url=llm.endpoint, api_key=os.environ.get("OPENAI_API_KEY", "token-abc123"))
        completion = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["question"] + " " + OUTPUT_FORMAT}],
            temperature=llm.sampling_parameters.get("temperature", 0.7),
        )
        content = completion.choices[0].message.content or ""
        found = re.search(r"###\s*ANSWER:\s*(.+?)(\s*###|$)", content)
        answer = found.group(1) if found else content
        await calc_reward(answer, str(task["result"]))  # the reward is tracked by the decorator

    async def validation_rollout_async(self, task: Any, rollout_id: str, resources: Any) -> Any:
        return await self.training_rollout_async(task, rollout_id, resources)


class ApoAgent(LitAgent):
    """AL 0.1.2's examples/apo/apo_client.py, with a reward that says which prompt it ran with."""

    def training_rollout(self, task: Any, rollout_id: str, resources: Any) -> Any:
        from openai import OpenAI

        openai = OpenAI(api_key=os.environ["OPENAI_API_KEY"], base_url=os.environ["OPENAI_API_BASE"])
        result = openai.chat.completions.create(
            model="gpt-4.1-mini",
            messages=[
                {"role": "system", "content": resources["system_prompt"].template},
                {"role": "user", "content": task["prompt"]},
            ],
        )
        return float(len(result.choices[0].message.content or ""))


def own_server(port: int, llm_url: str, tasks_path: Path, out_path: Path) -> None:
    """AL 0.1.2's server with the tasks queued; writes the rollouts to ``out_path`` once all are in."""
    from agentlightning.server import AgentLightningServer
    from agentlightning.types import LLM

    async def serve() -> None:
        server = AgentLightningServer(host="127.0.0.1", port=port)
        await server.start()
        await server.update_resources({"main_llm": LLM(endpoint=llm_url, model="fake-model")})
        ids = [await server.queue_task(sample=task, mode="train") for task in json.loads(tasks_path.read_text())]
        (out_path.parent / "al-server-ready").write_text("ready")
        rollouts = [await server.poll_completed_rollout(rid, timeout=120) for rid in ids]
        out_path.write_text(json.dumps([r.model_dump() if r is not None else None for r in rollouts]))
        await server.stop()

    asyncio.run(serve())


def own_run(llm_url: str, tasks_path: Path, out_path: Path) -> None:
    """AL 0.1.2 running CalcXAgent on its own: its server (a process of its own), its Trainer, its AgentOps tracer.

    The server runs in another process because the Trainer's AgentOps tracer forks its local AgentOps server:
    a fork from a process with a server thread running could deadlock on a lock that thread held.
    """
    import subprocess

    from agentlightning import Trainer

    port = int(os.environ.get("AL_OWN_PORT", "9997"))
    marker = out_path.parent / "al-server-ready"
    server = subprocess.Popen(
        [sys.executable, __file__, "own-server", str(port), llm_url, str(tasks_path), str(out_path)]
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("AL's server did not start")
        time.sleep(0.2)
    tasks = json.loads(tasks_path.read_text())
    Trainer(n_workers=1, max_tasks=len(tasks)).fit(CalcXAgent(), f"http://127.0.0.1:{port}/")
    if server.wait(timeout=180) != 0:
        raise RuntimeError(f"AL's server exited with {server.returncode}")


def main() -> None:
    if sys.argv[1] == "own":
        own_run(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
        return
    if sys.argv[1] == "own-server":
        own_server(int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5]))
        return
    from agentlightning import Trainer
    from agentlightning.client import AgentLightningClient

    endpoint, marker_dir = sys.argv[1], Path(sys.argv[2])
    client = AgentLightningClient(endpoint, poll_interval=0.2, timeout=10)
    Trainer(n_workers=1, tracer=NoTracer()).fit(ClientAgent(marker_dir), client)


if __name__ == "__main__":
    main()
