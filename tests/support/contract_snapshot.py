"""Describe a contract module as JSON: exported names, model fields, JSON schemas, lifecycle signatures.

The contract tests compare ``rollq.models.contract`` with ``contract_snapshot.json``, which this script made
from the specification (Agent Lightning's ``types.py``, which the project keeps outside this repository; no test
reads it). Regenerate the snapshot when the specification changes:

    python tests/support/contract_snapshot.py PATH/TO/types.py > tests/support/contract_snapshot.json
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, TypeAdapter

CONTRACT_MODELS = (
    "Triplet",
    "Rollout",
    "Task",
    "TaskIfAny",
    "Resource",
    "LLM",
    "PromptTemplate",
    "ResourcesUpdate",
    "GenericResponse",
)
LIFECYCLE_CLASSES = ("ParallelWorkerBase", "Hook")


def _shape(annotation: Any) -> Any:
    """An annotation with classes replaced by their names, so that two modules' types compare equal."""
    origin = typing.get_origin(annotation)
    if origin is None:
        return getattr(annotation, "__name__", repr(annotation))
    return [repr(origin), [_shape(arg) for arg in typing.get_args(annotation)]]


def _strip_docs(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_docs(v) for k, v in schema.items() if k not in ("description", "title")}
    if isinstance(schema, list):
        return [_strip_docs(v) for v in schema]
    return schema


def _fields(model: type[BaseModel]) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "required": info.is_required(),
            "default": repr(info.get_default(call_default_factory=True)),
            "default_factory": info.default_factory is not None,
            "allows_none": info.annotation is None or type(None) in typing.get_args(info.annotation),
            "shape": _shape(info.annotation),
        }
        for name, info in model.model_fields.items()
    ]


def _signatures(cls: type) -> dict[str, list[list[str]]]:
    # Methods the class defines, parameters by name, kind and default; annotations are the implementer's own.
    return {
        name: [[p.name, p.kind.name, repr(p.default)] for p in inspect.signature(fn).parameters.values()]
        for name, fn in vars(cls).items()
        if inspect.isfunction(fn)
    }


def describe(module: ModuleType) -> dict[str, Any]:
    """Everything the contract fixes, in a JSON-comparable form."""
    return {
        "all": list(module.__all__),
        "models": {
            name: {
                "fields": _fields(getattr(module, name)),
                "schema": {
                    mode: _strip_docs(getattr(module, name).model_json_schema(mode=mode))
                    for mode in ("validation", "serialization")
                },
            }
            for name in CONTRACT_MODELS
        },
        "named_resources_schema": _strip_docs(TypeAdapter(module.NamedResources).json_schema()),
        "lifecycle": {
            name: {
                "methods": _signatures(getattr(module, name)),
                "mro": [c.__name__ for c in getattr(module, name).__mro__],
            }
            for name in LIFECYCLE_CLASSES
        },
    }


def load_file(path: Path) -> ModuleType:
    name = "contract_under_description"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves postponed annotations through sys.modules
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(
            "usage: python tests/support/contract_snapshot.py PATH/TO/types.py > tests/support/contract_snapshot.json"
        )
    print(json.dumps(describe(load_file(Path(sys.argv[1]))), indent=1, sort_keys=True))
