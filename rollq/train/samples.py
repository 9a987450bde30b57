"""Token-level samples of a :class:`~rollq.producer.batches.Batch`, as plain Python lists."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rollq.models.contract import Triplet
from rollq.producer.batches import Batch
from rollq.producer.groups import RESOURCES_ID, Group, version_number

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenSample:
    """One training sequence: prompt, response and what the loss needs per response token."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    """1 where the model sampled the token (it is trained on), 0 where it was given (a tool's answer between
    two calls of one rollout)."""
    old_logprobs: list[float]
    """The sampler's log-probability of each response token (0.0 where masked out or not recorded)."""
    advantage: float
    reward: float | None
    group_id: str
    rollout_id: str
    version: int | None
    """The resources version (number) the sampling ran against; the oldest one for a joined rollout."""
    logprobs_recorded: bool
    """False when the backend returned no logprobs for some sampled token: recompute them before a ratio."""


def _ids(side: Any) -> list[int] | None:
    ids = side.get("token_ids") if isinstance(side, dict) else None
    return list(ids) if isinstance(ids, list) else None


def _logprobs(triplet: Triplet, length: int) -> tuple[list[float], bool]:
    values = triplet.response.get("logprobs") if isinstance(triplet.response, dict) else None
    if isinstance(values, list) and len(values) == length and all(isinstance(v, (int, float)) for v in values):
        return [float(v) for v in values], True
    return [0.0] * length, False


def _members(batch: Batch | Iterable[Group]) -> Iterable[tuple[Group, int]]:
    groups = batch.groups if isinstance(batch, Batch) else batch
    for group in groups:
        for index, failure in enumerate(group.failures):
            if failure is None:
                yield group, index


def triplet_samples(batch: Batch | Iterable[Group]) -> list[TokenSample]:
    """One sample per LLM call with token ids, of every member that did not fail; each carries its rollout's
    advantage. Calls without token ids are left out (and logged): they cannot be trained on exactly; so is a
    member with no such call (logged too: the samples are then fewer than the members)."""
    samples: list[TokenSample] = []
    skipped = 0
    empty: list[str] = []
    for group, index in _members(batch):
        rollout = group.rollouts[index]
        before = len(samples)
        for triplet in rollout.triplets or ():
            prompt, response = _ids(triplet.prompt), _ids(triplet.response)
            if prompt is None or response is None:
                skipped += 1
                continue
            logprobs, recorded = _logprobs(triplet, len(response))
            samples.append(
                TokenSample(
                    prompt_ids=prompt,
                    response_ids=response,
                    response_mask=[1] * len(response),
                    old_logprobs=logprobs,
                    advantage=group.advantages[index],
                    reward=group.rewards[index],
                    group_id=group.group_id,
                    rollout_id=rollout.rollout_id,
                    version=version_number(triplet.metadata.get(RESOURCES_ID)) or group.versions[index],
                    logprobs_recorded=recorded,
                )
            )
        if len(samples) == before:
            empty.append(rollout.rollout_id)
    if skipped:
        log.warning("%d LLM call(s) had no token ids and were left out of the samples", skipped)
    _say_empty(empty)
    return samples


def _say_empty(rollout_ids: list[str]) -> None:
    if rollout_ids:
        log.warning(
            "%d successful rollout(s) gave no sample: no LLM call with token ids (%s%s); there are fewer samples "
            "than rollouts trained on",
            len(rollout_ids),
            ", ".join(rollout_ids[:5]),
            ", ..." if len(rollout_ids) > 5 else "",
        )


def rollout_samples(batch: Batch | Iterable[Group]) -> list[TokenSample]:
    """One sample per rollout: its first call's prompt, then every call's response and, between calls, the
    tokens the next prompt added (masked out). A rollout whose next prompt does not extend the previous prompt
    and response (the agent rewrote its history) cannot be joined exactly: it gives one sample per call instead,
    as :func:`triplet_samples` does. A member with no LLM call with token ids gives no sample (logged with its id)."""
    samples: list[TokenSample] = []
    empty: list[str] = []
    for group, index in _members(batch):
        rollout = group.rollouts[index]
        calls = [t for t in rollout.triplets or () if _ids(t.prompt) is not None and _ids(t.response) is not None]
        if not calls:
            empty.append(rollout.rollout_id)
            continue
        prompt = _ids(calls[0].prompt) or []
        response: list[int] = []
        mask: list[int] = []
        old: list[float] = []
        recorded_all = True
        seen = list(prompt)
        joined = True
        for call in calls:
            call_prompt, call_response = _ids(call.prompt) or [], _ids(call.response) or []
            if call_prompt[: len(seen)] != seen:
                joined = False
                break
            given = call_prompt[len(seen) :]
            response += given + call_response
            mask += [0] * len(given) + [1] * len(call_response)
            logprobs, recorded = _logprobs(call, len(call_response))
            recorded_all &= recorded
            old += [0.0] * len(given) + logprobs
            seen = call_prompt + call_response
        if not joined:
            samples += triplet_samples([_only(group, index)])
            continue
        samples.append(
            TokenSample(
                prompt_ids=prompt,
                response_ids=response,
                response_mask=mask,
                old_logprobs=old,
                advantage=group.advantages[index],
                reward=group.rewards[index],
                group_id=group.group_id,
                rollout_id=rollout.rollout_id,
                version=group.versions[index],
                logprobs_recorded=recorded_all,
            )
        )
    _say_empty(empty)
    return samples


def _only(group: Group, index: int) -> Group:
    """``group`` with every member but ``index`` marked failed, so sample builders take that member alone."""
    failures: list[str | None] = ["left out"] * len(group.rollouts)
    failures[index] = None
    return Group(group.group_id, group.rollouts, group.rewards, group.advantages, failures, group.versions)


@dataclass(frozen=True)
class PaddedColumns:
    """Rectangular columns, one row per sample: prompts left-padded, responses right-padded."""

    prompt_ids: list[list[int]]
    prompt_mask: list[list[int]]
    response_ids: list[list[int]]
    response_mask: list[list[int]]
    """1 for trained-on response tokens, 0 for given tokens and padding."""
    old_logprobs: list[list[float]]
    advantages: list[float]
    rewards: list[float]
    group_ids: list[str]
    versions: list[int | None]


def pad(samples: Sequence[TokenSample], pad_id: int = 0) -> PaddedColumns:
    """The columns of ``samples`` padded to the longest prompt and the longest response."""
    width_p = max((len(s.prompt_ids) for s in samples), default=0)
    width_r = max((len(s.response_ids) for s in samples), default=0)
    return PaddedColumns(
        prompt_ids=[[pad_id] * (width_p - len(s.prompt_ids)) + s.prompt_ids for s in samples],
        prompt_mask=[[0] * (width_p - len(s.prompt_ids)) + [1] * len(s.prompt_ids) for s in samples],
        response_ids=[s.response_ids + [pad_id] * (width_r - len(s.response_ids)) for s in samples],
        response_mask=[s.response_mask + [0] * (width_r - len(s.response_mask)) for s in samples],
        old_logprobs=[s.old_logprobs + [0.0] * (width_r - len(s.old_logprobs)) for s in samples],
        advantages=[s.advantage for s in samples],
        rewards=[0.0 if s.reward is None else s.reward for s in samples],
        group_ids=[s.group_id for s in samples],
        versions=[s.version for s in samples],
    )
