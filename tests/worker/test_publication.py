"""What a worker's publication of an attempt carries to the finish transition."""

from __future__ import annotations

import time

from rollq.models.contract import Rollout
from rollq.store.payloads import PAYLOAD_THRESHOLD
from rollq.store.replies import Claim
from rollq.worker.attempt import Attempt, Attempts, PublishLimits


def _publication(rollout: Rollout):  # type: ignore[no-untyped-def]
    claim = Claim(1, b"{}", b"{}", None, 1, time.time())
    attempt = Attempt.claimed(rollout.rollout_id, claim, "w")
    limits = PublishLimits(results_maxlen=100, max_result_bytes=10 * PAYLOAD_THRESHOLD, keep_seconds=0)
    return Attempts(None, limits).publication(attempt, rollout, failed=False, duration=1.0)  # type: ignore[arg-type]


def test_a_rollout_small_enough_to_go_inline_draws_no_payload_token() -> None:
    publication = _publication(Rollout(rollout_id="r", final_reward=1.0))
    assert publication.finish.payload_token == ""


def test_a_rollout_kept_in_a_payload_key_gets_a_token_of_its_own_per_publication() -> None:
    big = Rollout(rollout_id="r", final_reward=1.0, metadata={"blob": "x" * (PAYLOAD_THRESHOLD + 1)})
    first, second = _publication(big), _publication(big)
    assert len(first.finish.payload_token) == 16
    assert first.finish.payload_token != second.finish.payload_token
