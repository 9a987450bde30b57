"""The Agent Lightning 0.1 server facade drives an APO-like loop over real rollq workers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from rollq.compat.agentlightning import AgentLightningServer
from rollq.models.contract import Rollout
from tests.support.al_shaped import PromptTemplate
from tests.support.servers import free_port

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.al_shaped:PromptAgent", "ROLLQ_GRACE_SECONDS": "0", "ROLLQ_CONCURRENCY": "4"}


async def apo_round(server: AgentLightningServer, prompt: str, samples: int) -> list[Rollout]:
    """What AL 0.1's APO example does per candidate prompt, against AL 0.1's server API."""
    resources_id = await server.update_resources({"system_prompt": PromptTemplate(template=prompt, engine="f-string")})
    ids = [
        await server.queue_task(sample={"want": prompt[:2]}, mode="train", resources_id=resources_id)
        for _ in range(samples)
    ]
    rollouts = [await server.poll_completed_rollout(rid, timeout=30) for rid in ids]
    assert all(r is not None for r in rollouts)
    return [r for r in rollouts if r is not None]


def test_an_apo_style_loop_runs_on_the_facade_with_rollq_workers(redis_server, namespace, workers) -> None:
    async def main() -> None:
        server = AgentLightningServer(url=redis_server.url, namespace=namespace, serve_http=False)
        with pytest.raises(RuntimeError, match="not be running"):
            await server.queue_task({"want": "v0"})
        await server.start()
        assert server.startup_event.is_set() and server.loop is asyncio.get_running_loop()
        workers(redis_server.url, namespace, env=AGENT)
        try:
            for prompt in ("v1: {q}", "v2: {q}"):
                rollouts = await apo_round(server, prompt, samples=5)
                assert [r.final_reward for r in rollouts] == [1.0] * 5
            # Handed out once, as AL's server popped them.
            assert await server.retrieve_completed_rollouts() == []
            extra = await server.queue_task({"want": "v2"}, mode="val")
            assert await server.get_completed_rollout("never-queued") is None
            rollouts = []
            for _ in range(100):
                rollouts = await server.retrieve_completed_rollouts()
                if rollouts:
                    break
                await asyncio.sleep(0.1)
            assert [r.rollout_id for r in rollouts] == [extra]
            assert await server.get_completed_rollout(extra) is None
        finally:
            await server.stop()
        assert not server.startup_event.is_set()

    asyncio.run(main())


def test_the_verl_daemon_pattern_runs_the_facade_on_a_thread_of_its_own(redis_server, namespace, workers) -> None:
    # AL 0.1's VERL daemon: asyncio.run(server.run_forever()) on a thread, startup_event.wait(), then coroutines
    # sent to server.loop with run_coroutine_threadsafe; its HTTP endpoints answer meanwhile.
    port = free_port()
    server = AgentLightningServer(host="127.0.0.1", port=port, url=redis_server.url, namespace=namespace)
    thread = threading.Thread(target=lambda: asyncio.run(server.run_forever()), daemon=True)
    thread.start()
    assert server.startup_event.wait(timeout=20)

    def call(coro: Any) -> Any:
        assert server.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, server.loop).result(timeout=30)

    resources_id = call(server.update_resources({"system_prompt": PromptTemplate(template="v9 {q}", engine="jinja")}))
    with urllib.request.urlopen(f"{server.endpoint}/resources/latest", timeout=10) as response:
        assert json.loads(response.read())["resources_id"] == resources_id
    ids = {call(server.queue_task({"want": "v9"}, mode="train")) for _ in range(6)}
    workers(redis_server.url, namespace, env=AGENT)
    got: list[Rollout] = []
    deadline = time.monotonic() + 60
    while len(got) < len(ids) and time.monotonic() < deadline:
        got += call(server.retrieve_completed_rollouts())
        time.sleep(0.2)
    assert {r.rollout_id for r in got} == ids and {r.final_reward for r in got} == {1.0}
    call(server.stop())
    thread.join(timeout=10)
    assert not thread.is_alive()
