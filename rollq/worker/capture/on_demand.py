"""The worker's capturing proxy, started by the first attempt that has an LLM endpoint to capture.

A worker whose agents get no LLM resources never imports the proxy's HTTP stack (aiohttp, about 0.3 s of a
worker's start-up here) nor runs its thread; the first attempt with an http(s) ``LLM`` resource starts it,
once per process, and every later attempt shares it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context

from rollq.models.contract import LLM, NamedResources

if TYPE_CHECKING:
    from .proxy import AttemptCapture, CaptureProxy


def capturable(resources: NamedResources) -> bool:
    """Whether any resource is an LLM at an http(s) endpoint: what the proxy captures."""
    return any(
        isinstance(resource, LLM) and urlsplit(resource.endpoint).scheme in ("http", "https")
        for resource in resources.values()
    )


class OnDemandCapture:
    """:class:`CaptureProxy`'s ``open_attempt`` and ``stop``, the proxy started when first needed."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._proxy: CaptureProxy | None = None
        self._lock = threading.Lock()

    @property
    def proxy(self) -> CaptureProxy | None:
        """The running proxy, or None while no attempt has needed one."""
        return self._proxy

    def open_attempt(
        self, resources: NamedResources, parent: Context, tracer: trace.Tracer
    ) -> tuple[NamedResources, AttemptCapture | None]:
        """``resources`` with each http(s) LLM endpoint pointed at the proxy, and the attempt's capture; with no
        such endpoint, a copy of ``resources`` (the cached ones are shared by every attempt) and no capture."""
        if not capturable(resources):
            return dict(resources), None
        return self._started().open_attempt(resources, parent, tracer)

    def _started(self) -> CaptureProxy:
        with self._lock:
            if self._proxy is None:
                from .proxy import CaptureProxy

                self._proxy = CaptureProxy(self.host).start()
            return self._proxy

    def stop(self) -> None:
        with self._lock:
            proxy, self._proxy = self._proxy, None
        if proxy is not None:
            proxy.stop()
