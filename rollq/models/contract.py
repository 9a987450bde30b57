"""The data contract every producer and worker speaks.

Field names, types, defaults and the ``resource_type`` discriminator are fixed by
the contract; what rollq adds (attempts, statuses, policy) lives in
:mod:`rollq.models.policy` or in ``metadata``, never in these fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Literal, Optional, Protocol, Union

from opentelemetry.sdk.trace import ReadableSpan
from pydantic import BaseModel, Field

__all__ = [
    "Triplet",
    "Rollout",
    "Task",
    "TaskInput",
    "TaskIfAny",
    "RolloutRawResult",
    "Resource",
    "LLM",
    "PromptTemplate",
    "ResourceUnion",
    "NamedResources",
    "ResourcesUpdate",
    "GenericResponse",
    "ParallelWorkerBase",
    "Hook",
]


class Triplet(BaseModel):
    """One turn of a trajectory: what the model saw, what it said, what it earned."""

    prompt: Any
    response: Any
    reward: Optional[float] = None
    metadata: Dict[str, Any] = Field(default_factory=dict)


class Rollout(BaseModel):
    """The outcome of running one task, as the trainer receives it.

    ``final_reward`` is the scalar signal, ``triplets`` the per-turn one, ``trace``
    the OpenTelemetry spans (JSON form) for deeper analysis. rollq records the
    attempt, status, worker and any error in ``metadata``.
    """

    rollout_id: str
    final_reward: Optional[float] = None
    triplets: Optional[List[Triplet]] = None
    trace: Optional[List[Dict[str, Any]]] = Field(
        default=None,
        description="Spans in OpenTelemetry JSON form, i.e. json.loads(readable_span.to_json()) per span.",
    )
    logs: Optional[List[str]] = None
    metadata: Dict[str, Any] = Field(default_factory=dict)


TaskInput = Any
"""Whatever the agent needs to start a rollout; it must be JSON-serialisable."""


class Task(BaseModel):
    """A request for one rollout.

    ``mode`` picks the agent method ("train" -> ``training_rollout``, anything else
    -> ``validation_rollout``); ``resources_id`` pins a resources version (None
    means the latest one when the task runs). The claim fields are maintained by
    the workers.
    """

    rollout_id: str
    input: TaskInput
    mode: Optional[Literal["train", "val", "test"]] = None
    resources_id: Optional[str] = None
    create_time: Optional[float] = None
    last_claim_time: Optional[float] = None
    num_claims: Optional[int] = None
    metadata: Dict[str, Any] = Field(default_factory=dict)


class TaskIfAny(BaseModel):
    """A poll answer: a task, or word that none is available."""

    is_available: bool
    task: Optional[Task] = None


RolloutRawResult = Union[None, float, List[Triplet], List[Dict[str, Any]], List[ReadableSpan], Rollout]
"""What an agent may return; the worker turns each case into a :class:`Rollout`."""


class Resource(BaseModel):
    """Something the trainer tunes and the agent uses; subclasses set ``resource_type``."""

    resource_type: Any


class LLM(Resource):
    """An LLM endpoint: where to call, which model, and with what sampling settings."""

    resource_type: Literal["llm"] = "llm"
    endpoint: str
    model: str
    sampling_parameters: Dict[str, Any] = Field(default_factory=dict)


class PromptTemplate(Resource):
    """A prompt template and the engine that renders it ("jinja", "f-string" or "poml")."""

    resource_type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["jinja", "f-string", "poml"]


ResourceUnion = Annotated[Union[LLM, PromptTemplate], Field(discriminator="resource_type")]
NamedResources = Dict[str, ResourceUnion]
"""Resources by name, e.g. ``{"main_llm": LLM(...), "system_prompt": PromptTemplate(...)}``."""


class ResourcesUpdate(BaseModel):
    """One immutable version of the named resources, and its id."""

    resources_id: str
    resources: NamedResources


class GenericResponse(BaseModel):
    """A status reply with an optional message and payload."""

    status: str = "success"
    message: Optional[str] = None
    data: Optional[Dict[str, Any]] = None


class AgentRunner(Protocol):
    """What a hook may rely on of the runner that calls it (``rollq.worker.AgentRunner`` is one).

    Declared here, beside the hooks that receive it, so that the contract names no worker module.
    """

    @property
    def worker_name(self) -> str: ...


class BaseTracer(Protocol):
    """What a hook may rely on of the tracer that captures the rollout (``rollq.worker.BaseTracer`` is one)."""

    def start_rollout(self, rollout_id: str, attempt: int) -> Any: ...


class ParallelWorkerBase:
    """An object with a lifecycle across a main process and its worker processes.

    ``init`` runs once in the main process, ``init_worker(i)`` once in each worker
    process before its first task, ``run`` does the work, ``teardown_worker(i)``
    runs as each worker stops and ``teardown`` last, in the main process.
    """

    def __init__(self) -> None:
        self.worker_id: Optional[int] = None

    def init(self, *args: Any, **kwargs: Any) -> None:
        pass

    def init_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        self.worker_id = worker_id

    def run(self, *args: Any, **kwargs: Any) -> Any:
        pass

    def teardown_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        pass

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        pass


class Hook(ParallelWorkerBase):
    """Callbacks around each rollout; override the ones you need."""

    def on_rollout_start(self, task: Task, runner: AgentRunner, tracer: BaseTracer) -> None:
        """Called just before the agent starts on ``task``."""

    def on_rollout_end(self, task: Task, rollout: Rollout, runner: AgentRunner, tracer: BaseTracer) -> None:
        """Called after the agent finished ``task`` and before ``rollout`` is published."""
