"""The proxy's gate on its own (no Redis): closing holds new requests, not running ones; the last
one out reports drained; waiting is bounded; opening stamps the newest version."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

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


def test_waiters_on_two_loops_are_counted_and_all_woken_by_one_opening() -> None:
    """A worker's gate serves the proxy's loop and the agents' (calls handed over in memory are served there): a
    pause holds and counts the calls of both, and the opening, run on the proxy's loop, wakes both."""
    loops = [asyncio.new_event_loop() for _ in range(2)]
    threads = [threading.Thread(target=loop.run_forever, daemon=True) for loop in loops]
    for thread in threads:
        thread.start()
    proxy_loop, agents_loop = loops
    try:
        gate = CallGate(wait_seconds=10)
        asyncio.run_coroutine_threadsafe(_bind(gate), proxy_loop).result(timeout=5)
        running = asyncio.run_coroutine_threadsafe(gate.admit(), agents_loop).result(timeout=5)
        assert running is None and gate.close(4) == GateCounts(4, 1, 0)  # the one admitted before is counted
        held = [asyncio.run_coroutine_threadsafe(gate.admit(), loop) for loop in (proxy_loop, agents_loop, agents_loop)]
        deadline = time.monotonic() + 5
        while gate.read().waiting < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.read() == GateCounts(4, 1, 3) and not any(f.done() for f in held)
        assert gate.open("v7") == GateCounts(0, 1, 3)
        assert [f.result(timeout=5) for f in held] == ["v7", "v7", "v7"]
        assert gate.read() == GateCounts(0, 4, 0)
    finally:
        for loop, thread in zip(loops, threads, strict=True):
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()


def test_admissions_racing_a_close_from_another_thread_are_all_counted_in_its_reply() -> None:
    """A request is either refused by the closed gate or counted in the counts the close returns: none slips in
    between (the proxy's loop closes the gate while calls are admitted on the agents' loop's thread)."""
    gate = CallGate(wait_seconds=0)
    admitted = 0
    stop = threading.Event()

    async def admit_until_stopped() -> None:
        nonlocal admitted
        while not stop.is_set():
            try:
                await gate.admit()
            except GateTimeout:
                continue
            admitted += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns between any two bytecodes, or nearly
    try:
        for epoch in range(1, 301):
            thread = threading.Thread(target=asyncio.run, args=(admit_until_stopped(),))
            thread.start()
            time.sleep(0.0005)
            counts = gate._close(epoch)
            stop.set()
            thread.join()
            assert counts.in_flight == admitted, f"pause {epoch}: {admitted} admitted, {counts.in_flight} counted"
            gate._reopen(None)
            gate.in_flight, admitted = 0, 0
            stop.clear()
    finally:
        sys.setswitchinterval(interval)


async def _bind(gate: CallGate) -> None:
    gate.bind(asyncio.get_running_loop())
