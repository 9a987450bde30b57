"""Which Redis a worker started by RQ's own CLI uses: RQ's ``--url``/``REDIS_URL`` against ``ROLLQ_REDIS_URL``.

Stock ``rq worker -w rollq.worker.RolloutWorker`` knows only RQ's ways of naming a Redis (``--url``,
``RQ_REDIS_URL``, ``REDIS_URL``, else localhost:6379), while every ``rollq`` command reads ``ROLLQ_REDIS_URL``.
This module reconciles the two: it lends ``ROLLQ_REDIS_URL`` to RQ's CLI before RQ builds its client, it teaches
RQ's CLI the URL forms redis-py's ``Redis.from_url`` refuses (``redis+sentinel://``, ``redis+cluster://``), and it
refuses to start a worker that was given one Redis by RQ's options and another by rollq's. URL forms themselves
(schemes, Sentinel, TLS) are :mod:`rollq.store.connection`'s; this module only knows RQ's CLI conventions.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any
from urllib.parse import urlsplit

from redis.sentinel import SentinelConnectionPool

from rollq.store.cluster import SCHEME as CLUSTER_SCHEME
from rollq.store.cluster import SlotConnectionPool
from rollq.store.connection import connect, describe, describe_client, wait_out_refusals, wait_until_reachable
from rollq.store.jobs import rq_suspended_key
from rollq.store.settings import environ

log = logging.getLogger(__name__)

RQ_DEFAULT_SERVER = ("localhost", 6379, 0, None)
"""(host, port, db, password) of the client RQ's CLI builds when given no URL at all."""


def lend_rollq_url_to_rq_cli() -> None:
    """Let stock ``rq worker -w rollq.worker.RolloutWorker`` without ``--url`` use ``ROLLQ_REDIS_URL``.

    RQ's CLI imports the ``-w`` class before it builds its client, and with no
    ``--url`` / ``RQ_REDIS_URL`` / ``--config`` it reads ``REDIS_URL`` from the
    environment at that point: setting it here (only in an ``rq`` process, only
    when unset) points RQ's own start-up checks and the worker at the same Redis
    as every ``rollq`` command, instead of localhost. Called when
    :mod:`rollq.worker.rq_worker` is imported.
    """
    wanted = environ().get("ROLLQ_REDIS_URL")
    if wanted and os.path.basename(sys.argv[0]) == "rq" and "REDIS_URL" not in os.environ:
        os.environ["REDIS_URL"] = wanted


def rq_cli_url(argv: list[str] | None = None) -> str | None:
    """The Redis URL RQ's CLI will use in this process, as it decides it: ``--url``/``-u``, ``RQ_REDIS_URL``,
    ``REDIS_URL`` (None: its default, localhost:6379). A ``--config`` module's own REDIS_URL is not read."""
    args = sys.argv[1:] if argv is None else argv
    for i, arg in enumerate(args):
        if arg in ("--url", "-u") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--url="):
            return arg.split("=", 1)[1]
    return os.environ.get("RQ_REDIS_URL") or os.environ.get("REDIS_URL")


def in_rq_cli() -> bool:
    """Whether this process is RQ's own ``rq worker`` command."""
    return os.path.basename(sys.argv[0]) == "rq" and "worker" in sys.argv[1:]


def wait_for_redis_in_rq_cli() -> None:
    """In a stock ``rq worker -w rollq.worker.RolloutWorker`` process, wait (bounded by
    ``ROLLQ_REDIS_WAIT_SECONDS``, logged) for the Redis RQ's CLI is about to use: RQ's CLI exits at once (rc 1)
    when its first command fails, so a worker started before Redis, or during a failover, would die. Runs when
    :mod:`rollq.worker.rq_worker` is imported, which RQ's CLI does before it touches Redis. A Redis still down
    past the bound is left to RQ's own error."""
    if not in_rq_cli():
        return
    try:
        seconds = float(environ().get("ROLLQ_REDIS_WAIT_SECONDS") or 60)
    except ValueError:
        return  # WorkerSettings reports the bad value by name
    try:
        wait_until_reachable(rq_cli_url() or "redis://localhost:6379/0", seconds=seconds, what="rq worker")
    except Exception:  # noqa: BLE001  # RQ's CLI says what is wrong, as it would have
        return


CLI_OUTAGE_RETRIES = 3
"""Times RQ's CLI client retries a connection error in a row (redis-py's default client's count) before RQ's own
error handling has it; refusals it waits out for ever."""

ROLLQ_ONLY_SCHEMES = frozenset({"redis+sentinel", CLUSTER_SCHEME})
"""URL schemes rollq's :func:`~rollq.store.connection.connect` speaks and redis-py's ``Redis.from_url`` refuses."""


def _url_rq_cli_would_use(config: Any) -> str | None:
    """The URL RQ 2.12's ``CliConfig.connection`` would hand to ``from_url``: ``--url``/``RQ_REDIS_URL``, else the
    ``-c`` module's ``REDIS_URL``, else the environment's ``REDIS_URL`` (None: RQ builds its client otherwise)."""
    if config.url:
        return str(config.url)
    if config.config:
        from rq.cli.helpers import read_config_file

        url = read_config_file(config.config).get("REDIS_URL")
        return str(url) if url else None
    return os.environ.get("REDIS_URL")


def teach_rq_cli_rollq_urls() -> None:
    """Let stock ``rq worker -w rollq.worker.RolloutWorker --url redis+sentinel://...`` start.

    RQ's CLI builds its client with ``connection_class.from_url(url)`` (``redis.Redis`` unless
    ``--connection-class``), and redis-py's parser refuses ``redis+sentinel://`` with a ``ValueError`` before any
    rollq code could look at the client. RQ imports the ``-w`` class before it builds that client, so this
    (called when :mod:`rollq.worker.rq_worker` is imported) wraps RQ's ``CliConfig.connection`` property: a URL of
    a scheme in :data:`ROLLQ_ONLY_SCHEMES`, from ``--url``, ``RQ_REDIS_URL``, a ``-c`` module's ``REDIS_URL`` or
    ``REDIS_URL``, is built by :func:`rollq.store.connection.connect`, for the plain ``redis.Redis`` class only;
    every other URL goes to RQ's code unchanged. For a ``redis+cluster://`` client the CLI's start-up check of
    ``rq:suspended`` reads the namespace's own flag instead (see rollq.store.keys). It does nothing unless RQ's
    CLI is loaded (an ``rq`` process), and the wrap is pinned by ``tests/store/test_sentinel_url.py`` against RQ's
    real CLI.

    In an ``rq worker`` process the client it hands out waits out commands Redis refuses for now (OOM, READONLY:
    :func:`~rollq.store.connection.wait_out_refusals`, one log line), for ever: RQ's CLI sends its first command
    (``is_suspended``, a ``MULTI``) before the worker class exists, and a full Redis refuses it, so a worker
    started into a full Redis exited at once (rc 1). Outages keep RQ's own bound (:data:`CLI_OUTAGE_RETRIES`, after
    :func:`wait_for_redis_in_rq_cli`'s wait); the worker makes its client wait those out too once it is built.
    """
    helpers = sys.modules.get("rq.cli.helpers")
    if helpers is None:
        return
    import redis

    original = helpers.CliConfig.connection
    if getattr(original.fget, "rollq_urls", False):
        return

    def connection(self: Any) -> Any:
        if getattr(self, "_connection", None) is not None:
            return original.fget(self)
        if self.connection_class is redis.Redis:
            url = _url_rq_cli_would_use(self)
            if url and urlsplit(url).scheme in ROLLQ_ONLY_SCHEMES:
                self._connection = connect(url)
        client = original.fget(self)
        if in_rq_cli() and isinstance(client, redis.Redis):
            wait_out_refusals(client, outage_retries=CLI_OUTAGE_RETRIES)
        return client

    connection.rollq_urls = True  # type: ignore[attr-defined]
    helpers.CliConfig.connection = property(connection, doc=original.__doc__)
    workers = sys.modules.get("rq.cli.workers")
    if workers is not None:
        rq_is_suspended = workers.is_suspended

        def is_suspended(connection: Any, worker: Any = None) -> Any:
            # RQ's CLI checks the global rq:suspended before it starts a worker: on a cluster, another slot's key.
            pool = getattr(connection, "connection_pool", None)
            if worker is None and isinstance(pool, SlotConnectionPool):
                return connection.exists(rq_suspended_key("{" + pool.slot_owner.tag + "}"))
            return rq_is_suspended(connection, worker)

        workers.is_suspended = is_suspended  # type: ignore[attr-defined]


def server_of(client: Any) -> tuple[Any, ...]:
    """(host or socket path, port, db, password) of a redis-py client: what tells two clients' servers apart.

    For a Sentinel-managed client, the host is (Sentinels, service name): the primary it reaches changes on a
    failover, the service does not.
    """
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if isinstance(pool, SentinelConnectionPool):
        sentinels = tuple(
            sorted(
                (s.connection_pool.connection_kwargs.get("host"), s.connection_pool.connection_kwargs.get("port"))
                for s in pool.sentinel_manager.sentinels
            )
        )
        return ((sentinels, pool.service_name), None, int(kwargs.get("db") or 0), kwargs.get("password"))
    if isinstance(pool, SlotConnectionPool):  # the primary changes on a failover; the seeds and the tag do not
        owner = pool.slot_owner
        return ((tuple(sorted(owner.seeds)), owner.tag), None, 0, kwargs.get("password"))
    return (
        kwargs.get("path") or kwargs.get("host"),
        kwargs.get("port"),
        int(kwargs.get("db") or 0),
        kwargs.get("password"),
    )


def honour_rollq_url(connection: Any) -> Any:
    """The client to use given ``ROLLQ_REDIS_URL``: stock ``rq worker`` knows only ``--url``/``REDIS_URL``.

    Without either, RQ connects to localhost:6379 while ``rollq`` commands use
    ``ROLLQ_REDIS_URL``: the worker would wait for ever on another Redis. So a
    worker on RQ's default honours ``ROLLQ_REDIS_URL``, and one given another
    Redis explicitly refuses to start (``ValueError``) rather than guess.
    """
    wanted = environ().get("ROLLQ_REDIS_URL")
    if not wanted or not hasattr(connection, "connection_pool") or type(connection).__module__.startswith("fakeredis"):
        return connection
    target = connect(wanted)
    if not hasattr(target, "connection_pool") or type(target).__module__.startswith("fakeredis"):
        raise ValueError(f"ROLLQ_REDIS_URL={describe(wanted)} is in-process only; a worker needs a Redis server")
    current = server_of(connection)
    if current == server_of(target):
        return connection
    explicit = (
        os.environ.get("RQ_REDIS_URL")
        or os.environ.get("REDIS_URL", wanted) != wanted
        or any(a in ("--url", "-u") or a.startswith("--url=") for a in sys.argv)
    )
    if current == RQ_DEFAULT_SERVER and not explicit:
        log.info("no --url given: using ROLLQ_REDIS_URL (%s)", describe(wanted))
        return target
    raise ValueError(
        f"this worker was given Redis {describe_client(connection)} but ROLLQ_REDIS_URL is {describe(wanted)}: "
        "pass the same URL to both (or unset ROLLQ_REDIS_URL)"
    )
