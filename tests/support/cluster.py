"""A real Redis Cluster of the test's own (3 primaries + 3 replicas) for the tests that run rollq against one;
the ``cluster`` fixture (tests/conftest.py) starts one per test."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from rollq.store.cluster import tag_slot
from tests.support.binaries import require
from tests.support.servers import RedisServer, free_port
from tests.support.waiting import wait_until


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
