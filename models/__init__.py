"""The rollq data contract and how it is laid out in Redis.

``from models import Task, Rollout, LLM, ...`` gives the contract; rollq's own
additions (policy, errors, keys) are importable from here too.
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
from .keys import DEFAULT_NAMESPACE, Keys
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
    "Keys",
    "DEFAULT_NAMESPACE",
    "RollqError",
    "InvalidTaskError",
    "PayloadTooLargeError",
    "RolloutTimeoutError",
    "UnknownResourcesError",
    "UnknownTaskError",
]
