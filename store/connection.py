"""One way to get a Redis client, for the producer, the workers and the CLI.

URLs: ``redis://[:password@]host:port/db``, ``rediss://`` for TLS (``?ssl_cert_reqs=...``
and friends pass through to redis-py), ``unix:///path/redis.sock?password=...``, and
``memory://[name]`` for an in-process fake Redis (fakeredis) shared by every client
of that name in the process. With no URL, ``ROLLQ_REDIS_URL`` is used, then
``REDIS_URL``, then ``memory://``.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any
from urllib.parse import urlsplit

import fakeredis
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

_MEMORY_SERVERS: dict[str, fakeredis.FakeServer] = {}
_MEMORY_LOCK = threading.Lock()

# redis-py's default read timeout (5 s) would cut blocking reads short; rollq
# blocks for at most a few seconds at a time, so 30 s only catches dead peers.
_SOCKET_TIMEOUT_SECONDS = 30.0
# Enough attempts to ride out a Redis restart or failover (about 20 s in all);
# the worker's own loop keeps retrying beyond that.
_RETRIES = 12
_BACKOFF_CAP_SECONDS = 2.0


class _Retry(Retry):
    """Retry connection errors with backoff, but not a refused password.

    redis-py files AuthenticationError under ConnectionError; waiting will not
    fix a wrong password, so the caller hears at once instead of after ~20 s.
    """

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False) -> Any:
        def retryable(error: Exception) -> bool:
            return not isinstance(error, redis.AuthenticationError) and (is_retryable is None or is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def resolve_url(url: str | None = None) -> str:
    """The URL to use: the one given, else ``ROLLQ_REDIS_URL``, ``REDIS_URL``, ``memory://``."""
    return url or os.environ.get("ROLLQ_REDIS_URL") or os.environ.get("REDIS_URL") or "memory://"


def memory_server(name: str = "") -> fakeredis.FakeServer:
    """The process-wide fake server behind ``memory://name``."""
    with _MEMORY_LOCK:
        if name not in _MEMORY_SERVERS:
            _MEMORY_SERVERS[name] = fakeredis.FakeServer(version=(7, 0))
        return _MEMORY_SERVERS[name]


def retry_policy(retries: int = _RETRIES) -> Retry:
    """Backoff (capped at 2 s) on connection errors and timeouts, not on a refused password.

    ``retries=-1`` retries until Redis answers.
    """
    return _Retry(ExponentialBackoff(cap=_BACKOFF_CAP_SECONDS, base=0.05), retries)


def connect(url: str | None = None, *, retries: int = _RETRIES) -> redis.Redis:
    """A client for ``url`` (see the module docstring), retrying with backoff on connection errors.

    ``retries`` defaults to riding out a restart (about 20 s); a command-line
    tool that should answer at once passes fewer. Replies are bytes, as RQ requires.
    """
    url = resolve_url(url)
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return fakeredis.FakeRedis(server=memory_server(urlsplit(url).netloc))
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"unsupported Redis URL scheme {scheme!r} in {describe(url)!r}: use redis://, rediss://, unix:// or memory://"
        )
    # TCP keepalive is a TCP socket option; redis-py's unix socket connection refuses it.
    tcp_only = {} if scheme == "unix" else {"socket_keepalive": True}
    return redis.Redis.from_url(
        url,
        retry=retry_policy(retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        socket_timeout=_SOCKET_TIMEOUT_SECONDS,
        socket_connect_timeout=5.0,
        health_check_interval=30,
        **tcp_only,
    )


def describe(url: str) -> str:
    """``url`` with any password replaced by ``***``, for logs and error messages."""
    password = urlsplit(url).password
    if password is not None:
        url = url.replace(":" + password + "@", ":***@", 1)
    # unix:// URLs carry the password as a query parameter.
    return re.sub(r"([?&])password=[^&#]*", r"\1password=***", url)
