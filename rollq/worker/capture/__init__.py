"""Capturing every LLM call an agent makes, with the token ids the model saw and produced.

Each worker process runs one :class:`CaptureProxy` on 127.0.0.1, started by :class:`OnDemandCapture` when
the first attempt has an LLM endpoint to capture. An attempt's ``LLM`` resources point at it through an
unguessable per-attempt token; the proxy forwards to the real endpoint, asks it for token ids, and records
each call as a GenAI span in that attempt's trace.

The names are imported on first use (PEP 562): importing this package, or its light modules (``calls``,
``spans``, ``tokens``), does not import the proxy's HTTP stack (httptools), which a worker with no LLM
resources never needs (tests/worker/test_startup_imports.py pins it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .calls import CallKind, CapturedCall
    from .on_demand import OnDemandCapture
    from .proxy import AttemptCapture, CaptureProxy

__all__ = ["CallKind", "CapturedCall", "AttemptCapture", "CaptureProxy", "OnDemandCapture"]

_HOME = {
    "CallKind": ".calls",
    "CapturedCall": ".calls",
    "AttemptCapture": ".proxy",
    "CaptureProxy": ".proxy",
    "OnDemandCapture": ".on_demand",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name], __name__), name)
