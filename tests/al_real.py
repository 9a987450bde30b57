"""Code that imports the real ``agentlightning`` 0.1.2; only processes in the test's AL venv load it.

- ``CalcAgent`` / ``AsyncCalcAgent``: AL LitAgent subclasses as an AL user writes them, run
  unchanged by ``rq worker -w rollq.worker.RolloutWorker`` (``ROLLQ_AGENT=tests.al_real:CalcAgent``);
- ``python tests/al_real.py ENDPOINT MARKER_DIR``: an AL 0.1 client process, AL's own
  ``Trainer(...).fit(agent, client)`` pulling from ``rollq serve-al``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentlightning import LitAgent, Rollout, Triplet
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


def main() -> None:
    from agentlightning import Trainer
    from agentlightning.client import AgentLightningClient

    endpoint, marker_dir = sys.argv[1], Path(sys.argv[2])
    client = AgentLightningClient(endpoint, poll_interval=0.2, timeout=10)
    Trainer(n_workers=1, tracer=NoTracer()).fit(ClientAgent(marker_dir), client)


if __name__ == "__main__":
    main()
