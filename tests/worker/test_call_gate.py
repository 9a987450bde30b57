"""The proxy's gate on its own (one event loop, no Redis): closing holds new requests, not running ones; the last
one out reports drained; waiting is bounded; opening stamps the newest version."""

from __future__ import annotations

import asyncio

import pytest

from rollq.worker.capture.gate import CallGate, GateCounts, GateTimeout, version_number


def test_a_closed_gate_holds_new_requests_lets_running_ones_finish_and_reports_drained() -> None:
    async def main() -> None:
        gate = CallGate(wait_seconds=5)
        gate.bind(asyncio.get_running_loop())
        gate.note_version("v1")
        drained: list[GateCounts] = []
        gate.on_drained = drained.append
        assert await gate.admit() == "v1"
        gate._close(3)
        waiter = asyncio.create_task(gate.admit())
        await asyncio.sleep(0.05)
        assert not waiter.done() and gate.counts() == GateCounts(3, 1, 1)
        gate.release()
        assert drained == [GateCounts(3, 0, 1)]  # the running request ended: drained, one waiting
        gate._reopen("v2")
        assert await waiter == "v2" and gate.counts() == GateCounts(0, 1, 0)
        assert gate.first_call_after_resume is not None and gate.first_call_after_resume < 1

    asyncio.run(main())


def test_a_request_waiting_past_the_bound_gets_a_timeout_with_retry_after() -> None:
    async def main() -> None:
        gate = CallGate(wait_seconds=0.2, retry_after=7)
        gate.bind(asyncio.get_running_loop())
        gate._close(1)
        with pytest.raises(GateTimeout) as caught:
            await gate.admit()
        assert caught.value.retry_after == 7 and caught.value.waited >= 0.2
        assert gate.counts() == GateCounts(1, 0, 0)

    asyncio.run(main())


def test_versions_only_move_forward() -> None:
    gate = CallGate()
    for seen in ("v2", "v10", "v9", None, "v10"):
        gate.note_version(seen)
    assert gate.version == "v10"
    assert version_number("v12") == 12 and version_number("custom") == -1 and version_number(None) == -1
