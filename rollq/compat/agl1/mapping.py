"""How an Agent Lightning 1.0 rollout lives in rollq, and how a rollq task reads as one.

An AL rollout becomes one rollq task:

- ``Task.input`` is an envelope ``{"agl1": {"input", "is_train", "config", "metadata"}}`` (the AL
  rollout minus its status), so a worker's adapter finds the ``env_map`` and the agent class it needs
  and a server finds what it must return, from the task alone;
- ``Task.mode`` is ``"train"`` for ``is_train`` and ``"val"`` otherwise (AL's proxy modes);
- the task's policy gets ``timeout_seconds`` from ``config.timeout_seconds``; attempts and retries
  come from the server's policy (AL 1.0 has neither).

Read back, rollq's states map onto AL's four: queued -> ``queuing`` (also after a retry put it
back), running -> ``running``, succeeded -> ``succeeded``, failed and cancelled -> ``failed``.
``status.last_attempt_id`` is rollq's attempt number as a string (``"1"`` for the first claim).
"""

from __future__ import annotations

from typing import Any

from rollq.models.contract import Rollout as RollqRollout
from rollq.models.policy import RolloutPolicy, TaskState
from rollq.store.records import TaskRecord

from .schemas import (
    TERMINAL_STATES,
    Rollout,
    RolloutConfig,
    RolloutCreate,
    RolloutLifecycleStatus,
    RolloutMetadata,
    RolloutState,
)

ENVELOPE_KEY = "agl1"
"""The one key of a task input that carries an AL 1.0 rollout."""
EVENTS_METADATA_KEY = "agl1_events"
"""``Rollout.metadata`` key under which a worker's adapter publishes the attempt's AL events."""

_STATES = {
    TaskState.QUEUED: RolloutState.QUEUING,
    TaskState.RUNNING: RolloutState.RUNNING,
    TaskState.SUCCEEDED: RolloutState.SUCCEEDED,
    TaskState.FAILED: RolloutState.FAILED,
    TaskState.CANCELLED: RolloutState.FAILED,
}

ROLLQ_STATES: dict[RolloutState, tuple[TaskState, ...]] = {
    RolloutState.QUEUING: (TaskState.QUEUED,),
    RolloutState.RUNNING: (TaskState.RUNNING,),
    RolloutState.SUCCEEDED: (TaskState.SUCCEEDED,),
    RolloutState.FAILED: (TaskState.FAILED, TaskState.CANCELLED),
}
"""The rollq states each AL state stands for (for ``GET /api/rollouts?state_in=``)."""


def mode_of(is_train: bool) -> str:
    return "train" if is_train else "val"


def envelope(request: RolloutCreate) -> dict[str, Any]:
    """The task input for ``request``."""
    metadata = request.metadata
    if isinstance(metadata, dict):
        metadata = RolloutMetadata(**metadata)
    return {
        ENVELOPE_KEY: {
            "input": request.input,
            "is_train": request.is_train,
            "config": (request.config or RolloutConfig()).model_dump(mode="json"),
            "metadata": (metadata or RolloutMetadata()).model_dump(mode="json"),
        }
    }


def opened(task_input: Any) -> dict[str, Any] | None:
    """The AL rollout inside a task input, or None when the task was not queued through the AL 1.0 API."""
    if isinstance(task_input, dict) and isinstance(task_input.get(ENVELOPE_KEY), dict):
        return task_input[ENVELOPE_KEY]
    return None


def policy_for(request: RolloutCreate, base: RolloutPolicy) -> RolloutPolicy:
    """``base`` with the rollout's own time limit."""
    timeout = (request.config or RolloutConfig()).timeout_seconds
    return base.model_copy(update={"timeout_seconds": float(timeout)}) if timeout > 0 else base


def error_message(result: RollqRollout | None, state: TaskState) -> str | None:
    """What AL's ``status.error_message`` says for a rollq outcome."""
    if state is TaskState.CANCELLED:
        return "cancelled"
    if state is not TaskState.FAILED or result is None:
        return None
    error = result.metadata.get("error")
    if isinstance(error, dict):
        return f"{error.get('type', 'Error')}: {error.get('message', '')}"
    return "failed"


def view(record: TaskRecord, result: RollqRollout | None = None, overrides: dict[str, str] | None = None) -> Rollout:
    """The AL rollout a task record stands for (``result``: its published rollout, when it has ended)."""
    task = record.task
    inner = opened(task.input)
    if inner is None:  # a task queued another way: shown as it is
        inner = {"input": task.input, "is_train": task.mode == "train", "config": {}, "metadata": {}}
    state = _STATES[record.state]
    created = task.create_time or 0.0
    updated = max(t for t in (created, task.last_claim_time or 0.0, record.ended or 0.0))
    status = RolloutLifecycleStatus(
        state=state,
        last_attempt_id=str(record.attempt) if record.attempt > 0 else None,
        error_message=error_message(result, record.state),
        # One step per claim and one for the end: it grows with every change a client can see.
        version=1 + (task.num_claims or 0) + (1 if state in TERMINAL_STATES else 0),
        created_at=created,
        updated_at=updated,
    )
    if overrides:
        status = status.model_copy(
            update={k: v for k, v in overrides.items() if k in ("error_message", "k8s_job_name")}
        )
    return Rollout(
        rollout_id=task.rollout_id,
        input=inner.get("input"),
        is_train=bool(inner.get("is_train", True)),
        config=RolloutConfig.model_validate(inner.get("config") or {}),
        metadata=RolloutMetadata.model_validate(inner.get("metadata") or {}),
        status=status,
    )


def data_id_of(rollout: Rollout) -> str:
    """AL's ``data_id`` of a terminal item: the input's ``data_id`` or ``instance_id``, else ''."""
    value = rollout.input
    if isinstance(value, dict):
        return str(value.get("data_id") or value.get("instance_id") or "")
    return ""
