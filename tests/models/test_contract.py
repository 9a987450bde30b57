"""The data contract: models round-trip through JSON, reject bad input by field, and match the specification
(the committed snapshot of Agent Lightning's types) exactly."""

from __future__ import annotations

import json
from pathlib import Path
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
from tests.support import contract_snapshot
from tests.support.contract_snapshot import CONTRACT_MODELS, LIFECYCLE_CLASSES, describe

SNAPSHOT = Path(__file__).resolve().parents[1] / "support" / "contract_snapshot.json"

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
def snapshot() -> dict[str, Any]:
    """The specification as JSON, committed beside this file (see contract_snapshot.py for how it is made)."""
    return json.loads(SNAPSHOT.read_text())


@pytest.fixture(scope="module")
def ours() -> dict[str, Any]:
    # A JSON round trip, so that tuples and lists compare as the committed file has them.
    return json.loads(json.dumps(describe(contract)))


def test_contract_exports_the_specified_names(ours: dict[str, Any], snapshot: dict[str, Any]) -> None:
    assert ours["all"] == snapshot["all"]


@pytest.mark.parametrize("name", CONTRACT_MODELS)
def test_model_fields_match_the_specification(ours: dict[str, Any], snapshot: dict[str, Any], name: str) -> None:
    assert ours["models"][name]["fields"] == snapshot["models"][name]["fields"]


@pytest.mark.parametrize("name", CONTRACT_MODELS)
def test_json_schema_matches_the_specification_apart_from_docs(
    ours: dict[str, Any], snapshot: dict[str, Any], name: str
) -> None:
    assert ours["models"][name]["schema"] == snapshot["models"][name]["schema"]


def test_named_resources_schema_matches_the_specification(ours: dict[str, Any], snapshot: dict[str, Any]) -> None:
    assert ours["named_resources_schema"] == snapshot["named_resources_schema"]


@pytest.mark.parametrize("name", LIFECYCLE_CLASSES)
def test_lifecycle_classes_keep_the_specified_methods_and_signatures(
    ours: dict[str, Any], snapshot: dict[str, Any], name: str
) -> None:
    assert snapshot["lifecycle"][name]["methods"], f"the snapshot's {name} defines no methods"
    for method, signature in snapshot["lifecycle"][name]["methods"].items():
        assert ours["lifecycle"][name]["methods"].get(method) == signature, f"{name}.{method}"
    assert ours["lifecycle"][name]["mro"] == snapshot["lifecycle"][name]["mro"]


def test_a_changed_field_default_shows_in_the_description() -> None:
    # The comparison above is only as good as describe(): a drifted default must change it.
    class Drifted(Triplet):
        reward: float | None = 0.0

    before = json.dumps(describe(contract)["models"]["Triplet"]["fields"])
    assert before != json.dumps(contract_snapshot._fields(Drifted))


def test_parallel_worker_base_starts_without_a_worker_id_and_init_worker_sets_it() -> None:
    hook = contract.Hook()
    assert hook.worker_id is None
    hook.init_worker(7)
    assert hook.worker_id == 7
