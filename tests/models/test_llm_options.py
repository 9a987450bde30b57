"""rollq's LLM options live in ``sampling_parameters["rollq"]``: readers of the seed schema still parse them,
bad options are refused by name, and routing over several upstreams is sticky and spread."""

from __future__ import annotations

import collections
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from rollq.models.contract import LLM, PromptTemplate, ResourcesUpdate
from rollq.models.llm_options import (
    InvalidLLMOptionsError,
    LLMOptions,
    agent_view,
    check_resources,
    for_agent,
    options_of,
    with_options,
)
from rollq.worker.capture.routing import UpstreamHealth, rendezvous_order


# The seed contract's classes, verbatim in their fields (the specification itself lives outside the repository):
# what a reader that knows nothing of rollq's options parses a resource with.
class SeedResource(BaseModel):
    resource_type: Any


class SeedLLM(SeedResource):
    resource_type: Literal["llm"] = "llm"
    endpoint: str
    model: str
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)


def _extended() -> LLM:
    return with_options(
        LLM(endpoint="http://a:8000/v1", model="m", sampling_parameters={"temperature": 0.7}),
        endpoints=["http://a:8000/v1", "http://b:8000/v1/"],
        modes={"train": {"temperature": 1.0}, "val": {"temperature": 0.0}},
        retries=5,
    )


def test_a_reader_of_the_seed_schema_parses_an_extended_llm_and_gets_a_working_endpoint() -> None:
    data = _extended().model_dump_json()
    seed = SeedLLM.model_validate_json(data)
    assert seed.endpoint == "http://a:8000/v1" and seed.model == "m"
    assert seed.sampling_parameters["temperature"] == 0.7
    # And back: what the seed reader writes is the same JSON, options included.
    assert SeedLLM.model_validate_json(seed.model_dump_json()).model_dump() == seed.model_dump()
    assert LLM.model_validate_json(seed.model_dump_json()) == _extended()


def test_a_plain_llm_serialises_byte_for_byte_as_the_seed_one() -> None:
    plain = LLM(endpoint="http://a:8000/v1", model="m", sampling_parameters={"top_p": 0.9})
    assert plain.model_dump_json() == SeedLLM(**plain.model_dump()).model_dump_json()
    assert options_of(plain) == LLMOptions()


def test_options_round_trip_through_a_resources_version() -> None:
    update = ResourcesUpdate(resources_id="v1", resources={"llm": _extended()})
    parsed = ResourcesUpdate.model_validate_json(update.model_dump_json())
    llm = parsed.resources["llm"]
    assert isinstance(llm, LLM)
    options = options_of(llm)
    assert options.upstreams(llm) == ("http://a:8000/v1", "http://b:8000/v1")
    assert options.sampling_for("train") == {"temperature": 1.0} and options.sampling_for(None) == {}
    assert options.retries == 5


def test_the_agent_sees_no_reserved_entry() -> None:
    llm = _extended()
    seen = for_agent(llm, endpoint="http://proxy/v1")
    assert seen.sampling_parameters == {"temperature": 0.7} and seen.endpoint == "http://proxy/v1"
    assert "rollq" in llm.sampling_parameters  # the shared copy is untouched
    prompt = PromptTemplate(template="t", engine="f-string")
    viewed = agent_view({"llm": llm, "p": prompt})
    assert viewed["p"] is prompt and "rollq" not in viewed["llm"].sampling_parameters  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"retries": -1}, "retries"),
        ({"endpoints": ["ftp://x/v1"]}, "not an http(s) URL"),
        ({"endpoints": ["http://a:8000/v1", "http://b:8000"]}, "end in /v1"),
        ({"endpoints": ["http://z:8000/v1"]}, "is not one of"),
        ({"typo": 1}, "typo"),
        ("not a dict", "(options)"),
    ],
)
def test_invalid_options_are_refused_naming_the_problem(options: Any, named: str) -> None:
    llm = LLM(endpoint="http://a:8000/v1", model="m", sampling_parameters={"rollq": options})
    with pytest.raises(InvalidLLMOptionsError, match=named.replace("(", r"\(").replace(")", r"\)")):
        check_resources({"llm": llm})


def test_publishing_invalid_options_is_refused_before_any_worker_reads_them() -> None:
    import fakeredis

    from rollq.producer import Producer

    producer = Producer(fakeredis.FakeRedis(), namespace="opts")
    bad = LLM(endpoint="http://a/v1", model="m", sampling_parameters={"rollq": {"retries": "many"}})
    with pytest.raises(InvalidLLMOptionsError, match="resource 'llm'.*retries"):
        producer.update_resources({"llm": bad})
    assert producer.resources.latest_id() is None


def test_rendezvous_routing_is_sticky_spread_and_moves_only_the_ejected_servers_rollouts() -> None:
    upstreams = [f"http://s{i}:8000/v1" for i in range(4)]
    ids = [f"rollout-{i}" for i in range(4000)]
    first = {rid: rendezvous_order(rid, upstreams)[0] for rid in ids}
    assert all(rendezvous_order(rid, list(reversed(upstreams)))[0] == first[rid] for rid in ids[:200])
    spread = collections.Counter(first.values())
    assert min(spread.values()) > 800, spread  # about 1000 each
    health = UpstreamHealth()
    health.eject(upstreams[0], 60)
    moved = {rid: health.pick(rendezvous_order(rid, upstreams)) for rid in ids}
    assert all(moved[rid] == first[rid] for rid in ids if first[rid] != upstreams[0])
    assert all(moved[rid] != upstreams[0] for rid in ids)


def test_an_upstream_is_taken_out_after_failures_in_a_row_and_back_after_a_success_or_its_time() -> None:
    health = UpstreamHealth()
    assert not health.failed("a", seconds=60, after=3) and not health.failed("a", seconds=60, after=3)
    health.restore("a")
    assert not health.failed("a", seconds=60, after=3)  # the count started again
    health.failed("a", seconds=60, after=3)
    assert health.failed("a", seconds=60, after=3) and not health.usable("a") and health.out() == ["a"]
    assert health.pick(["a", "b"]) == "b" and health.pick(["a"]) == "a"  # all out: try anyway
    health.eject("b", 0.0)
    assert health.usable("b")
