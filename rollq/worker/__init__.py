"""The worker side of rollq: run with ``rq worker -w rollq.worker.RolloutWorker`` or ``rollq worker``.

Write an agent by subclassing :class:`LitAgent`; add :class:`rollq.models.Hook`
subclasses for callbacks around each rollout.
"""

from .agent import LitAgent
from .config import WorkerSettings
from .rq_worker import RolloutWorker
from .runner import AgentRunner
from .tracer import BaseTracer, OtelTracer, emit_reward, llm_call_span

__all__ = [
    "AgentRunner",
    "BaseTracer",
    "LitAgent",
    "OtelTracer",
    "RolloutWorker",
    "WorkerSettings",
    "emit_reward",
    "llm_call_span",
]
