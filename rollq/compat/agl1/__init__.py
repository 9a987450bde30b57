"""Agent Lightning 1.0 on rollq: its server API (``rollq serve-agl``) and its agents in rollq workers.

- :mod:`.schemas`: AL 1.0.2's wire shapes; :mod:`.mapping`: an AL rollout as a rollq task and back;
- :mod:`.store`: the API's operations on rollq's store; :mod:`.keys`: the few keys of its own;
- :mod:`.routes` (one module per resource), :mod:`.app` (auth, server), :mod:`.cli` (``serve-agl``);
- :mod:`.upstream`: AL's proxy rules, shared by the server's proxy route and :mod:`.adapter`, which runs
  AL 1.0 agent classes in rollq workers (``--agent rollq.compat.agl1:Agl1Agent``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adapter import Agl1Agent

__all__ = ["Agl1Agent"]


def __getattr__(name: str) -> Any:
    # Lazy: `rollq serve-agl` and the CLI do not pay for the worker's imports.
    if name == "Agl1Agent":
        from .adapter import Agl1Agent

        return Agl1Agent
    raise AttributeError(name)
