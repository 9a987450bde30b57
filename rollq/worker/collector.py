"""How often the cyclic garbage collector looks at new objects in a process that runs rollouts.

A worker keeps hundreds of rollouts in flight, each with spans, contexts and
tasks that live for seconds: they outlive every young collection and are moved
on to the oldest generation, whose full collections then run again and again.
At 1000 in flight on 2 worker processes the collector took 13-14% of the
workers' CPU with Python's young-generation threshold of 700; with 5000, 3-4%
(worker CPU 1.40 -> 1.27 ms per rollout, bench/profile.py with gc callbacks).
Garbage in reference cycles is still collected, just after 5000 new objects
instead of 700; rollq's own per-rollout objects form no cycles
(tests/worker/test_tracer.py, tests/worker/test_executor.py).
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

YOUNG_THRESHOLD = 5000
"""New container objects (net of those freed) before a young collection; Python's default is 700."""


def widen_young_generation(threshold: int = YOUNG_THRESHOLD) -> None:
    """Raise the collector's young-generation threshold to ``threshold``.

    A higher threshold someone already set is kept, and so is 0 (automatic
    collection turned off); the older generations' thresholds are left alone.
    """
    young, middle, old = gc.get_threshold()
    if 0 < young < threshold:
        gc.set_threshold(threshold, middle, old)
        log.debug("garbage collector: young-generation threshold %d -> %d", young, threshold)
