"""Reading a claimed task's JSON back into its Task and RolloutPolicy."""

from __future__ import annotations

import pytest

from rollq.models.contract import Task
from rollq.models.errors import InvalidTaskError
from rollq.models.policy import RolloutPolicy
from rollq.store.records import parse_task


def test_tasks_sharing_a_policy_json_read_it_alike_and_a_bad_one_is_still_refused() -> None:
    policy_json = RolloutPolicy(timeout_seconds=7, max_attempts=2).model_dump_json().encode()
    tasks = [Task(rollout_id=f"r{i}", input=i).model_dump_json().encode() for i in range(2)]
    (first, p1), (second, p2) = (
        parse_task(f"r{i}", t, policy_json, claims=i + 1, last_claim=float(i)) for i, t in enumerate(tasks)
    )
    assert p1 == p2 == RolloutPolicy(timeout_seconds=7, max_attempts=2)
    assert (first.input, first.num_claims, second.input, second.num_claims) == (0, 1, 1, 2)
    with pytest.raises(InvalidTaskError, match="timeout_seconds"):
        parse_task("r3", tasks[0], b'{"timeout_seconds": -1}', claims=1, last_claim=None)
    with pytest.raises(InvalidTaskError, match="timeout_seconds"):  # refused again: nothing kept of it
        parse_task("r3", tasks[0], b'{"timeout_seconds": -1}', claims=1, last_claim=None)
