"""Capturing every LLM call an agent makes, with the token ids the model saw and produced.

Each worker process runs one :class:`CaptureProxy` on 127.0.0.1. An attempt's
``LLM`` resources point at it through an unguessable per-attempt token; the
proxy forwards to the real endpoint, asks it for token ids, and records each
call as a GenAI span in that attempt's trace.
"""

from .calls import CallKind, CapturedCall
from .proxy import AttemptCapture, CaptureProxy

__all__ = ["CallKind", "CapturedCall", "AttemptCapture", "CaptureProxy"]
