"""The wire shapes of Agent Lightning 1.0's server API, as its 1.0.2 clients send and read them.

Field names, defaults, enums and the allowed state moves follow ``agentlightning.schemas`` and
``agentlightning.server.routes`` of AL 1.0.2 (read from the released package); the text is ours.
rollq never imports ``agentlightning``: these models are what its clients validate against.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_ATTEMPT_ID = "0"
"""The attempt id AL's own controller always uses; rollq's attempts are numbered from 1."""


class RolloutState(StrEnum):
    """AL 1.0's four rollout states; the last two are terminal."""

    QUEUING = "queuing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


TERMINAL_STATES = frozenset({RolloutState.SUCCEEDED, RolloutState.FAILED})

VALID_TRANSITIONS: dict[RolloutState, frozenset[RolloutState]] = {
    RolloutState.QUEUING: frozenset({RolloutState.RUNNING, RolloutState.FAILED}),
    RolloutState.RUNNING: frozenset({RolloutState.SUCCEEDED, RolloutState.FAILED}),
    RolloutState.SUCCEEDED: frozenset(),
    RolloutState.FAILED: frozenset(),
}
"""The moves AL 1.0's store allows a client to PATCH (anything else is 409)."""


class Event(BaseModel):
    """One entry of an attempt's trajectory: ``model_request``, ``reward`` or any user-defined type."""

    event_type: str
    rollout_id: str
    attempt_id: str
    timestamp: float
    data: dict[str, Any]


class EventCreate(BaseModel):
    """The body of ``POST .../attempt/{a}/events``."""

    event_type: str
    data: dict[str, Any] = Field(default_factory=dict)


class Model(BaseModel):
    """A registered inference endpoint (an OpenAI base URL such as ``http://vllm:8000/v1``)."""

    model: str
    endpoint: str
    version: int = 0


class RolloutLocalConfig(BaseModel):
    agent_class: str | None = None
    env_map: dict[str, str] = Field(default_factory=dict)


class RolloutK8sConfig(BaseModel):
    job_template: str | None = None


class RolloutConfig(BaseModel):
    """How the rollout is to be run: its time limit and the agent that runs it."""

    timeout_seconds: int = 3600
    local: RolloutLocalConfig | None = None
    k8s: RolloutK8sConfig | None = None


class RolloutMetadata(BaseModel):
    """The trainer's batch context; any other keys are kept."""

    model_config = ConfigDict(extra="allow")

    batch_idx: int | None = None
    sample_idx_in_batch: int | None = None


class RolloutCreate(BaseModel):
    """One item of ``POST /api/rollouts``; a given ``rollout_id`` makes the creation idempotent."""

    input: Any
    is_train: bool = True
    config: RolloutConfig | None = None
    metadata: RolloutMetadata | dict[str, Any] | None = None
    rollout_id: str | None = None


class RolloutLifecycleStatus(BaseModel):
    state: RolloutState = RolloutState.QUEUING
    k8s_job_name: str | None = None
    last_attempt_id: str | None = None
    error_message: str | None = None
    version: int = 1
    created_at: float
    updated_at: float


class RolloutStatusPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: RolloutState | None = None
    k8s_job_name: str | None = None
    last_attempt_id: str | None = None
    error_message: str | None = None


class RolloutPatch(BaseModel):
    """The body of ``PATCH /api/rollouts/{id}``: only the nested status."""

    status: RolloutStatusPatch | None = None


class Rollout(BaseModel):
    """A rollout as AL 1.0 clients read it."""

    rollout_id: str
    input: Any
    is_train: bool = True
    config: RolloutConfig
    metadata: RolloutMetadata = Field(default_factory=RolloutMetadata)
    status: RolloutLifecycleStatus


class RolloutDetail(BaseModel):
    """``GET /api/rollouts/{id}``: the rollout and the ids of its attempts that have events."""

    rollout: Rollout
    attempts: list[str]


class TerminalRolloutItem(BaseModel):
    rollout_id: str
    state: RolloutState
    data_id: str
    is_train: bool


class TerminalRolloutsPage(BaseModel):
    """``GET /api/rollouts/terminal``: rollouts in the order they ended, from index ``after``."""

    items: list[TerminalRolloutItem]
    next_after: int
    total_terminal: int


class PauseRequest(BaseModel):
    retry_after_seconds: int = 5
    reason: str | None = None


class PauseStateResponse(BaseModel):
    paused: bool
    retry_after_seconds: int
    reason: str | None
    inflight: int
