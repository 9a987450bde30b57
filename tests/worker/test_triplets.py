"""Triplets from traces: one per LLM call and only for LLM calls; rewards from rollq and Agent Lightning spans."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest

from rollq.models.errors import InvalidRewardError
from rollq.worker.normalize import to_rollout
from rollq.worker.tracer import emit_reward
from rollq.worker.triplets import derive

_clock = itertools.count(1)


def span(name: str, parent: str | None = None, span_id: str | None = None, **attributes: Any) -> dict[str, Any]:
    """A span dict in the trace's form, started (and ended) after every span made before it."""
    start = next(_clock)
    return {
        "name": name,
        "context": {"span_id": span_id or f"0x{start:016x}"},
        "parent_id": parent,
        "start_time": f"2026-01-01T00:00:{start:09.6f}Z",
        "end_time": f"2026-01-01T00:00:{start + 0.5:09.6f}Z",
        "attributes": attributes,
    }


def captured(response_id: str, prompt_ids: list[int], response_ids: list[int], **extra: Any) -> dict[str, Any]:
    return span(
        "chat m",
        **{
            "rollq.llm.captured": True,
            "gen_ai.operation.name": "chat",
            "gen_ai.response.id": response_id,
            "gen_ai.response.model": "m",
            "gen_ai.response.finish_reasons": ["stop"],
            "rollq.llm.resource": "main_llm",
            "rollq.llm.request.messages": json.dumps([{"role": "user", "content": response_id}]),
            "rollq.llm.response.text": f"answer {response_id}",
            "rollq.llm.prompt_token_ids": prompt_ids,
            "rollq.llm.response_token_ids": response_ids,
            **extra,
        },
    )


def test_autogen_agent_and_tool_spans_make_no_triplets_only_the_inference_calls_do() -> None:
    trace = [
        span("create_agent solver", **{"gen_ai.operation.name": "create_agent", "gen_ai.agent.name": "solver"}),
        agent := span(
            "invoke_agent solver", **{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "solver"}
        ),
        span("chat m", parent=agent["context"]["span_id"], **{"gen_ai.operation.name": "chat", "gen_ai.prompt": "q"}),
        span("execute_tool calc", **{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calc"}),
        span("reward", **{"rollq.reward": 1.0}),
        span("generate_content g", **{"gen_ai.operation.name": "generate_content", "gen_ai.prompt": "q2"}),
    ]
    result = derive(trace)
    assert [t.prompt for t in result.triplets] == [{"text": "q"}, {"text": "q2"}]
    assert [t.reward for t in result.triplets] == [1.0, None]
    assert result.triplets[0].metadata["agent"] == "solver" and "agent" not in result.triplets[1].metadata


def test_a_call_seen_by_the_proxy_and_by_instrumentation_counts_once_with_the_proxys_token_ids() -> None:
    agent = span("invoke_agent a", **{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"})
    instrumented = span(
        "chat m",
        parent=agent["context"]["span_id"],
        **{"gen_ai.operation.name": "chat", "gen_ai.response.id": "r1", "gen_ai.input.messages": "[]"},
    )
    proxy = captured("r1", [1, 2], [3])
    [triplet] = derive([agent, instrumented, proxy]).triplets
    assert triplet.prompt == {"messages": [{"role": "user", "content": "r1"}], "token_ids": [1, 2]}
    assert triplet.response == {"text": "answer r1", "token_ids": [3]}
    assert triplet.metadata["agent"] == "a" and triplet.metadata["resource"] == "main_llm"


def test_a_proxy_call_inside_an_agent_spans_time_belongs_to_that_agent_and_the_filter_keeps_only_it() -> None:
    a = span("invoke_agent a", **{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"})
    first = captured("r1", [1], [2])
    a["end_time"] = first["end_time"]
    trace = [a, first, captured("r2", [3], [4])]
    assert [t.metadata.get("agent") for t in derive(trace).triplets] == ["a", None]
    assert [t.metadata["response_id"] for t in derive(trace, only_agent="a").triplets] == ["r1"]


def test_agent_lightning_01_agentops_reward_spans_are_read() -> None:
    output = json.dumps({"type": "reward", "value": 0.7})
    trace = [captured("r1", [1], [2]), span("reward_fn", **{"agentops.entity.output": output})]
    result = derive(trace)
    assert result.triplets[0].reward == 0.7 and result.last_reward == 0.7


def test_agent_lightning_03_multi_dimensional_rewards_put_the_primary_on_the_triplet_and_the_rest_in_metadata() -> None:
    call = captured("r1", [1], [2])
    reward = span(
        "agentlightning.reward",
        **{
            "agentlightning.reward.0.name": "correct",
            "agentlightning.reward.0.value": 1.0,
            "agentlightning.reward.1.name": "brevity",
            "agentlightning.reward.1.value": 0.25,
        },
    )
    [triplet] = derive([call, reward]).triplets
    assert triplet.reward == 1.0
    assert triplet.metadata["rewards"] == {"correct": 1.0, "brevity": 0.25}


def test_a_reward_before_any_call_stays_in_the_trace_and_is_named_in_a_warning() -> None:
    trace = [span("reward", **{"rollq.reward": 0.5}), captured("r1", [1], [2])]
    result = derive(trace)
    assert result.triplets[0].reward is None
    [warning] = result.warnings
    assert "0.5" in warning and "before any LLM call" in warning


def test_the_final_reward_is_the_last_reward_even_when_calls_follow_it() -> None:
    trace = [captured("r1", [1], [2]), span("reward", **{"rollq.reward": 0.5}), captured("r2", [3], [4])]
    result = derive(trace)
    assert [t.reward for t in result.triplets] == [0.5, None] and result.last_reward == 0.5


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_reward_span_is_an_error_that_says_so(value: float) -> None:
    with pytest.raises(InvalidRewardError, match="finite"):
        derive([captured("r1", [1], [2]), span("reward", **{"rollq.reward": value})])
    relaxed = derive([captured("r1", [1], [2]), span("reward", **{"rollq.reward": value})], strict=False)
    assert relaxed.triplets[0].reward is None and "finite" in relaxed.warnings[0]


def test_emit_reward_refuses_nan_where_it_is_called() -> None:
    with pytest.raises(InvalidRewardError, match="nan"):
        emit_reward(math.nan)


def test_a_returned_nan_reward_is_an_error() -> None:
    with pytest.raises(InvalidRewardError, match="final reward"):
        to_rollout("r", math.nan, [])


def test_a_failed_captured_call_makes_no_triplet() -> None:
    trace = [captured("r1", [1], [2], **{"error.type": "503"}), captured("r2", [3], [4])]
    assert [t.metadata["response_id"] for t in derive(trace).triplets] == ["r2"]


def test_agent_lightning_02_emit_reward_spans_named_agentlightning_reward_are_read() -> None:
    # AL 0.2.2's emit_reward: a span named "agentlightning.reward" with a plain "reward" attribute.
    trace = [captured("r1", [1], [2]), span("agentlightning.reward", reward=0.4)]
    result = derive(trace)
    assert result.triplets[0].reward == 0.4 and result.last_reward == 0.4
