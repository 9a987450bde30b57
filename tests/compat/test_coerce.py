"""Agent Lightning's objects (here: look-alike classes of the same schema) are accepted by shape, everywhere."""

from __future__ import annotations

import pytest

from rollq.models import contract
from rollq.models.coerce import coerce, coerce_resources
from rollq.models.errors import ContractShapeError, UnsupportedResultError
from rollq.producer.producer import Producer
from rollq.worker.normalize import to_rollout
from tests.support.al_shaped import LLM, NotATriplet, PromptTemplate, Rollout, Triplet
from tests.support.fault_agents import assert_exactly_once


def test_a_foreign_triplet_list_becomes_the_rollouts_triplets() -> None:
    rollout = to_rollout("r1", [Triplet(prompt="p", response="r", reward=0.5)], [])
    assert rollout.triplets == [contract.Triplet(prompt="p", response="r", reward=0.5)]
    assert rollout.final_reward == 0.5


def test_a_foreign_rollout_is_taken_with_the_tasks_id() -> None:
    rollout = to_rollout("r1", Rollout(rollout_id="other", final_reward=1.0, logs=["x"]), [])
    assert isinstance(rollout, contract.Rollout)
    assert (rollout.rollout_id, rollout.final_reward, rollout.logs) == ("r1", 1.0, ["x"])


def test_a_list_of_wrongly_shaped_models_names_the_missing_field() -> None:
    with pytest.raises(ContractShapeError, match="item 0 of the list is not a Triplet: prompt: Field required") as info:
        to_rollout("r1", [NotATriplet(question="?")], [])
    assert info.value.field == "prompt"


def test_coerce_names_a_nested_field() -> None:
    with pytest.raises(ContractShapeError, match=r"it is not a Rollout: triplets\.0\.prompt: Field required"):
        coerce(contract.Rollout, {"rollout_id": "r", "triplets": [{"response": "x"}]}, "it")


def test_resources_of_foreign_classes_and_dicts_become_rollq_resources() -> None:
    named = coerce_resources(
        {
            "llm": LLM(endpoint="http://x", model="m"),
            "prompt": PromptTemplate(template="{q}", engine="f-string"),
            "raw": {"resource_type": "llm", "endpoint": "http://y", "model": "n"},
        }
    )
    assert isinstance(named["llm"], contract.LLM) and named["llm"].model == "m"
    assert isinstance(named["prompt"], contract.PromptTemplate)
    assert isinstance(named["raw"], contract.LLM) and named["raw"].endpoint == "http://y"


def test_a_wrong_resource_shape_names_the_resource_and_field() -> None:
    with pytest.raises(ContractShapeError, match="resource 'llm' .*: llm.llm.endpoint: Field required"):
        coerce_resources({"llm": {"resource_type": "llm", "model": "m"}})


def test_a_bool_is_still_refused_not_coerced() -> None:
    with pytest.raises(UnsupportedResultError):
        to_rollout("r1", True, [])


def test_producer_update_resources_takes_foreign_objects_and_a_resources_update() -> None:
    producer = Producer.from_url("memory://coerce", namespace="coerce")
    v1 = producer.update_resources({"llm": LLM(endpoint="http://x", model="m")})
    assert producer.get_resources(v1).resources["llm"] == contract.LLM(endpoint="http://x", model="m")
    update = contract.ResourcesUpdate(
        resources_id="ignored", resources={"p": contract.PromptTemplate(template="t", engine="jinja")}
    )
    v2 = producer.update_resources(update)
    assert v2 != "ignored" and producer.get_resources(v2).resources["p"].template == "t"


@pytest.mark.redis
def test_a_real_worker_publishes_foreign_results_and_uses_foreign_resources(redis_server, namespace, workers) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    producer.update_resources({"llm": LLM(endpoint="http://x", model="m-7")})
    workers(redis_server.url, namespace, env={"ROLLQ_AGENT": "tests.support.al_shaped:ForeignResultAgent"})
    kinds = ["triplets", "rollout", "resources", "wrong"]
    tasks = producer.enqueue_many([{"kind": k, "model": "m-7"} for k in kinds])
    rollouts = dict(zip(kinds, producer.wait([t.rollout_id for t in tasks], timeout=30), strict=True))
    assert rollouts["triplets"].final_reward == 0.25 and rollouts["triplets"].metadata["status"] == "succeeded"
    assert rollouts["rollout"].final_reward == 0.5 and rollouts["rollout"].triplets[0].prompt == "p"
    assert rollouts["resources"].final_reward == 1.0
    error = rollouts["wrong"].metadata["error"]
    assert error["type"] == "ContractShapeError" and "prompt: Field required" in error["message"]
    assert_exactly_once(producer.connection, namespace, [t.rollout_id for t in tasks])


def test_agent_lightning_03_api_key_and_proxy_llm_are_kept_through_the_store(redis_server, namespace) -> None:
    from rollq.models.resource_kinds import KeyedLLM, ProxyLLM

    producer = Producer.from_url(redis_server.url, namespace)
    version = producer.update_resources(
        {
            "keyed": {"resource_type": "llm", "endpoint": "http://x/v1", "model": "m", "api_key": "sk-1"},
            "proxied": {"resource_type": "proxy_llm", "endpoint": "http://y/v1", "model": "n", "api_key": "sk-2"},
            "plain": LLM(endpoint="http://z", model="o"),
        }
    )
    stored = producer.get_resources(version).resources
    assert isinstance(stored["keyed"], KeyedLLM) and stored["keyed"].api_key == "sk-1"
    assert isinstance(stored["proxied"], ProxyLLM) and stored["proxied"].api_key == "sk-2"
    assert stored["proxied"].get_base_url("r-1", "attempt-2") == "http://y/rollout/r-1/attempt/attempt-2/v1"
    assert stored["plain"] == contract.LLM(endpoint="http://z", model="o")  # no key: the contract's own class
