"""Plain RQ job functions for the stock ``rq worker`` side of tests/worker/test_rq_state_diff.py.

They do what tests.support.fault_agents:FaultAgent does with the same input (sleep, then fail with the given message or
return a reward), so that the same jobs can run through a stock RQ worker and through RolloutWorker.
"""

from __future__ import annotations

import time
from typing import Any


def rollout(spec: dict[str, Any]) -> dict[str, Any]:
    time.sleep(float(spec.get("sleep", 0)))
    if "raise" in spec:
        raise RuntimeError(spec["raise"])
    return {"status": "succeeded", "reward": 1.0}
