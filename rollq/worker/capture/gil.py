"""The interpreter's GIL switch interval while the capturing proxy shares its process with the agents.

The proxy's thread needs the GIL for each step of a call (the request read, the upstream answer, the reply
written). While an agent's thread (or the worker's loop) runs Python, a thread that wants the GIL waits until the
holder lets go: at the latest after ``sys.getswitchinterval()``, 5 ms by default, once per step. With the
worker's own threads half busy that was most of the proxy's added latency (11-15 ms p50 over the same proxy beside
the same load in another process, 32 calls in flight; bench/capture.py --agent-load measures it). At 1 ms the
proxy's calls came within 1-2 ms of that. It is not free: a CPU-bound thread then hands the GIL over up to five
times as often, and a CPU-bound worker running the sample agent spent about 9% less CPU per rollout at 5 ms, and
8% more at 0.25 ms, than at 1 ms (bench/switch_interval.py). A worker's ``ROLLQ_CAPTURE_SWITCH_INTERVAL_MS`` sets
the interval its proxy asks for (``WorkerSettings.capture_switch_interval_ms``; 0: leave the interpreter's).

Only calls over the proxy's socket get it: the interval is lowered while the proxy's thread serves one
(:meth:`CaptureProxy._handle_over_socket`), and put back after the last one. An async agent's calls handed over in
memory leave it alone. Served on the agents' own loop (while it keeps up, :mod:`.in_memory`), no thread waits for
them. Served on the proxy's thread (while that loop is busy), their answers go back to a loop that needs the GIL as
much, and the workers did better at 5 ms: at 256 rollouts in flight, CPU-bound, the sample agent's calls added
less at p50 with the interval left at 5 ms than with it lowered for them in 4 rounds of 4 (+43.3 against -0.8 ms,
medians), and cost less CPU per rollout in 3; with it lowered only for calls over the socket, the default added
+1.6 ms against +41.9 at 1 ms throughout (bench/agent_calls.py, agent_calls_switch and agent_calls_switch_256;
docs/workers.md, "The GIL switch interval and calls handed over in memory").

The interval is process-wide: it is only ever lowered (a lower one set by the user is kept), and put back after the
proxy's last call over its socket, or when the proxy stops, unless someone changed it since.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)

SWITCH_INTERVAL_SECONDS = 0.001
"""The longest a thread holds the GIL while another waits for it, while the proxy's thread serves a call over its
socket."""


def lower_switch_interval(seconds: float) -> float | None:
    """Lower the switch interval to ``seconds`` if it is longer; the interval it replaced, or None if unchanged."""
    previous = sys.getswitchinterval()
    if previous <= seconds:
        return None
    sys.setswitchinterval(seconds)
    log.debug("GIL switch interval lowered from %g s to %g s for the capturing proxy", previous, seconds)
    return previous


def restore_switch_interval(previous: float | None, lowered_to: float) -> None:
    """Put back the interval :func:`lower_switch_interval` replaced, unless it was changed since."""
    if previous is not None and sys.getswitchinterval() == lowered_to:
        sys.setswitchinterval(previous)
