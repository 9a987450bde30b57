"""``rollq serve-al``: Agent Lightning 0.1's HTTP endpoints for existing AL clients."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging

import click

from rollq.models.click_types import Seconds
from rollq.models.policy import MAX_POLICY_SECONDS
from rollq.store.connection import connect
from rollq.store.settings import Settings

from .gateway_options import client_limits


@click.command("serve-al")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (not loopback: needs --key).")
@click.option(
    "--port", "-p", default=8000, show_default=True, type=click.IntRange(min=0, max=65535), help="Port to listen on."
)
@click.option(
    "--lease",
    "lease_seconds",
    default=300.0,
    show_default=True,
    type=Seconds(1.0, MAX_POLICY_SECONDS),
    help="Seconds a handed-out attempt is heartbeated for (capped by the task's timeout_seconds); "
    "a client silent longer loses it to a retry after unresponsive_seconds.",
)
@click.option(
    "--key",
    envvar="ROLLQ_AL_KEY",
    default="",
    help="Bearer key every route requires (Authorization: Bearer or x-api-key) [env: ROLLQ_AL_KEY]; "
    "empty: none, allowed on loopback only.",
)
@client_limits(unfinished="Unposted", past_the_limit="its polls get no task", what="task")
@click.option(
    "--heartbeat",
    "heartbeat_seconds",
    default=5.0,
    show_default=True,
    type=Seconds(0, MAX_POLICY_SECONDS, min_open=True),
    hidden=True,
)
@click.pass_context
def serve_al(
    ctx: click.Context,
    host: str,
    port: int,
    lease_seconds: float,
    key: str,
    max_releases: int,
    max_held_per_client: int,
    max_body_bytes: int | None,
    heartbeat_seconds: float,
) -> None:
    """Serve Agent Lightning 0.1's worker endpoints (GET /task, GET /resources/..., POST /rollout) on rollq.

    Unmodified AL 0.1 clients (Trainer(...).fit(agent, "http://HOST:PORT/")) then pull this
    namespace's tasks. The id a client sees is <rollout_id>#<attempt>; a late result from an
    attempt that was superseded is recorded, never delivered.

    Without --key it serves loopback only: it refuses another --host, as anyone who reaches it could post
    rewards. Each handed-out id carries a token; a post without its attempt's token is refused (403).
    """
    from .binding import refusal
    from .gateway import Gateway
    from .http import Server

    refused = refusal(host, key, "pass --key (or set ROLLQ_AL_KEY)")
    if refused:
        raise click.UsageError(refused)
    root = ctx.find_root().params
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    found = ctx.find_root().obj
    per_job = (found if isinstance(found, Settings) else Settings()).tasks_per_job
    if per_job > 1:
        logging.getLogger(__name__).warning(
            "ROLLQ_TASKS_PER_JOB=%d: serve-al runs jobs of one task and splits every pack it takes into jobs of one "
            "task, which costs more than queueing them so; give the producers feeding it tasks_per_job=1",
            per_job,
        )
    gateway = Gateway(
        connect(root["url"]),
        root["namespace"],
        lease_seconds=lease_seconds,
        heartbeat_seconds=heartbeat_seconds,
        max_releases=max_releases,
        max_held_per_client=max_held_per_client,
    )
    server = Server(gateway, host, port, key=key, max_body_bytes=max_body_bytes)

    async def run() -> None:
        await server.start()
        click.echo(f"rollq serve-al: http://{host}:{port}/ -> namespace {root['namespace']!r}", err=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run())
    except OSError as exc:  # a busy port: one line, not a 47-line traceback
        if exc.errno != errno.EADDRINUSE:
            raise
        raise click.ClickException(
            f"port {port} on {host} is already in use: stop what listens there or pass --port"
        ) from None
