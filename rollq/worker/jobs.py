"""The function every rollq RQ job names.

:class:`rollq.worker.RolloutWorker` recognises rollq jobs by this name and runs them
itself, so the function body only runs when some other RQ worker picks a rollq
job up: it fails with an error that says how to start the right one.
"""

from __future__ import annotations

from typing import Any


def run_rollout(*rollout_ids: str) -> Any:
    """Refuse to run outside :class:`rollq.worker.RolloutWorker` (a job carries one rollout id, a pack several)."""
    raise RuntimeError(
        f"rollq job for {', '.join(map(repr, rollout_ids))} must be run by rollq.worker.RolloutWorker: "
        "rq worker -w rollq.worker.RolloutWorker --url URL NAMESPACE"
    )
