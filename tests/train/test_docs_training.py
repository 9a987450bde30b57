"""Every ```python block of docs/training-trainers.md runs against a small batch, and the tensors it builds line
up the way each trainer's own code slices them: the recorded logprob of every sampled token sits where the
trainer's new logprob of that token will be, and nothing else is in the loss."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollq.models.contract import Rollout, Triplet
from rollq.producer.batches import Batch
from rollq.producer.groups import GroupAssembler, GroupPolicy

DOC = Path(__file__).resolve().parents[2] / "docs" / "training-trainers.md"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        message = "torch is not installed (pip install 'torch==2.13.0+cpu')"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + "; CI must not skip the training docs test")
        pytest.skip(message)
    return torch


def _logprob(token: int) -> float:
    """The 'sampler's' logprob of a token, a function of the token so that a misplaced one shows."""
    return -token / 1000


def _call(prompt: list[int], response: list[int]) -> Triplet:
    return Triplet(
        prompt={"token_ids": prompt},
        response={"token_ids": response, "logprobs": [_logprob(t) for t in response]},
        metadata={"resources_id": "v3"},
    )


def _group(tag: str, members: list[list[Triplet] | None], rewards: list[float]) -> Any:
    """A complete group; a None member is a failed rollout."""
    assembler = GroupAssembler(GroupPolicy())
    group = None
    for i, triplets in enumerate(members):
        rid = f"grp-{tag * 32}-{len(members)}.{i}"
        metadata = {"status": "failed", "error": "boom"} if triplets is None else {}
        rollout = Rollout(rollout_id=rid, final_reward=rewards[i], triplets=triplets or [], metadata=metadata)
        group = assembler.add(rollout)
    assert group is not None
    return group


def _batch() -> Batch:
    """Two groups: a two-call rollout with a tool's answer between the calls, unequal prompt and response
    lengths, and a failed member (which gives no sample)."""
    first = _group(
        "a",
        [
            [_call([11, 12, 13], [21, 22]), _call([11, 12, 13, 21, 22, 91, 92], [23, 24, 25])],  # 91 92: given
            [_call([11, 12, 13], [26])],
            None,
        ],
        rewards=[1.0, 0.0, 0.0],
    )
    second = _group("b", [[_call([14], [31, 32, 33, 34])], [_call([14], [35, 36])]], rewards=[0.5, 1.5])
    return Batch(groups=[first, second], latest_version=3)


# What the batch's rollouts sampled, in sample order, and each one's advantage (failed member left out).
SAMPLED = [[21, 22, 23, 24, 25], [26], [31, 32, 33, 34], [35, 36]]
GIVEN = [[91, 92], [], [], []]


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def _advantages(batch: Batch) -> list[float]:
    return [g.advantages[i] for g in batch.groups for i, f in enumerate(g.failures) if f is None]


def _check_verl(torch: Any, ns: dict[str, Any], batch: Batch) -> None:
    t = ns["tensors"]
    responses, mask = t["responses"], t["response_mask"]
    b, r = responses.shape
    assert b == len(SAMPLED) and t["prompts"].shape[0] == b
    for key in ("response_mask", "old_log_probs", "rollout_log_probs", "advantages", "token_level_scores"):
        assert t[key].shape == responses.shape, key
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert t[key].shape == (b, t["prompts"].shape[1] + r), key
    # dp_actor takes the new logprobs from logits[:, -R - 1 : -1] against `responses`: they end input_ids.
    assert torch.equal(t["input_ids"][:, -r:], responses)
    new = -responses / 1000
    assert torch.allclose(t["old_log_probs"] * mask, new * mask)
    assert [responses[i][mask[i].bool()].tolist() for i in range(b)] == SAMPLED
    attended = t["attention_mask"][:, -r:].bool() & ~mask.bool()
    assert [responses[i][attended[i]].tolist() for i in range(b)] == GIVEN  # the model reads a tool's answer
    for i in range(b):  # positions count the real tokens from 0, whatever the padding
        real = t["attention_mask"][i].bool()
        assert t["position_ids"][i][real].tolist() == list(range(int(real.sum())))
    adv = torch.tensor(_advantages(batch))
    assert torch.allclose(t["advantages"], adv[:, None] * mask)
    assert torch.allclose(t["token_level_scores"].sum(-1), torch.tensor([1.0, 0.0, 0.5, 1.5]))


def _check_openrlhf(torch: Any, ns: dict[str, Any], batch: Batch) -> None:
    f = ns["fields"]
    sequences, action_mask = f["sequences"], f["action_mask"]
    b, t = sequences.shape
    assert f["attention_mask"].shape == (b, t)
    for key in ("action_mask", "action_log_probs", "rollout_log_probs", "advantages"):
        assert f[key].shape == (b, t - 1), key
    for key in ("rewards", "response_length", "total_length"):
        assert f[key].shape == (b,), key
    # Actor.forward: log_probs of roll(sequences, -1), [:, :-1], then the last action_mask.shape[1] columns.
    rolled = torch.roll(sequences, shifts=-1, dims=1)
    new = (-rolled / 1000)[:, :-1][:, -action_mask.shape[1] :] * action_mask.float()
    assert torch.allclose(f["action_log_probs"] * action_mask, new)
    assert [sequences[i, 1:][action_mask[i].bool()].tolist() for i in range(b)] == SAMPLED
    assert all(sequences[i, 0] != 0 for i in range(b)) and f["attention_mask"][:, 0].all()  # right-padded
    adv = torch.tensor(_advantages(batch))
    assert torch.allclose(f["advantages"], adv[:, None] * action_mask)


def _check_trl(torch: Any, ns: dict[str, Any], batch: Batch) -> None:
    inputs = ns["inputs"]
    completion_ids = inputs["completion_ids"]
    b, r = completion_ids.shape
    assert inputs["prompt_ids"].shape == inputs["prompt_mask"].shape and inputs["prompt_ids"].shape[0] == b
    for key in ("completion_mask", "tool_mask", "old_per_token_logps", "sampling_per_token_logps"):
        assert inputs[key].shape == completion_ids.shape, key
    assert inputs["advantages"].shape == (b,) and inputs["num_items_in_batch"].ndim == 0
    loss_mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()  # as _compute_loss builds it
    assert [completion_ids[i][loss_mask[i]].tolist() for i in range(b)] == SAMPLED
    attended = inputs["completion_mask"].bool() & ~loss_mask
    assert [completion_ids[i][attended[i]].tolist() for i in range(b)] == GIVEN  # the model reads a tool's answer
    new = -completion_ids / 1000  # per_token_logps are those of completion_ids (logits_to_keep = R)
    assert torch.allclose(inputs["old_per_token_logps"] * loss_mask, new * loss_mask)
    assert int(inputs["num_items_in_batch"]) == sum(map(len, SAMPLED))
    assert inputs["prompt_mask"][:, -1].all()  # left-padded: the prompt ends where the completion starts
    assert torch.allclose(inputs["advantages"], torch.tensor(_advantages(batch)))


CHECKS: dict[str, Callable[[Any, dict[str, Any], Batch], None]] = {
    "tensors": _check_verl,
    "fields": _check_openrlhf,
    "inputs": _check_trl,
}


def test_the_doc_has_one_runnable_block_per_trainer() -> None:
    blocks = _blocks()
    assert len(blocks) == 3
    assigned = [name for block in blocks for name in CHECKS if re.search(rf"^{name}\b[^=\n]*= ", block, re.M)]
    assert assigned == list(CHECKS)


@pytest.mark.parametrize("index", range(3), ids=["verl", "openrlhf", "trl"])
def test_each_block_builds_the_trainer_inputs_aligned_with_its_own_slicing(index: int) -> None:
    torch = _torch()
    batch = _batch()
    block = _blocks()[index]
    namespace: dict[str, Any] = {"batch": batch, "__name__": "docs_block"}
    exec(compile(block, f"{DOC.name}[python block {index}]", "exec"), namespace)
    (name,) = [name for name in CHECKS if name in namespace]
    CHECKS[name](torch, namespace, batch)


def test_the_trl_wrap_takes_each_step_from_a_batch_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    # TRL is not installed here: a stand-in GRPOTrainer base lets the doc's subclass run its own line, the call
    # into rollq's reader (what producer.batches(...) returns), on a real BatchReader.
    import importlib.util
    import sys
    import types

    from rollq.producer.batches import BatchReader

    torch = _torch()
    if importlib.util.find_spec("trl") is None:
        trl = types.ModuleType("trl")
        trl.GRPOTrainer = type("GRPOTrainer", (), {})  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "trl", trl)
        real_find_spec = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda n, *a: object() if n == "trl" else real_find_spec(n, *a)
        )
    batch = _batch()

    class OneBatch(BatchReader):
        def __init__(self) -> None:  # no Redis: the batch is at hand
            pass

        def next_batch(self) -> Batch:
            return batch

    namespace: dict[str, Any] = {"batch": batch, "__name__": "docs_block"}
    exec(compile(_blocks()[2], f"{DOC.name}[python block 2]", "exec"), namespace)
    trainer = namespace["RollqGRPOTrainer"].__new__(namespace["RollqGRPOTrainer"])
    trainer.rollq_batches = OneBatch()
    inputs = trainer._generate_and_score_completions(None)
    assert torch.equal(inputs["advantages"], namespace["inputs"]["advantages"])
