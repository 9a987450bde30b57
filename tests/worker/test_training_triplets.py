"""What the capturing proxy records for training, as triplets read it from the spans (no Redis, no server)."""

from __future__ import annotations

import json
from typing import Any

from rollq.worker.triplets import derive


def _call(response_ids: list[int], **attributes: Any) -> dict[str, Any]:
    return {
        "name": "chat m",
        "context": {"span_id": "0x1"},
        "parent_id": None,
        "start_time": "2026-01-01T00:00:01.000000Z",
        "end_time": "2026-01-01T00:00:02.000000Z",
        "attributes": {
            "rollq.llm.captured": True,
            "gen_ai.operation.name": "chat",
            "gen_ai.response.id": "r-1",
            "rollq.llm.prompt_token_ids": "[1,2]",
            "rollq.llm.response_token_ids": json.dumps(response_ids),
            **attributes,
        },
    }


def test_logprobs_one_per_token_id_are_kept_and_others_are_left_out_and_flagged() -> None:
    [aligned] = derive([_call([5, 6], **{"rollq.llm.response_logprobs": "[-0.1,-0.2]"})]).triplets
    assert aligned.response["logprobs"] == [-0.1, -0.2] and "logprobs_misaligned" not in aligned.metadata
    [short] = derive([_call([5, 6], **{"rollq.llm.response_logprobs": "[-0.1]"})]).triplets
    assert "logprobs" not in short.response
    assert short.metadata["logprobs_misaligned"] is True and short.metadata["response_logprobs"] == 1


def test_a_token_count_that_differs_from_the_usage_is_flagged_with_both_counts() -> None:
    found = derive([_call([5, 6, 7], **{"gen_ai.usage.output_tokens": 4})])
    [triplet] = found.triplets
    assert triplet.metadata["token_count_mismatch"] is True
    assert (triplet.metadata["response_tokens"], triplet.metadata["usage_completion_tokens"]) == (3, 4)
    assert found.warnings == ["response token ids differ from the usage's completion_tokens for 1 of 1 LLM call(s)"]
    [agreeing] = derive([_call([5, 6, 7], **{"gen_ai.usage.output_tokens": 3})]).triplets
    assert "token_count_mismatch" not in agreeing.metadata


def test_the_version_upstream_and_enforced_sampling_of_a_call_are_on_its_triplet() -> None:
    attributes = {
        "rollq.llm.resources_id": "v7",
        "rollq.llm.upstream": "http://gpu-1:8000/v1",
        "rollq.llm.sampling.enforced": json.dumps({"temperature": 1.0}),
        "rollq.llm.sampling.overridden": json.dumps({"temperature": 0.2}),
    }
    [triplet] = derive([_call([5], **attributes)]).triplets
    assert triplet.metadata["resources_id"] == "v7" and triplet.metadata["upstream"] == "http://gpu-1:8000/v1"
    assert triplet.metadata["sampling_enforced"] == {"temperature": 1.0}
    assert triplet.metadata["sampling_overridden"] == {"temperature": 0.2}
