"""Test-only fault injection: make a worker die at a named step of starting a job.

``ROLLQ_CRASH_AT=<step>`` makes the worker process exit at once, as a SIGKILL
would (``os._exit(CRASH_EXIT_CODE)``: no clean-up, no hand-back), when it reaches
that step. The steps of the start path, in order:

- ``dequeued``: RQ moved the job into its intermediate list; nothing else happened;
- ``claimed``: the task is claimed (``running``, with a heartbeat deadline);
  RQ's start bookkeeping has not run. The worker sends both in one pipeline,
  claims first, so this is the state a pipeline cut short after its claims
  leaves; to reach it, the worker sends the claims alone first;
- ``rq-started``: the claims and RQ's start bookkeeping (started registry,
  intermediate list left) both ran;
- ``agent-started``: the agent was handed the task.

tests/worker/test_none_lost.py kills a worker at each to prove no task is lost. The
variable is read once, at import; leave it unset in production.
"""

from __future__ import annotations

import os

CRASH_EXIT_CODE = 86
STEPS = ("dequeued", "claimed", "rq-started", "agent-started")

_CRASH_AT = os.environ.get("ROLLQ_CRASH_AT", "")


def armed(step: str) -> bool:
    """Whether ``ROLLQ_CRASH_AT`` names ``step``."""
    return _CRASH_AT == step


def crash_point(step: str) -> None:
    """Exit the process at once if ``ROLLQ_CRASH_AT`` names ``step``."""
    if _CRASH_AT == step:
        os._exit(CRASH_EXIT_CODE)
