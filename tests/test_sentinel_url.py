"""redis+sentinel:// URLs: parsed into a Sentinel-managed client of the named primary."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.sentinel import SentinelConnectionPool
from servers import RedisServer, free_port, require_redis_server

from rollq.store.connection import connect


def test_sentinel_url_names_the_sentinels_service_db_and_primary_password() -> None:
    client = connect("redis+sentinel://:s3cret@10.0.0.1:26380,10.0.0.2/rollq-primary/3")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "rollq-primary"
    assert pool.connection_kwargs["db"] == 3
    assert pool.connection_kwargs["password"] == "s3cret"
    sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(s["host"], s["port"]) for s in sentinels] == [("10.0.0.1", 26380), ("10.0.0.2", 26379)]
    assert client.get_retry() is not None  # the same retry policy as a redis:// client


@pytest.mark.parametrize(
    "url",
    ["redis+sentinel://h:26379/", "redis+sentinel://h:26379/svc/0/extra", "redis+sentinel://:26379/svc"],
)
def test_sentinel_url_without_a_service_or_host_is_rejected(url: str) -> None:
    with pytest.raises(ValueError, match="service_name"):
        connect(url)


@pytest.mark.redis
def test_sentinel_url_reaches_the_primary_its_sentinel_names(
    own_redis: Callable[..., RedisServer], tmp_path: Path
) -> None:
    primary = own_redis()
    port = free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nsentinel monitor rollq-test 127.0.0.1 {primary.port} 1\n"
    )
    sentinel = subprocess.Popen(
        [require_redis_server(), str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client = connect(f"redis+sentinel://127.0.0.1:{port}/rollq-test/0")
        client.set("rollq-sentinel-probe", "1")
        assert primary.client().get("rollq-sentinel-probe") == b"1"
    finally:
        sentinel.terminate()
        sentinel.wait(timeout=10)
