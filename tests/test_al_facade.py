"""The Agent Lightning 0.1 server facade drives an APO-like loop over real rollq workers."""

from __future__ import annotations

import asyncio

import pytest
from al_shaped import PromptTemplate

from rollq.compat.agentlightning import AgentLightningServer
from rollq.models.contract import Rollout

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.al_shaped:PromptAgent", "ROLLQ_GRACE_SECONDS": "0", "ROLLQ_CONCURRENCY": "4"}


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
