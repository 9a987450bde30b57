"""One run over several shards (a namespace on each of several Redis servers) used as one (issue 25)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollq.models.errors import UnknownTaskError
from rollq.producer import Shards
from tests.support.servers import RedisServer, WorkerProcess

pytestmark = pytest.mark.redis


def test_a_run_spread_over_two_shards_is_queued_waited_for_and_read_as_one(
    own_redis: Callable[..., RedisServer], namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    servers = [own_redis(), own_redis()]
    shards = Shards.from_urls([s.url for s in servers], namespace)
    first = shards.enqueue_many([{"sleep": 0}] * 3)
    second = shards.enqueue_many([{"sleep": 0}] * 2)
    # Each call goes whole to one shard, in turn.
    assert [servers[0].client().exists(shards.producers[0].keys.task(t.rollout_id)) for t in first] == [1] * 3
    assert [servers[1].client().exists(shards.producers[1].keys.task(t.rollout_id)) for t in second] == [1] * 2
    for server in servers:
        workers(server.url, namespace, env={"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"})
    ids = [t.rollout_id for t in second + first]
    assert [r.rollout_id for r in shards.wait(ids, timeout=60)] == ids
    read = [r.rollout_id for r in shards.rollouts("trainers", idle_timeout=2)]
    assert sorted(read) == sorted(ids)
    # An id no shard holds.
    with pytest.raises(UnknownTaskError):
        Shards.from_urls([s.url for s in servers], namespace).shard_of("rollout-nowhere")
    # Found by asking, from a Shards object that did not queue it.
    assert Shards.from_urls([s.url for s in servers], namespace).shard_of(second[0].rollout_id) is not None
