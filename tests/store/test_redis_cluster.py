"""A real Redis Cluster (3 primaries + 3 replicas started here): a namespace per shard, every key of a namespace in
its slot, one run spread over the shards and read as one, and a primary SIGKILLed under load losing nothing
acknowledged and delivering nothing twice (issue 25, point 4)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from rollq.producer import Producer, Shards
from rollq.store.cluster import cluster_url, spread_namespaces, tag_slot
from rollq.store.keys import Keys
from tests.support.binaries import require
from tests.support.servers import RedisServer, WorkerProcess, free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]

_AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}


def _require_cluster_tools() -> str:
    """redis-cli, for ``--cluster create``."""
    return require("redis-cli", "apt-get install redis-server, which ships it")


class Cluster:
    """Six cluster-enabled redis-servers of the test's own, joined as 3 primaries with a replica each."""

    def __init__(self, directory: Path) -> None:
        cli = _require_cluster_tools()
        self.nodes: list[RedisServer] = []
        for i in range(6):
            (directory / f"node-{i}").mkdir(parents=True)
            node = RedisServer(
                directory / f"node-{i}",
                extra=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(directory / f"node-{i}" / "nodes.conf"),
                    "--cluster-node-timeout",
                    "1000",
                    # Namespaces per shard are independent: the other shards keep serving while one fails over.
                    "--cluster-require-full-coverage",
                    "no",
                    # The bus port of its own (default: the port + 10000, past 65535 for a high free port).
                    "--cluster-port",
                    str(free_port()),
                ],
            )
            self.nodes.append(node)
            try:
                node.start()
            except RuntimeError as exc:  # e.g. a redis-server built without cluster support
                pytest.fail(f"a cluster-enabled redis-server did not start: {exc}")
        created = subprocess.run(
            [cli, "--cluster", "create", *self.addresses, "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            pytest.fail(f"redis-cli --cluster create failed: {created.stdout[-2000:]} {created.stderr[-2000:]}")
        for node in self.nodes:
            client = node.client()
            wait_until(lambda c=client: c.cluster("info")["cluster_state"] == "ok", "the cluster ok on every node", 30)
        # Every replica in sync, so that WAIT 1 counts it from the first write on.
        wait_until(lambda: sum(self._role(n) == "slave" for n in self.nodes) == 3, "3 replicas", 30)

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{n.port}" for n in self.nodes]

    @property
    def seeds(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    @staticmethod
    def _role(node: RedisServer) -> str:
        info = node.client().info("replication")
        if info["role"] == "slave" and info.get("master_link_status") != "up":
            return "syncing"
        return str(info["role"])

    def owner(self, tag: str) -> RedisServer:
        """The node that is the primary of ``{tag}``'s slot now."""
        slot = tag_slot(tag.strip("{}"))
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            for start, end, primary, *_ in node.client().execute_command("CLUSTER SLOTS"):
                if int(start) <= slot <= int(end):
                    port = int(primary[1])
                    return next(n for n in self.nodes if n.port == port)
        raise AssertionError(f"no node owns {tag}")

    def kill(self, node: RedisServer) -> None:
        assert node.process is not None
        node.process.send_signal(signal.SIGKILL)
        node.process.wait()
        node.process = None

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    servers = Cluster(tmp_path / "cluster")
    try:
        yield servers
    finally:
        servers.stop()


def _keys_on(node: RedisServer) -> list[str]:
    return [k.decode() for k in node.client().scan_iter(count=1000)]


def test_a_namespace_per_shard_keeps_every_key_in_its_slot_and_survives_a_primary_kill(
    cluster: Cluster, workers: Callable[..., WorkerProcess]
) -> None:
    names = spread_namespaces(cluster.seeds, f"t-{uuid.uuid4().hex[:8]}")
    assert len(names) == 3
    owners = [cluster.owner(n) for n in names]
    assert len({o.port for o in owners}) == 3, "one namespace per primary"
    urls = [cluster_url(cluster.seeds, n) for n in names]
    for url, name in zip(urls, names, strict=True):
        for _ in range(2):
            workers(url, name, env={**_AGENT, "ROLLQ_CONCURRENCY": "8"})
    shards = Shards.from_cluster(urls[0], names)
    assert all(p.lifecycle.wait_replicas == 1 for p in shards.producers), "acknowledged means replicated"

    # A first round with no failure: every key of a namespace, RQ's included, is in the namespace's slot.
    first = [t.rollout_id for _ in range(3) for t in shards.enqueue_many([{"sleep": 0.01}] * 20)]
    assert len(shards.wait(first, timeout=120)) == 60
    for name, owner in zip(names, owners, strict=True):
        slot = tag_slot(name.strip("{}"))
        keys = [k for k in _keys_on(owner) if name in k]
        assert any(k.startswith("rq:job:") for k in keys) and any(k.startswith("rq:worker:") for k in keys)
        assert {owner.client().cluster("keyslot", k) for k in keys} == {slot}
        assert Keys(name).rq_queues() in keys and Keys(name).rq_workers in keys
    for node in cluster.nodes:  # RQ's global keys exist nowhere: each namespace has its own
        assert not {"rq:queues", "rq:workers", "rq:suspended"} & set(_keys_on(node))

    # Under load: a producer keeps enqueueing over all three shards while the first namespace's primary dies.
    acknowledged: list[str] = list(first)
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            while not stop.is_set():
                acknowledged.extend(t.rollout_id for t in shards.enqueue_many([{"sleep": 0.05}] * 10))
        except BaseException as exc:  # noqa: BLE001  # reported by the test
            errors.append(exc)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    wait_until(lambda: len(acknowledged) >= 600, "600 tasks acknowledged", 120)
    victim = owners[0]
    cluster.kill(victim)
    killed_at = time.monotonic()
    wait_until(lambda: cluster.owner(names[0]).port != victim.port, "a replica promoted", 30)
    promoted_after = time.monotonic() - killed_at
    wait_until(lambda: len(acknowledged) >= 1200, "enqueueing going on after the failover", 120)
    stop.set()
    producer.join(60)
    assert not errors, errors

    # The trainer reads the three namespaces as one: every acknowledged task once, none twice.
    seen: dict[str, int] = {}
    for rollout in shards.rollouts("trainers", idle_timeout=15):
        seen[rollout.rollout_id] = seen.get(rollout.rollout_id, 0) + 1
        if len(seen) == len(set(acknowledged)) and set(seen) >= set(acknowledged):
            break
    lost = set(acknowledged) - set(seen)
    twice = {rid for rid, n in seen.items() if n > 1}
    print(
        f"promoted after {promoted_after:.1f}s; {len(acknowledged)} acknowledged, {len(lost)} lost, {len(twice)} twice"
    )
    assert not lost, f"{len(lost)} acknowledged tasks lost"
    assert not twice, f"{len(twice)} delivered twice"
    assert len(acknowledged) == len(set(acknowledged))
    statuses = {r.metadata["status"] for r in shards.wait(acknowledged[-50:], timeout=120)}
    assert statuses == {"succeeded"}


def test_a_key_outside_the_namespace_is_refused_not_retried(cluster: Cluster) -> None:
    (name,) = spread_namespaces(cluster.seeds, f"t-{uuid.uuid4().hex[:8]}", 1)
    producer = Producer.from_url(cluster_url(cluster.seeds, name), name)
    other = next(f"elsewhere-{i}" for i in range(1000) if tag_slot(f"elsewhere-{i}") != tag_slot(name.strip("{}")))
    slot_owner = cluster.owner(name)
    if cluster.owner("{" + other + "}").port == slot_owner.port:
        other = next(f"far-{i}" for i in range(10000) if cluster.owner("{" + f"far-{i}" + "}").port != slot_owner.port)
    started = time.monotonic()
    with pytest.raises(redis.exceptions.MovedError):
        producer.connection.get("{" + other + "}:x")
    assert time.monotonic() - started < 5
