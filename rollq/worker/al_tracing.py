"""Pointing Agent Lightning's reward APIs at rollq's tracer, so that every reward lands in its rollout's trace.

Each AL release records a reward its own way, and none of them reaches rollq's spans on its own:

- AL 0.1 ``@reward`` runs the reward function as an AgentOps ``operation``, which records a span only once
  AgentOps' tracing core is initialised (AL's ``AgentOpsTracer`` does that with ``agentops.init()``, a local
  AgentOps server and its own provider). rollq marks the core initialised on rollq's provider instead: AgentOps
  then creates its spans with ``trace.get_tracer()``, in the rollout's context, where rollq routes them.
- AL 0.2 ``emit_reward`` writes a span named ``agentlightning.reward`` through the global provider: it needs
  nothing here (:mod:`rollq.worker.rewards` reads it).
- AL 0.3 ``emit_reward`` asks for the process's active AL tracer (``RuntimeError: No active tracer found``
  without one). rollq makes an AL ``OtelTracer`` on rollq's provider the active tracer for the worker's life;
  its spans start in the caller's context, so one tracer serves every rollout in flight.

Nothing is imported here: the hooks are installed only when the agent's own imports loaded AgentOps or AL.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)


def _agentops_core(provider: TracerProvider) -> str | None:
    core = sys.modules.get("agentops.sdk.core")
    tracing = getattr(core, "tracer", None)
    if tracing is None:  # AgentOps before 0.4.1x kept a singleton instead
        getter = getattr(getattr(core, "TracingCore", None), "get_instance", None)
        tracing = getter() if getter is not None else None
    if tracing is None or not hasattr(tracing, "_initialized"):
        return None
    if tracing.initialized:
        return "AgentOps tracing core already initialised by the agent; left as it is"
    # AgentOps' decorators check `initialized` and then call trace.get_tracer(): the global provider, rollq's.
    tracing.provider = provider
    tracing._initialized = True
    return "AgentOps tracing core (AL 0.1 @reward) records into rollq's tracer"


def _active_al_tracer(provider: TracerProvider) -> str | None:
    base = sys.modules.get("agentlightning.tracer.base")
    otel = sys.modules.get("agentlightning.tracer.otel")
    if base is None or not hasattr(base, "set_active_tracer"):
        return None  # AL 0.1/0.2: emit_reward uses the global provider
    if base.get_active_tracer() is not None:
        return "an Agent Lightning tracer is already active; left as it is"
    if otel is None:
        import importlib

        otel = importlib.import_module("agentlightning.tracer.otel")  # AL itself is loaded: its own module
    tracer: Any = otel.OtelTracer()
    # OtelTracer.init_worker would install a provider of its own; the spans must go to rollq's.
    tracer._tracer_provider = provider
    tracer._initialized = True
    base.set_active_tracer(tracer)
    return "an Agent Lightning OtelTracer on rollq's tracer is active (AL 0.3 emit_reward)"


def connect_agentlightning(provider: TracerProvider) -> list[str]:
    """Install what the loaded AgentOps / Agent Lightning need to write rewards to ``provider``; says what it did."""
    done = []
    for install in (_agentops_core, _active_al_tracer):
        try:
            message = install(provider)
        except Exception as exc:  # an AL/AgentOps release whose internals differ: say so, do not stop the worker
            message = f"could not connect {install.__name__.strip('_')} to rollq's tracer: {exc!r}"
            log.warning("%s; rewards recorded through it will be missing", message)
        if message:
            done.append(message)
            log.info("%s", message)
    return done
