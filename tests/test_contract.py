"""The data contract: models round-trip through JSON, reject bad input by field, and match the seed exactly."""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

import rollq.models.contract as contract
from rollq.models.contract import (
    LLM,
    GenericResponse,
    NamedResources,
    PromptTemplate,
    ResourcesUpdate,
    Rollout,
    Task,
    TaskIfAny,
    Triplet,
)

# The spec sits beside the checkout, for developers and CI alike.
SEED_PATH = Path(
    os.environ.get("ROLLQ_SEED_TYPES", Path(__file__).resolve().parents[2] / "shared" / "seed" / "types.py")
)

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

_LLM = LLM(endpoint="http://llm:8000/v1", model="m-7b", sampling_parameters={"temperature": 0.7, "top_p": 0.9})
_PROMPT = PromptTemplate(template="Solve {question}", engine="f-string")

EXAMPLES: list[BaseModel] = [
    Triplet(
        prompt={"messages": [{"role": "user", "content": "hi"}]}, response="hello", reward=0.5, metadata={"turn": 1}
    ),
    Triplet(prompt="p", response=None),
    Rollout(
        rollout_id="r-1",
        final_reward=1.0,
        triplets=[Triplet(prompt="p", response="r", reward=1.0)],
        trace=[{"name": "span", "attributes": {"k": 1}}],
        logs=["line"],
        metadata={"status": "succeeded", "attempt": 1},
    ),
    Rollout(rollout_id="r-2"),
    Task(
        rollout_id="r-1",
        input={"question": "2+2", "nested": [1, 2.5, None]},
        mode="val",
        resources_id="v3",
        create_time=1.5,
        last_claim_time=2.5,
        num_claims=1,
        metadata={"source": "test"},
    ),
    Task(rollout_id="r-2", input="plain"),
    TaskIfAny(is_available=True, task=Task(rollout_id="r-3", input=[1, 2], mode="train")),
    TaskIfAny(is_available=False),
    _LLM,
    _PROMPT,
    ResourcesUpdate(resources_id="v1", resources={"main_llm": _LLM, "system_prompt": _PROMPT}),
    GenericResponse(),
    GenericResponse(status="error", message="bad", data={"code": 3}),
]


@pytest.mark.parametrize("model", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_contract_model_survives_a_json_round_trip(model: BaseModel) -> None:
    again = type(model).model_validate_json(model.model_dump_json())
    assert again == model
    assert again.model_dump() == model.model_dump()


def test_named_resources_from_plain_json_become_their_own_classes() -> None:
    raw = (
        '{"main_llm": {"resource_type": "llm", "endpoint": "http://e", "model": "m", "sampling_parameters": {"t": 1}},'
        ' "system_prompt": {"resource_type": "prompt_template", "template": "T {x}", "engine": "jinja"}}'
    )
    named = TypeAdapter(NamedResources).validate_json(raw)
    assert isinstance(named["main_llm"], LLM) and named["main_llm"].sampling_parameters == {"t": 1}
    assert isinstance(named["system_prompt"], PromptTemplate) and named["system_prompt"].engine == "jinja"

    update = ResourcesUpdate.model_validate_json('{"resources_id": "v9", "resources": ' + raw + "}")
    assert type(update.resources["main_llm"]) is LLM
    assert type(update.resources["system_prompt"]) is PromptTemplate


def _error_locs(exc: pytest.ExceptionInfo[ValidationError]) -> list[tuple[Any, ...]]:
    return [tuple(e["loc"]) for e in exc.value.errors()]


def test_unknown_resource_type_is_rejected_naming_the_resource() -> None:
    with pytest.raises(ValidationError) as exc:
        TypeAdapter(NamedResources).validate_python({"store": {"resource_type": "vector_db", "endpoint": "x"}})
    assert _error_locs(exc) == [("store",)]
    assert exc.value.errors()[0]["type"] == "union_tag_invalid"

    with pytest.raises(ValidationError) as exc:
        ResourcesUpdate.model_validate({"resources_id": "v1", "resources": {"store": {"resource_type": "vector_db"}}})
    assert _error_locs(exc) == [("resources", "store")]


def test_mode_outside_train_val_test_is_rejected_naming_mode() -> None:
    with pytest.raises(ValidationError) as exc:
        Task(rollout_id="r", input=1, mode="prod")  # type: ignore[arg-type]
    assert _error_locs(exc) == [("mode",)]


@pytest.mark.parametrize("model", [Rollout, Task])
def test_missing_rollout_id_is_rejected_naming_rollout_id(model: type[BaseModel]) -> None:
    with pytest.raises(ValidationError) as exc:
        model.model_validate({"input": 1})
    assert ("rollout_id",) in _error_locs(exc)
    assert all(e["type"] == "missing" for e in exc.value.errors())


@pytest.fixture(scope="module")
def seed() -> ModuleType:
    if not SEED_PATH.exists():
        message = f"the seed contract {SEED_PATH} is not here (set ROLLQ_SEED_TYPES to its path)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    name = "rollq_seed_types"
    spec = importlib.util.spec_from_file_location(name, SEED_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # pydantic resolves the seed's postponed annotations through sys.modules.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _shape(annotation: Any) -> Any:
    """An annotation with classes replaced by their names, so seed and rollq types compare equal."""
    origin = typing.get_origin(annotation)
    if origin is None:
        return getattr(annotation, "__name__", repr(annotation))
    return (repr(origin), tuple(_shape(arg) for arg in typing.get_args(annotation)))


def _allows_none(annotation: Any) -> bool:
    return annotation is None or type(None) in typing.get_args(annotation)


def test_contract_exports_the_seed_names(seed: ModuleType) -> None:
    assert contract.__all__ == seed.__all__


@pytest.mark.parametrize("name", CONTRACT_MODELS)
def test_model_fields_match_the_seed(seed: ModuleType, name: str) -> None:
    ours: type[BaseModel] = getattr(contract, name)
    theirs: type[BaseModel] = getattr(seed, name)
    assert list(ours.model_fields) == list(theirs.model_fields)
    for field_name, expected in theirs.model_fields.items():
        actual = ours.model_fields[field_name]
        where = f"{name}.{field_name}"
        assert actual.is_required() == expected.is_required(), where
        assert actual.get_default(call_default_factory=True) == expected.get_default(call_default_factory=True), where
        assert (actual.default_factory is None) == (expected.default_factory is None), where
        assert _allows_none(actual.annotation) == _allows_none(expected.annotation), where
        assert _shape(actual.annotation) == _shape(expected.annotation), where


def _strip_docs(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_docs(v) for k, v in schema.items() if k not in ("description", "title")}
    if isinstance(schema, list):
        return [_strip_docs(v) for v in schema]
    return schema


@pytest.mark.parametrize("name", CONTRACT_MODELS)
def test_json_schema_matches_the_seed_apart_from_docs(seed: ModuleType, name: str) -> None:
    ours: type[BaseModel] = getattr(contract, name)
    theirs: type[BaseModel] = getattr(seed, name)
    for mode in ("validation", "serialization"):
        assert _strip_docs(ours.model_json_schema(mode=mode)) == _strip_docs(theirs.model_json_schema(mode=mode))


def test_named_resources_schema_matches_the_seed(seed: ModuleType) -> None:
    assert _strip_docs(TypeAdapter(NamedResources).json_schema()) == _strip_docs(
        TypeAdapter(seed.NamedResources).json_schema()
    )


def _signature(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", ["ParallelWorkerBase", "Hook"])
def test_lifecycle_classes_keep_the_seed_methods_and_signatures(seed: ModuleType, name: str) -> None:
    ours, theirs = getattr(contract, name), getattr(seed, name)
    methods = [m for m, fn in vars(theirs).items() if inspect.isfunction(fn)]
    assert methods, f"the seed's {name} defines no methods"
    for method in methods:
        assert _signature(getattr(ours, method)) == _signature(getattr(theirs, method)), f"{name}.{method}"
    assert [c.__name__ for c in ours.__mro__] == [c.__name__ for c in theirs.__mro__]


def test_parallel_worker_base_starts_without_a_worker_id_and_init_worker_sets_it() -> None:
    hook = contract.Hook()
    assert hook.worker_id is None
    hook.init_worker(7)
    assert hook.worker_id == 7
