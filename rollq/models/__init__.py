"""The rollq data contract: the exchange types, rollq's policy types and its errors.

``from rollq.models import Task, Rollout, LLM, ...`` gives the contract; rollq's own
additions (policy, errors) are importable from here too. This layer imports no other part of rollq.
"""

from .contract import (
    LLM,
    GenericResponse,
    Hook,
    NamedResources,
    ParallelWorkerBase,
    PromptTemplate,
    Resource,
    ResourcesUpdate,
    ResourceUnion,
    Rollout,
    RolloutRawResult,
    Task,
    TaskIfAny,
    TaskInput,
    Triplet,
)
from .errors import (
    InvalidTaskError,
    PayloadTooLargeError,
    RolloutTimeoutError,
    RollqError,
    UnknownResourcesError,
    UnknownTaskError,
)
from .policy import RolloutPolicy, RolloutStatus, TaskState

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
    "RolloutPolicy",
    "RolloutStatus",
    "TaskState",
    "RollqError",
    "InvalidTaskError",
    "PayloadTooLargeError",
    "RolloutTimeoutError",
    "UnknownResourcesError",
    "UnknownTaskError",
]
