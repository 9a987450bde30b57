"""rollq.train: token-level samples from groups, per call and per rollout, and their padded columns."""

from __future__ import annotations

import subprocess
import sys

from rollq.models.contract import Rollout, Triplet
from rollq.producer.groups import GroupAssembler, GroupPolicy
from rollq.train import pad, rollout_samples, triplet_samples


def _call(prompt: list[int], response: list[int], version: str = "v2", logprobs: bool = True) -> Triplet:
    answer: dict[str, object] = {"token_ids": response}
    if logprobs:
        answer["logprobs"] = [-0.5] * len(response)
    return Triplet(prompt={"token_ids": prompt}, response=answer, metadata={"resources_id": version})


def _group(*members: list[Triplet], rewards: list[float] | None = None):
    assembler = GroupAssembler(GroupPolicy(scale_rewards=False))
    size = len(members)
    group = None
    for i, triplets in enumerate(members):
        rid = f"grp-{'0' * 32}-{size}.{i}"
        reward = (rewards or [float(i)] * size)[i]
        group = assembler.add(Rollout(rollout_id=rid, final_reward=reward, triplets=triplets, metadata={}))
    assert group is not None
    return group


def test_triplet_samples_carry_ids_logprobs_advantage_and_version() -> None:
    group = _group([_call([1, 2], [3, 4])], [_call([1, 2], [5], version="v3")], rewards=[0.0, 1.0])
    first, second = triplet_samples([group])
    assert (first.prompt_ids, first.response_ids, first.response_mask) == ([1, 2], [3, 4], [1, 1])
    assert first.old_logprobs == [-0.5, -0.5] and first.logprobs_recorded
    assert (first.advantage, second.advantage) == (-0.5, 0.5)
    assert (first.version, second.version) == (2, 3) and first.group_id == group.group_id


def test_calls_without_token_ids_are_left_out_and_missing_logprobs_are_flagged() -> None:
    no_ids = Triplet(prompt={"text": "hi"}, response={"text": "yo"})
    group = _group([no_ids, _call([1], [2], logprobs=False)])
    (sample,) = triplet_samples([group])
    assert sample.old_logprobs == [0.0] and not sample.logprobs_recorded


def test_a_multi_turn_rollout_joins_into_one_sample_with_given_tokens_masked() -> None:
    turns = [_call([1, 2], [3]), _call([1, 2, 3, 9, 9], [4, 5])]  # 9 9: a tool's answer between the calls
    (sample,) = rollout_samples([_group(turns)])
    assert sample.prompt_ids == [1, 2]
    assert sample.response_ids == [3, 9, 9, 4, 5] and sample.response_mask == [1, 0, 0, 1, 1]
    assert sample.old_logprobs == [-0.5, 0.0, 0.0, -0.5, -0.5]


def test_a_rollout_whose_history_was_rewritten_falls_back_to_one_sample_per_call() -> None:
    turns = [_call([1, 2], [3]), _call([7, 7], [4])]
    samples = rollout_samples([_group(turns)])
    assert [s.response_ids for s in samples] == [[3], [4]]


def test_failed_members_give_no_samples() -> None:
    group = _group([_call([1], [2])], [_call([1], [3])])
    group.failures[1] = "failed: boom"
    assert [s.response_ids for s in triplet_samples([group])] == [[2]]


def test_a_member_that_made_no_llm_call_with_token_ids_is_named_not_silently_left_out(caplog) -> None:
    no_ids = Triplet(prompt={"text": "hi"}, response={"text": "yo"})
    group = _group([_call([1], [2])], [], [no_ids])  # member 1 answered without an LLM call, member 2 without ids
    with caplog.at_level("WARNING", logger="rollq.train.samples"):
        samples = rollout_samples([group])
    assert [s.response_ids for s in samples] == [[2]]
    # The trainer got 1 row for 3 trained-on members, and nothing said so.
    assert "2 successful rollout(s) gave no sample" in caplog.text
    assert group.rollouts[1].rollout_id in caplog.text


def test_pad_left_pads_prompts_and_right_pads_responses() -> None:
    group = _group([_call([1, 2, 3], [4])], [_call([5], [6, 7])])
    columns = pad(triplet_samples([group]), pad_id=0)
    assert columns.prompt_ids == [[1, 2, 3], [0, 0, 5]] and columns.prompt_mask == [[1, 1, 1], [0, 0, 1]]
    assert columns.response_ids == [[4, 0], [6, 7]] and columns.response_mask == [[1, 0], [1, 1]]
    assert columns.old_logprobs == [[-0.5, 0.0], [-0.5, -0.5]]


def test_rollq_train_imports_no_torch() -> None:
    code = "import sys, rollq.train; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
