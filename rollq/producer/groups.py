"""Complete groups out of single rollouts, sans I/O: advantages, failed members, staleness.

:class:`GroupAssembler` is fed rollouts in any order (duplicates included) and returns each group once all its
members are in. It does no I/O: the readers in :mod:`rollq.producer.batches` feed it from the results stream, ask
it which groups are overdue, look their missing members up in Redis and hand back what they found.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rollq.models.contract import Rollout
from rollq.models.groups import Membership, membership
from rollq.models.policy import RolloutStatus

RESOURCES_ID = "resources_id"
"""The metadata key, on a rollout and on each triplet, of the resources version it ran against."""


def version_number(resources_id: object) -> int | None:
    """``"v12"`` -> 12: the order of resources versions (see ``rollq.store.resources``); None for anything else."""
    if isinstance(resources_id, str) and resources_id[:1] == "v" and resources_id[1:].isdigit():
        return int(resources_id[1:])
    return None


def oldest_version(rollout: Rollout) -> int | None:
    """The oldest resources version any LLM call of ``rollout`` ran against.

    Each captured triplet records the version its call ran against; a rollout without triplet versions falls
    back to the version its attempt launched with. None when neither is known.
    """
    versions = [
        number
        for triplet in rollout.triplets or ()
        if (number := version_number(triplet.metadata.get(RESOURCES_ID))) is not None
    ]
    if versions:
        return min(versions)
    return version_number(rollout.metadata.get(RESOURCES_ID))


def member_failure(rollout: Rollout) -> str | None:
    """Why a member cannot be trained on (its status, or a missing or non-finite reward); None if it can."""
    status = rollout.metadata.get("status", RolloutStatus.SUCCEEDED.value)
    if status != RolloutStatus.SUCCEEDED.value:
        error = rollout.metadata.get("error")
        return f"{status}: {error}" if error else str(status)
    reward = rollout.final_reward
    if reward is None:
        return "no reward"
    if not math.isfinite(reward):
        return f"reward {reward} is not finite"
    return None


@dataclass(frozen=True)
class GroupPolicy:
    """What a group's advantages are, and what happens to groups with failed or stale members.

    - ``on_failure``: ``"drop"`` a group any member of which failed, was cancelled, was lost or has no reward;
      ``"keep"`` it with those members marked (``Group.failed``), advantage 0, left out of the group's mean/std.
    - ``on_stale``: ``"drop"`` a group older than the staleness bound, or ``"requeue"`` its input as a new group.
    - ``scale_rewards``: GRPO's (r - mean) / (std + eps) when True; (r - mean) alone (Dr. GRPO) when False.
      The std is the sample standard deviation (n - 1), as TRL's GRPOTrainer computes it.
    - ``group_timeout``: seconds after a group's first member arrived before its missing members are looked up in
      Redis (a member read by a trainer that died, or trimmed). Members still queued or running are waited for:
      rollq ends every task (retries, then a failed rollout), so no group waits forever; members that no longer
      exist count as lost (a failure).
    """

    on_failure: Literal["drop", "keep"] = "drop"
    on_stale: Literal["drop", "requeue"] = "drop"
    scale_rewards: bool = True
    eps: float = 1e-6
    group_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.on_failure not in ("drop", "keep"):
            raise ValueError(f"on_failure must be 'drop' or 'keep', not {self.on_failure!r}")
        if self.on_stale not in ("drop", "requeue"):
            raise ValueError(f"on_stale must be 'drop' or 'requeue', not {self.on_stale!r}")
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be a finite number of 0 or more, not {self.eps!r}")
        if not (
            isinstance(self.group_timeout, (int, float))
            and math.isfinite(self.group_timeout)
            and self.group_timeout > 0
        ):
            raise ValueError(f"group_timeout must be a finite number of seconds above 0, not {self.group_timeout!r}")

    def advantages(self, rewards: Sequence[float | None]) -> list[float]:
        """Group-normalised advantages; members with no reward (failed) get 0 and do not count."""
        present = [r for r in rewards if r is not None]
        if not present:
            return [0.0] * len(rewards)
        mean = statistics.fmean(present)
        scale = (statistics.stdev(present) if len(present) > 1 else 0.0) + self.eps if self.scale_rewards else 1.0
        return [0.0 if r is None else (r - mean) / scale for r in rewards]


@dataclass
class Group:
    """All members of one group, in index order, with what a GRPO step needs of them."""

    group_id: str
    rollouts: list[Rollout]
    """One per member; a lost member is a failed rollout that says so."""
    rewards: list[float | None]
    """``final_reward`` per member; None where the member failed (see ``failures``)."""
    advantages: list[float]
    failures: list[str | None]
    """Why each member failed, or None."""
    versions: list[int | None]
    """Per member, the oldest resources version (number) its LLM calls ran against."""

    @property
    def failed(self) -> list[bool]:
        return [f is not None for f in self.failures]

    @property
    def any_failed(self) -> bool:
        return any(f is not None for f in self.failures)

    @property
    def oldest_version(self) -> int | None:
        known = [v for v in self.versions if v is not None]
        return min(known) if known else None

    def staleness(self, latest: int | None) -> int | None:
        """How many versions behind ``latest`` the group's oldest call is (None when either is unknown)."""
        oldest = self.oldest_version
        return None if latest is None or oldest is None else latest - oldest

    @property
    def mean_reward(self) -> float | None:
        present = [r for r in self.rewards if r is not None]
        return statistics.fmean(present) if present else None


@dataclass
class _Pending:
    membership: Membership
    first_seen: float
    members: dict[int, Rollout] = field(default_factory=dict)
    looked_up: float = 0.0

    def missing_ids(self) -> list[str]:
        ids = self.membership.member_ids()
        return [ids[i] for i in range(self.membership.size) if i not in self.members]


class GroupAssembler:
    """Collects members until their group is complete; each group is returned once, duplicates are ignored."""

    def __init__(self, policy: GroupPolicy | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy or GroupPolicy()
        self.clock = clock
        self._pending: dict[str, _Pending] = {}
        self._done: dict[str, None] = {}  # recently completed group ids (insertion-ordered, bounded)
        self.duplicates = 0

    @property
    def waiting(self) -> int:
        """Groups with some but not all members in."""
        return len(self._pending)

    def add(self, rollout: Rollout) -> Group | None:
        """Take one rollout; the group it completes, if it does. A rollout of no group is a group of one."""
        member = membership(rollout.rollout_id, rollout.metadata) or Membership(rollout.rollout_id, 0, 1)
        if member.group_id in self._done:
            self.duplicates += 1
            return None
        pending = self._pending.get(member.group_id)
        if pending is None:
            pending = self._pending[member.group_id] = _Pending(member, self.clock())
        if member.index in pending.members:
            self.duplicates += 1
            return None
        pending.members[member.index] = rollout
        if len(pending.members) < member.size:
            return None
        return self._complete(pending)

    def overdue(self) -> list[tuple[str, list[str]]]:
        """``(group_id, missing rollout ids)`` of groups waiting longer than the policy's ``group_timeout``
        (since their first member, or since they were last looked up)."""
        now = self.clock()
        due = []
        for group_id, pending in self._pending.items():
            if now - max(pending.first_seen, pending.looked_up) >= self.policy.group_timeout:
                pending.looked_up = now
                due.append((group_id, pending.missing_ids()))
        return due

    def lost(self, group_id: str, rollouts: Sequence[Rollout]) -> Group | None:
        """Fill a group's members that can no longer arrive with these (failed) rollouts; the group if complete."""
        pending = self._pending.get(group_id)
        if pending is None:
            return None
        for rollout in rollouts:
            found = membership(rollout.rollout_id, rollout.metadata)
            if found is not None and found.group_id == group_id:
                pending.members.setdefault(found.index, rollout)
        return self._complete(pending) if len(pending.members) == pending.membership.size else None

    def settled(self, group_id: str) -> None:
        """Forget a waiting group that was settled before (handed over or dropped, by an earlier run of this
        reader): its members that arrived are duplicates, and it is not returned again."""
        pending = self._pending.pop(group_id, None)
        if pending is not None:
            self.duplicates += len(pending.members)
            self._done[group_id] = None

    def _complete(self, pending: _Pending) -> Group:
        group_id = pending.membership.group_id
        del self._pending[group_id]
        self._done[group_id] = None
        while len(self._done) > 100_000:
            del self._done[next(iter(self._done))]
        rollouts = [pending.members[i] for i in range(pending.membership.size)]
        failures = [member_failure(r) for r in rollouts]
        rewards = [None if f is not None else r.final_reward for r, f in zip(rollouts, failures, strict=True)]
        return Group(
            group_id=group_id,
            rollouts=rollouts,
            rewards=rewards,
            advantages=self.policy.advantages(rewards),
            failures=failures,
            versions=[oldest_version(r) for r in rollouts],
        )
