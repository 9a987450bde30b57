"""What a command takes from the global options (``--url``, ``--namespace``): the Redis to use, checked to answer,
and a producer on it."""

from __future__ import annotations

import logging

import click

from rollq.producer import Producer
from rollq.store.connection import check_reachable, connect, describe

log = logging.getLogger("rollq.cli")


def redis_url(ctx: click.Context) -> str:
    """The Redis URL this run uses, after checking it answers (within the connect timeout, not minutes)."""
    url = check_reachable(ctx.find_root().params["url"])
    log.info("Redis at %s", describe(url))
    return url


def namespace(ctx: click.Context) -> str:
    """The namespace this run works in."""
    name: str = ctx.find_root().params["namespace"]
    return name


def producer(ctx: click.Context) -> Producer:
    """A producer on this run's Redis and namespace."""
    # One quick retry: someone at a terminal wants "Redis is down" now, not in 20 s.
    return Producer(connect(redis_url(ctx), retries=1), namespace(ctx))
