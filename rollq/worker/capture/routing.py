"""Which upstream a call goes to: sticky per rollout, spread across servers, failing ones left out a while.

Rendezvous (highest-random-weight) hashing orders an LLM resource's upstreams for each rollout id: every call of a
rollout goes to the first usable one in its order (the server that holds its prefix cache), rollouts spread
evenly, and every worker on every host computes the same order with no shared state. When a server is taken out
(:meth:`UpstreamHealth.eject`), only the rollouts that were on it move, each to the next server in its own order;
when the list changes, only rollouts whose first server was added or removed move.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Sequence


def rendezvous_order(rollout_id: str, upstreams: Sequence[str]) -> tuple[str, ...]:
    """``upstreams`` in the order ``rollout_id`` prefers them (the same on every host)."""
    if len(upstreams) < 2:
        return tuple(upstreams)
    key = rollout_id.encode()

    def weight(upstream: str) -> bytes:
        return hashlib.blake2b(key + b"\x00" + upstream.encode(), digest_size=8).digest()

    return tuple(sorted(upstreams, key=weight, reverse=True))


class UpstreamHealth:
    """Upstreams taken out of the routing, until when (monotonic time), and failures in a row; one per worker
    process."""

    def __init__(self) -> None:
        self._out_until: dict[str, float] = {}
        self._failures: dict[str, int] = {}

    def eject(self, upstream: str, seconds: float) -> None:
        """Leave ``upstream`` out for ``seconds`` (0: not at all)."""
        if seconds > 0:
            self._out_until[upstream] = time.monotonic() + seconds
        self._failures.pop(upstream, None)

    def failed(self, upstream: str, *, seconds: float, after: int) -> bool:
        """Count a failed answer of ``upstream``; the ``after``-th in a row takes it out (True then)."""
        count = self._failures.get(upstream, 0) + 1
        self._failures[upstream] = count
        if count >= after:
            self.eject(upstream, seconds)
            return True
        return False

    def restore(self, upstream: str) -> None:
        """``upstream`` answered: take it back at once, its failures forgotten."""
        self._out_until.pop(upstream, None)
        self._failures.pop(upstream, None)

    def usable(self, upstream: str) -> bool:
        until = self._out_until.get(upstream)
        if until is None:
            return True
        if time.monotonic() >= until:
            del self._out_until[upstream]  # its time out is over: the next call tries it again
            return True
        return False

    def pick(self, order: Sequence[str], avoid: str | None = None) -> str:
        """The first usable upstream of ``order`` other than ``avoid``; when none is, the first other than
        ``avoid`` (every server out: try anyway rather than refuse the call)."""
        candidates = [u for u in order if u != avoid] or list(order)
        for upstream in candidates:
            if self.usable(upstream):
                return upstream
        return candidates[0]

    def out(self) -> list[str]:
        """The upstreams out of the routing now."""
        return [u for u in list(self._out_until) if not self.usable(u)]


def backoff(retry: int, first: float, longest: float) -> float:
    """The wait before retry number ``retry`` (1, 2, ...): ``first`` doubling up to ``longest``, with full jitter
    over its upper half so that callers failed together do not retry together."""
    ceiling = min(longest, first * (2 ** (retry - 1)))
    return ceiling / 2 + random.random() * ceiling / 2
