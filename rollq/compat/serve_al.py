"""``rollq serve-al``: Agent Lightning 0.1's HTTP endpoints for existing AL clients."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging

import click

from rollq.store.connection import connect


@click.command("serve-al")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", "-p", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--lease",
    "lease_seconds",
    default=300.0,
    show_default=True,
    type=float,
    help="Seconds a handed-out attempt is heartbeated for (capped by the task's timeout_seconds); "
    "a client silent longer loses it to a retry after unresponsive_seconds.",
)
@click.option("--heartbeat", "heartbeat_seconds", default=5.0, show_default=True, type=float, hidden=True)
@click.pass_context
def serve_al(ctx: click.Context, host: str, port: int, lease_seconds: float, heartbeat_seconds: float) -> None:
    """Serve Agent Lightning 0.1's worker endpoints (GET /task, GET /resources/..., POST /rollout) on rollq.

    Unmodified AL 0.1 clients (Trainer(...).fit(agent, "http://HOST:PORT/")) then pull this
    namespace's tasks. The id a client sees is <rollout_id>#<attempt>; a late result from an
    attempt that was superseded is recorded, never delivered.
    """
    from .gateway import Gateway
    from .http import Server

    root = ctx.find_root().params
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    gateway = Gateway(
        connect(root["url"]), root["namespace"], lease_seconds=lease_seconds, heartbeat_seconds=heartbeat_seconds
    )
    server = Server(gateway, host, port)

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
