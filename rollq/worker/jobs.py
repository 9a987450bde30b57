"""The function every rollq RQ job names.

:class:`rollq.worker.RolloutWorker` recognises rollq jobs by this name and runs them
itself, so the function body only runs when some other RQ worker picks a rollq
job up: it fails with an error that says how to start the right one.
"""

from __future__ import annotations

from typing import Any


def run_rollout(rollout_id: str) -> Any:
    """Refuse to run outside :class:`rollq.worker.RolloutWorker`."""
    raise RuntimeError(
        f"rollq job for {rollout_id!r} must be run by rollq.worker.RolloutWorker: "
        "rq worker -w rollq.worker.RolloutWorker --url URL NAMESPACE"
    )
