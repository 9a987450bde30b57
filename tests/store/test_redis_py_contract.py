"""Pins what rollq/store/payloads.py's ``_SentAhead`` uses of redis-py beneath its documented client API.

The consumer-group readers send the next chunk's ``MGET`` on a connection of their own before its reply is wanted
(docs/internals.md, big payloads): they take a connection from the client's pool with ``get_connection()``, write the
command with ``send_command``, read later with ``read_response``, and give the connection back with ``release`` (after
``disconnect`` when a sent reply was never read). None of that is redis-py's documented client API. A redis-py upgrade
that changes it fails here, naming the call, instead of in a trainer's read loop.

When one fails: read the new redis-py code path, adapt ``_SentAhead`` (the one place that uses these), then this test.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator

import pytest
import redis

from rollq.store.connection import connect
from rollq.store.payloads import _SentAhead
from tests.support.servers import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture(params=["redis-server", "memory"])
def client(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[redis.Redis]:
    """rollq's own client (its retries and command packer), on a real server and on the embedded fake one."""
    url = redis_server.url if request.param == "redis-server" else f"memory://contract-{uuid.uuid4().hex}"
    client = connect(url)
    yield client
    client.close()


def test_a_pools_get_connection_still_takes_no_arguments() -> None:
    parameters = inspect.signature(redis.ConnectionPool.get_connection).parameters
    required = [
        p.name
        for p in parameters.values()
        if p.name != "self" and p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    assert required == []


def test_a_sent_mget_is_read_later_on_its_own_connection_in_key_order(client: redis.Redis) -> None:
    prefix = uuid.uuid4().hex
    keys = [f"{prefix}:{i}".encode() for i in range(3)]
    client.set(keys[0], b"zero")
    client.set(keys[2], b"two" * 10_000)
    ahead = _SentAhead(client)
    ahead.send(keys)
    client.set(keys[1], b"set after the send")  # the client's own connection is free meanwhile
    assert ahead.receive() == [b"zero", None, b"two" * 10_000]
    ahead.close()
    assert client.get(keys[1]) == b"set after the send"


def test_a_connection_given_back_with_an_unread_reply_does_not_hand_that_reply_to_the_next_command(
    client: redis.Redis,
) -> None:
    key = f"{uuid.uuid4().hex}:k".encode()
    client.set(key, b"stale")
    for _ in range(3):  # enough to take back whichever connection the pool hands out next
        ahead = _SentAhead(client)
        ahead.send([key])
        ahead.close()  # sent, never read
    client.set(key, b"fresh")
    pipe = client.pipeline(transaction=False)
    for _ in range(5):
        pipe.get(key)
    assert pipe.execute() == [b"fresh"] * 5
    assert client.mget([key, key]) == [b"fresh", b"fresh"]
