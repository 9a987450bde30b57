"""What a command takes from the global options (``--url``, ``--namespace``): the Redis to use, checked to answer,
and a producer on it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from urllib.parse import urlsplit

import click
from click.core import ParameterSource
from pydantic import ValidationError

from rollq.models.errors import RollqError
from rollq.producer import Producer
from rollq.store.connection import check_reachable, connect, describe
from rollq.store.settings import Settings

from .errors import validation_line

# The group's flags and the settings they override.
_FLAGS = {"url": "redis_url", "namespace": "namespace", "log_format": "log_format", "log_level": "log_level"}

log = logging.getLogger("rollq.cli")


def load_settings(ctx: click.Context) -> Settings:
    """rollq's settings for this run: the flags given on the command line or in the environment (click reads
    those), then ``.env`` (:class:`~rollq.store.settings.Settings`) for the rest; written back into the group's
    parameters so that every command reads one answer."""
    root = ctx.find_root()
    try:
        from_files = Settings()
    except ValidationError as exc:
        raise click.UsageError(f"invalid setting in the environment or .env: {validation_line(exc)}") from None
    given = {
        name: root.params[name]
        for name in _FLAGS
        if root.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)
    }
    settings = from_files.model_copy(update={_FLAGS[name]: value for name, value in given.items()})
    for name, field in _FLAGS.items():
        root.params[name] = getattr(settings, field)
    root.obj = settings
    return settings


def settings(ctx: click.Context) -> Settings:
    """The settings :func:`load_settings` made for this run."""
    found = ctx.find_root().obj
    return found if isinstance(found, Settings) else load_settings(ctx)


def refuse_or_warn_memory(ctx: click.Context, url: str) -> None:
    """memory:// is a Redis inside this one process: whatever a ``rollq`` process writes there is gone when it
    exits. ``enqueue`` there is refused (it reported "queued 4" into a Redis that vanished); other commands warn.
    Called in-process (``main()`` from Python, click's test runner) the memory server outlives the command and is
    left alone."""
    if urlsplit(url).scheme != "memory" or not _own_process():
        return
    command = ctx.command_path.removeprefix(ctx.find_root().command_path).strip() or "rollq"
    what = f"memory:// is a Redis inside this one `rollq {command}` process and is gone when it exits"
    if command == "enqueue":
        raise RollqError(f"{what}: tasks queued there would reach no worker; pass --url redis://... ")
    log.warning("%s; pass --url redis://... to use a shared Redis", what)


def _own_process() -> bool:
    """Whether this process is the ``rollq`` command itself (its console script or ``python -m rollq``)."""
    program = Path(sys.argv[0])
    return program.name == "rollq" or (program.name == "__main__.py" and program.parent.name == "rollq")


def redis_url(ctx: click.Context) -> str:
    """The Redis URL this run uses, after checking it answers (within the connect timeout, not minutes)."""
    url = check_reachable(ctx.find_root().params["url"])
    refuse_or_warn_memory(ctx, url)
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
