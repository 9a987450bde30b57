"""``AgentLightningServer``: Agent Lightning 0.1's trainer-side server API, backed by rollq.

An AL 0.1-era trainer (its APO example, its VERL daemon's server use) changes one import::

    from rollq.compat.agentlightning import AgentLightningServer   # was: from agentlightning.server import ...

    server = AgentLightningServer(host="127.0.0.1", port=9997, url="redis://redis:6379/0", namespace="apo")
    await server.start()
    resources_id = await server.update_resources({"system_prompt": PromptTemplate(...)})
    rollout_id = await server.queue_task(sample, mode="train", resources_id=resources_id)
    rollout = await server.poll_completed_rollout(rollout_id, timeout=60)

Tasks go on rollq's queue, so rollq workers (``rq worker -w rollq.worker.RolloutWorker``)
run them; with ``serve_http=True`` (the default, as AL's server always served) AL 0.1
clients can pull them from ``http://host:port/`` too (see :mod:`rollq.compat.gateway`).

Differences from AL 0.1, all on the safe side: a task runs at most ``max_attempts`` times
and a late result of a superseded attempt is never delivered; ``update_resources``
returns rollq's version ids (``v1``, ``v2``, ...); "completed rollouts" are those of the
tasks this server object queued (AL kept them in its process; rollq keeps them in Redis),
each handed out once by ``get_completed_rollout``/``poll_completed_rollout``/
``retrieve_completed_rollouts``, as AL's did.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Literal

from rollq.models.contract import Rollout
from rollq.models.errors import UnknownTaskError
from rollq.models.policy import RolloutPolicy
from rollq.producer.aio import AsyncProducer
from rollq.producer.producer import Producer
from rollq.store.connection import connect, connect_async
from rollq.store.keys import DEFAULT_NAMESPACE

log = logging.getLogger(__name__)

__all__ = ["AgentLightningServer"]


class AgentLightningServer:
    """AL 0.1's ``agentlightning.server.AgentLightningServer`` API over a rollq namespace.

    ``task_timeout_seconds`` becomes the tasks' ``RolloutPolicy.timeout_seconds``; pass
    ``policy`` for the rest of rollq's policy. ``url``/``namespace`` say where the queue is.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8000,
        task_timeout_seconds: float = 300.0,
        *,
        url: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        policy: RolloutPolicy | None = None,
        serve_http: bool = True,
        lease_seconds: float = 300.0,
    ) -> None:
        self.host = host
        self.port = port
        self.endpoint = f"http://{host}:{port}"
        self.url = url
        self.namespace = namespace
        self.policy = (policy or RolloutPolicy()).model_copy(update={"timeout_seconds": task_timeout_seconds})
        self.serve_http = serve_http
        self.lease_seconds = lease_seconds
        self.loop: asyncio.AbstractEventLoop | None = None
        self.startup_event = threading.Event()
        self.producer: AsyncProducer | None = None
        self._http: Any = None
        self._queued: set[str] = set()  # queued here and not handed out yet
        self._stopped: asyncio.Event | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to Redis and, with ``serve_http``, serve AL 0.1's client endpoints on ``host:port``."""
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        sync = Producer(connect(self.url), self.namespace, policy=self.policy)
        self.producer = AsyncProducer(connect_async(self.url), sync)
        if self.serve_http:
            from .gateway import Gateway
            from .http import Server

            gateway = Gateway(connect(self.url), self.namespace, lease_seconds=self.lease_seconds)
            self._http = Server(gateway, self.host, self.port)
            await self._http.start()
        self.startup_event.set()
        log.info("AgentLightningServer on rollq namespace %r (%s)", self.namespace, self.endpoint)

    async def stop(self) -> None:
        """Stop serving and close the connections (queued tasks stay queued in Redis)."""
        if self._http is not None:
            await self._http.stop()
            self._http = None
        if self.producer is not None:
            await self.producer.aclose()
            self.producer = None
        if self._stopped is not None:
            self._stopped.set()
        self.startup_event.clear()
        self.loop = None

    async def run_forever(self) -> None:
        """Start, then serve until :meth:`stop` is called from another task."""
        await self.start()
        assert self._stopped is not None
        await self._stopped.wait()

    def _started(self) -> AsyncProducer:
        if self.producer is None:
            raise RuntimeError("Store not initialized. The server may not be running.")
        return self.producer

    # -- the trainer's verbs -------------------------------------------------------------

    async def queue_task(
        self,
        sample: Any,
        mode: Literal["train", "val", "test"] | None = None,
        resources_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Queue one task; returns its rollout id."""
        task = await self._started().enqueue(sample, mode=mode, resources_id=resources_id, metadata=metadata)
        self._queued.add(task.rollout_id)
        return task.rollout_id

    async def update_resources(self, resources: Any) -> str:
        """Publish a new resources version (AL's or rollq's LLM/PromptTemplate, or dicts) and make it the latest."""
        return await self._started().update_resources(resources)

    async def get_completed_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout of ``rollout_id`` if it finished and was not handed out yet, else None (non-blocking)."""
        if rollout_id not in self._queued:
            return None
        try:
            rollout = await self._started().get_rollout(rollout_id)
        except UnknownTaskError:
            return None
        if rollout is not None:
            self._queued.discard(rollout_id)
        return rollout

    async def poll_completed_rollout(self, rollout_id: str, timeout: float | None = None) -> Rollout | None:
        """Wait up to ``timeout`` seconds (None: forever) for the rollout of ``rollout_id``; None on timeout."""
        if rollout_id not in self._queued:
            return None
        producer = self._started()
        while True:
            result = await producer.wait([rollout_id], timeout=60.0 if timeout is None else timeout, partial=True)
            if result.finished:
                self._queued.discard(rollout_id)
                return result.finished[0]
            if timeout is not None:
                return None

    async def retrieve_completed_rollouts(self) -> list[Rollout]:
        """Every finished rollout of the tasks queued here that was not handed out yet."""
        found = await self._started().get_rollouts(sorted(self._queued))
        self._queued.difference_update(found)
        return list(found.values())
