"""Issue 26, case 4: an enqueue acknowledged while the replica lags is on the replica, so the primary dying
cannot lose it. Real redis-servers: a primary, and a replica that follows it through bench/delay_proxy.py (the
replication link of a replica in another zone; the delay is set while the test runs)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollq.producer.producer import Producer
from rollq.store.connection import connect
from tests.support.servers import REPO, RedisServer, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis


class LaggingPair:
    """A primary and a replica whose replication link is delayed by ``set_rtt_ms`` (a TCP proxy in between)."""

    def __init__(self, directory: Path) -> None:
        (directory / "primary").mkdir()
        (directory / "replica").mkdir()
        self.rtt_file = directory / "rtt"
        self.rtt_file.write_text("0 0")
        self.primary = RedisServer(directory / "primary").start()
        listen = free_port()
        self.proxy = subprocess.Popen(
            [sys.executable, str(REPO / "bench" / "delay_proxy.py"), "--listen", f"127.0.0.1:{listen}"]
            + ["--upstream", f"127.0.0.1:{self.primary.port}", "--rtt-ms", "0", "--rtt-file", str(self.rtt_file)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.replica = RedisServer(directory / "replica", replica_of=listen).start()
        replica, primary = self.replica.client(), self.primary.client()
        wait_until(lambda: replica.info("replication")["master_link_status"] == "up", "the replica in sync")
        wait_until(lambda: bool(primary.set("rollq-warm", "1")) and primary.wait(1, 100) == 1, "a replica ack")

    def set_rtt_ms(self, rtt_ms: float) -> None:
        self.rtt_file.write_text(f"{rtt_ms} 0")
        time.sleep(0.5)  # the proxy reads the file four times a second

    def kill_primary_host(self) -> None:
        """SIGKILL the primary and its end of the link: what was still on the wire never reaches the replica."""
        assert self.primary.process is not None
        self.primary.process.kill()
        self.proxy.kill()
        self.primary.process.wait()
        self.proxy.wait()

    def stop(self) -> None:
        if self.proxy.poll() is None:
            self.proxy.kill()
            self.proxy.wait()
        self.replica.stop()
        self.primary.stop()


@pytest.fixture
def lagging(tmp_path: Path) -> Iterator[LaggingPair]:
    pair = LaggingPair(tmp_path)
    try:
        yield pair
    finally:
        pair.stop()


@pytest.mark.slow
def test_an_enqueue_acknowledged_while_the_replica_lags_survives_the_primarys_death(lagging: LaggingPair) -> None:
    # The replica is 1.5 s behind (each way), longer than the 300 ms WAIT timeout. Before: the WAIT fell short,
    # the shortfall was logged, and the enqueue returned as if held; the primary dying then lost the acknowledged
    # task (issue 26: 150 of them in a hostile run).
    producer = Producer(connect(lagging.primary.url), "lagging", wait_replicas=1, wait_timeout_ms=300)
    producer.enqueue({"warm": True})
    lagging.set_rtt_ms(3000)
    returned: list[float] = []

    def enqueue() -> None:
        producer.enqueue_many([{"q": 1}], rollout_ids=["acked-while-lagging"])
        returned.append(time.monotonic())

    started = time.monotonic()
    thread = threading.Thread(target=enqueue, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert returned, "the enqueue did not return within 30 s of a replica 1.5 s behind"
    lagging.kill_primary_host()  # at once: nothing the enqueue wrote has time to reach the replica later
    replica = lagging.replica.client()
    assert replica.exists(producer.keys.task("acked-while-lagging")) == 1, (
        f"an enqueue acknowledged after {returned[0] - started:.2f}s is not on the replica: a failover to it loses it"
    )
