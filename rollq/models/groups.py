"""Groups of rollouts of one input (GRPO-style), and how a task and its rollout say which group they belong to.

``Producer.enqueue_many(inputs, group_size=G)`` queues G tasks per input. Each member's task metadata, and the
metadata of the rollout a worker publishes for it, carry :data:`GROUP_ID`, :data:`GROUP_INDEX` and
:data:`GROUP_SIZE`. The member's rollout id is built from the same three values (:func:`member_rollout_id`), so a
rollout that a reaper or a cancel published without the task's metadata still names its group
(:func:`membership`), and a trainer can name every member of a group it has seen one of.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GROUP_ID = "group_id"
GROUP_INDEX = "group_index"
GROUP_SIZE = "group_size"
GROUP_FIELDS = (GROUP_ID, GROUP_INDEX, GROUP_SIZE)

_MEMBER_ID = re.compile(r"^(?P<group>grp-[0-9a-f]{32}-(?P<size>\d+))\.(?P<index>\d+)$")


@dataclass(frozen=True)
class Membership:
    """Which group a task or rollout belongs to, and its place in it."""

    group_id: str
    index: int
    size: int

    def metadata(self) -> dict[str, Any]:
        return {GROUP_ID: self.group_id, GROUP_INDEX: self.index, GROUP_SIZE: self.size}

    def member_ids(self) -> list[str]:
        """The rollout ids of every member of this group, in index order."""
        return [member_rollout_id(self.group_id, i) for i in range(self.size)]


def new_group_id(size: int) -> str:
    """A fresh group id; it records ``size`` so that a member's rollout id alone names the whole group."""
    if size < 1:
        raise ValueError(f"group_size must be at least 1, not {size}")
    return f"grp-{uuid.uuid4().hex}-{size}"


def member_rollout_id(group_id: str, index: int) -> str:
    return f"{group_id}.{index}"


def membership(rollout_id: str, metadata: Mapping[str, Any]) -> Membership | None:
    """The group of a task or rollout: from its metadata, else from its rollout id; None if it has no group."""
    group_id, index, size = (metadata.get(name) for name in GROUP_FIELDS)
    if isinstance(group_id, str) and type(index) is int and type(size) is int and 0 <= index < size:
        return Membership(group_id, index, size)
    match = _MEMBER_ID.match(rollout_id)
    if match is None:
        return None
    found = Membership(match["group"], int(match["index"]), int(match["size"]))
    return found if found.index < found.size else None
