"""Plain RQ job functions, the twins of the agents in :mod:`bench.agents`.

This module imports no rollq code: RQ's fork-per-job ``Worker`` imports the job's
module in every work horse, and the job should cost what a plain RQ job costs.
"""

from __future__ import annotations

import random
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

TURNS = 3
TURN_SECONDS = (0.1, 0.5)
MODEL = "mock-llm"


def noop() -> float:
    """A job doing nothing."""
    return 1.0


def mock_llm() -> float:
    """Three turns of a 0.1-0.5 s LLM call, each traced as an LLM-call span plus a reward span, like MockLLMAgent."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        # Without an SDK provider spans are free no-ops; this job pays for real ones like the rollq agent does.
        trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("bench.rq_jobs")
    reward = 0.0
    for turn in range(TURNS):
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "rollq",
            "gen_ai.request.model": MODEL,
            "gen_ai.prompt": f"turn {turn}",
        }
        with tracer.start_as_current_span(f"chat {MODEL}", attributes=attributes) as span:
            time.sleep(random.uniform(*TURN_SECONDS))
            span.set_attribute("gen_ai.completion", f"answer {turn}")
        reward = 0.5 * turn
        with tracer.start_as_current_span("reward", attributes={"rollq.reward": reward}):
            pass
    return reward


def hold(seconds: float) -> float:
    """Keep the worker busy for ``seconds``: each process of a starting fleet takes one job and no more."""
    time.sleep(seconds)
    return 1.0
