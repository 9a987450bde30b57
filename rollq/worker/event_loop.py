"""The event loops rollq runs its own asyncio code on (the agents' loop, the capturing proxy's): uvloop's where it
is installed, asyncio's otherwise.

uvloop keeps timers, callbacks and sockets in C: the agent side's CPU per rollout was ~13% lower on it at 500
rollouts in flight (bench/rollout_cpu.py), a bare aiohttp forwarder's ~30% (bench/capture.py). It does not
support Windows, where asyncio's loop does the same job.
"""

from __future__ import annotations

import asyncio


def new_event_loop(*, uvloop_allowed: bool = True) -> asyncio.AbstractEventLoop:
    """A new loop: uvloop's when it is installed and ``uvloop_allowed``, else asyncio's."""
    if uvloop_allowed:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()
