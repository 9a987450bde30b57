"""Accepting the contract's objects by shape, not by class.

Agent Lightning (0.1, 0.2, 0.3) ships its own ``Triplet``, ``Rollout``, ``LLM``,
``PromptTemplate`` and ``ResourcesUpdate`` with the same schema as rollq's. pydantic
refuses a model instance of another class, so anything that has a ``model_dump()``
(or is a plain mapping) is validated against rollq's model from its dumped fields.
A wrong shape raises :class:`ContractShapeError` naming the offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from .contract import NamedResources
from .errors import ContractShapeError
from .resource_kinds import ResourcesVersion, StoredResource

M = TypeVar("M", bound=BaseModel)

_RESOURCE: TypeAdapter[Any] = TypeAdapter(StoredResource)


def is_model_like(value: Any) -> bool:
    """True for a pydantic model of any class (rollq's, Agent Lightning's, ...)."""
    return isinstance(value, BaseModel)


def _fields(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _shape_error(what: str, target: str, exc: ValidationError, prefix: str = "") -> ContractShapeError:
    first = exc.errors()[0]
    field = ".".join([prefix] * bool(prefix) + [str(part) for part in first["loc"]]) or "(the value itself)"
    return ContractShapeError(f"{what} is not a {target}: {field}: {first['msg']}", field=field)


def coerce(model: type[M], value: Any, what: str = "value") -> M:
    """``value`` as ``model``: itself if already one, else validated from its ``model_dump()`` or mapping."""
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(_fields(value))
    except ValidationError as exc:
        raise _shape_error(what, model.__name__, exc) from None


def coerce_resource(value: Any, name: str = "") -> Any:
    """One named resource (an ``LLM``, AL 0.3's keyed ``LLM`` or ``ProxyLLM``, or a ``PromptTemplate``, by its
    ``resource_type``, see :mod:`rollq.models.resource_kinds`); errors name ``name.field``."""
    try:
        return _RESOURCE.validate_python(_fields(value))
    except ValidationError as exc:
        raise _shape_error(
            f"resource {name!r}", "resource (LLM, ProxyLLM or PromptTemplate)", exc, prefix=name
        ) from None


def coerce_resources(value: Any) -> NamedResources:
    """Named resources from a mapping of resource-shaped values, or from a ``ResourcesUpdate``-shaped object."""
    if is_model_like(value) and not isinstance(value, Mapping):
        value = coerce(ResourcesVersion, _fields(value), "resources update").resources
    if not isinstance(value, Mapping):
        raise ContractShapeError(
            f"resources must be a mapping of name -> LLM/PromptTemplate, got {type(value).__name__}", field=""
        )
    return {str(name): coerce_resource(item, str(name)) for name, item in value.items()}
