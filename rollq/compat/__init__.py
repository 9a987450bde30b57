"""Running rollq where Agent Lightning was: its 0.1 server API over a Producer, and its HTTP endpoints.

- :mod:`rollq.compat.agentlightning`: ``AgentLightningServer``, AL 0.1's trainer-side Python API;
- :mod:`rollq.compat.gateway` and :mod:`rollq.compat.http`: AL 0.1's worker-facing endpoints
  (``rollq serve-al``) on rollq's queue and attempts, for unmodified AL clients.

This layer sits on top of the producer and worker layers and is imported by nothing below it.
"""
