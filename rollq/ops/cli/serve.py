"""``rollq dashboard`` and ``rollq metrics``: long-running HTTP servers over a namespace (``rollq serve-al`` is
:mod:`rollq.compat.serve_al`'s)."""

from __future__ import annotations

import click

from rollq.store.connection import describe, resolve_url

from . import context
from .errors import one_line_errors


@click.command()
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (keep it local; the dashboard has no auth).",
)
@click.option("--port", default=9181, show_default=True)
@click.option("--threads", default=8, show_default=True, help="Request threads of the WSGI server (waitress).")
@click.pass_context
@one_line_errors
def dashboard(ctx: click.Context, bind: str, port: int, threads: int) -> None:
    """Serve rq-dashboard, rollq's rollout pages (/rollq/) and /metrics (needs rollq[dashboard]).

    Refuses to start when Redis does not answer.
    """
    from rollq.ops.dashboard import serve

    serve(context.redis_url(ctx), context.namespace(ctx), bind=bind, port=port, threads=threads)


@click.command()
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9182, show_default=True)
@click.pass_context
@one_line_errors
def metrics(ctx: click.Context, bind: str, port: int) -> None:
    """Serve the namespace's metrics on http://BIND:PORT/metrics for Prometheus to scrape, until Ctrl+C."""
    from prometheus_client import start_http_server

    from rollq.ops.metrics import registry
    from rollq.ops.status import snapshot

    producer = context.producer(ctx)
    server, thread = start_http_server(
        port, addr=bind, registry=registry(lambda: snapshot(producer.connection, producer.keys))
    )
    click.echo(
        f"rollq metrics for {producer.namespace!r} in {describe(resolve_url(ctx.find_root().params['url']))} "
        f"on http://{bind}:{port}/metrics",
        err=True,
    )
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        server.shutdown()
