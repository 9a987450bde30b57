"""The worker's capturing proxy, started by the first attempt that has an LLM endpoint to capture.

A worker whose agents get no LLM resources never imports the proxy's HTTP stack (aiohttp then, about 0.3 s of a
worker's start-up; httptools now) nor runs its thread; the first attempt with an http(s) ``LLM`` resource starts it,
once per process, and every later attempt shares it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context

from rollq.models.contract import LLM, NamedResources

from ..executor import BUSY_LAG_SECONDS
from .gate import CallGate
from .gil import SWITCH_INTERVAL_SECONDS

if TYPE_CHECKING:
    from .proxy import AttemptCapture, CaptureProxy


def capturable(resources: NamedResources) -> bool:
    """Whether any resource is an LLM at an http(s) endpoint: what the proxy captures."""
    return any(
        isinstance(resource, LLM) and urlsplit(resource.endpoint).scheme in ("http", "https")
        for resource in resources.values()
    )


class OnDemandCapture:
    """:class:`CaptureProxy`'s ``open_attempt``, ``gate`` and ``stop``, the proxy started when first needed (with
    ``switch_interval``: :class:`CaptureProxy`'s, None to leave the interpreter's GIL switch interval alone; with
    ``loop``, served on that running loop; with ``in_memory``, async httpx calls to it handed over in memory, and
    those from ``agents_loop`` served there while it is not busy (``agents_lag``, ``agents_busy_lag``): see
    :class:`CaptureProxy`).

    The gate exists from the start (a weight-sync pause can close it before any proxy runs); the proxy binds it
    to its loop when it starts.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        gate: CallGate | None = None,
        switch_interval: float | None = SWITCH_INTERVAL_SECONDS,
        loop: asyncio.AbstractEventLoop | None = None,
        in_memory: bool = False,
        agents_loop: asyncio.AbstractEventLoop | None = None,
        agents_lag: Callable[[], float] | None = None,
        agents_busy_lag: float = BUSY_LAG_SECONDS,
    ) -> None:
        self.host = host
        self.in_memory = in_memory
        self.agents_loop = agents_loop
        self.agents_lag = agents_lag
        self.agents_busy_lag = agents_busy_lag
        self.gate = gate or CallGate()
        self.switch_interval = switch_interval
        self.loop = loop
        self._proxy: CaptureProxy | None = None
        self._lock = threading.Lock()

    @property
    def proxy(self) -> CaptureProxy | None:
        """The running proxy, or None while no attempt has needed one."""
        return self._proxy

    def open_attempt(
        self,
        resources: NamedResources,
        parent: Context,
        tracer: trace.Tracer,
        *,
        rollout_id: str = "",
        mode: str | None = None,
        resources_id: str | None = None,
    ) -> tuple[NamedResources, AttemptCapture | None]:
        """:meth:`CaptureProxy.open_attempt`; with no http(s) LLM endpoint in ``resources``, what it would return
        (a copy: the cached resources are shared by every attempt) without starting the proxy, and no capture."""
        if not capturable(resources) and not self.serves_environment:
            return dict(resources), None
        proxy = self._started()
        return proxy.open_attempt(
            resources, parent, tracer, rollout_id=rollout_id, mode=mode, resources_id=resources_id
        )

    @property
    def serves_environment(self) -> bool:
        """Whether calls to ``$OPENAI_BASE_URL`` / ``$OPENAI_API_BASE`` are captured (the proxy then runs)."""
        return self._proxy is not None and self._proxy.serves_environment

    def serve_environment(self, concurrency: int) -> None:
        """Start the proxy now and capture calls to the URLs in ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE`` (see
        :meth:`CaptureProxy.serve_environment`), when either variable is set; else nothing is started."""
        from . import ambient

        if ambient.plan(ambient.environment()):
            self._started().serve_environment(concurrency)

    def _started(self) -> CaptureProxy:
        with self._lock:
            if self._proxy is None:
                from .proxy import CaptureProxy

                self._proxy = CaptureProxy(
                    self.host,
                    gate=self.gate,
                    switch_interval=self.switch_interval,
                    loop=self.loop,
                    in_memory=self.in_memory,
                    agents_loop=self.agents_loop,
                    agents_lag=self.agents_lag,
                    agents_busy_lag=self.agents_busy_lag,
                ).start()
            return self._proxy

    def stop(self) -> None:
        with self._lock:
            proxy, self._proxy = self._proxy, None
        if proxy is not None:
            proxy.stop()
