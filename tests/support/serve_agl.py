"""``serve-agl`` on a thread of the test process, and the moves AL 1.0.2's controller makes against it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from rollq.compat.agl1.app import Server
from rollq.compat.agl1.store import Agl1Store
from tests.support.servers import free_port

KEY = "sekret"
MODEL = "served/model"


class Running:
    """A serve-agl app on a thread of the test process."""

    def __init__(self, store: Agl1Store, key: str = KEY, **options: Any) -> None:
        self.port = free_port()
        self.server = Server(store, "127.0.0.1", self.port, key, **options)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            self.loop.run_until_complete(self.server.start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(10)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", headers={"Authorization": f"Bearer {key}"})

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.client.close()


def create(api: Running, *items: dict[str, Any]) -> list[dict[str, Any]]:
    response = api.client.post("/api/rollouts", json=list(items))
    assert response.status_code == 201, response.text
    return list(response.json())


def listed(api: Running, rollout_id: str) -> str:
    """The id ``rollout_id`` is listed with (carrying its attempt's token), as AL's controller reads it."""
    found = api.client.get("/api/rollouts", params=[("state_in", "queuing"), ("state_in", "running")]).json()
    (listed,) = [r["rollout_id"] for r in found if r["rollout_id"].rpartition(".")[0] == rollout_id]
    return str(listed)


def claim(api: Running, rollout_id: str) -> str:
    """Claim ``rollout_id`` as AL's controller does (PATCH running with its listed id); the id to use from then."""
    listed_id = listed(api, rollout_id)
    running = api.client.patch(
        f"/api/rollouts/{listed_id}", json={"status": {"state": "running", "last_attempt_id": "0"}}
    )
    assert running.status_code == 200, running.text
    return listed_id
