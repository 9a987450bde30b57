"""A request Redis refused is the server's trouble, not the client's: ``serve-al`` and ``serve-agl`` answer it 503
with a JSON body naming the refusal and a ``Retry-After``, and log it once a minute (a polling client meets it at
every poll).

What Redis refuses is a script's refusal (``claim.lua`` naming an in-flight set of another type: nothing written)
or a refusal of Redis's own (OOM, READONLY...). Nothing is lost by it: a claim refused leaves the task queued, its
RQ job put back (or issued again) by the reapers' sweeps once the cause is repaired. A 4xx told the client it was
wrong. Agent Lightning's clients carry on after a 503: 0.1-0.3's ``AgentLightningClient`` takes any failed poll for
"no task yet" and polls again after its interval; 1.0's controller logs a failed ``PATCH`` and sends it again at its
next reconcile, while the rollout is still listed queuing.
"""

from __future__ import annotations

import logging
import time

import redis
from aiohttp import web

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
"""What a 503 for a Redis refusal asks the client to wait (the reapers' sweep runs about every second)."""
REFUSAL_LOG_SECONDS = 60.0
"""How often a server logs the same refusal again."""
_logged: dict[str, float] = {}


def redis_refused(exc: redis.ResponseError, what: str) -> web.Response:
    """The 503 for ``what`` (``"the claim"``...) that Redis refused with ``exc``; logged once a minute a text."""
    text = str(exc)
    now = time.monotonic()
    if now - _logged.get(text, -REFUSAL_LOG_SECONDS) >= REFUSAL_LOG_SECONDS:
        _logged[text] = now
        log.error("Redis refused %s (answered 503, nothing lost; repair what it names): %s", what, text)
    return web.json_response(
        {"detail": f"Redis refused {what}: {text}"},
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )
