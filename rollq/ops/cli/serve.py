"""``rollq dashboard`` and ``rollq metrics``: long-running HTTP servers over a namespace (``rollq serve-al`` is
:mod:`rollq.compat.serve_al`'s)."""

from __future__ import annotations

import click

from rollq.store.connection import describe, resolve_url

from ..access import DASHBOARD_EXPOSES, TOKEN_ENV, check_bind, port_in_use, require_token
from . import context
from .errors import one_line_errors

TOKEN_HELP = (
    f"Require this token (basic auth password, or Authorization: Bearer) [env: {TOKEN_ENV}]. Without one only a "
    "loopback --bind is allowed."
)


@click.command()
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9181, show_default=True, type=click.IntRange(min=0, max=65535))
@click.option("--threads", default=8, show_default=True, help="Request threads of the WSGI server (waitress).")
@click.option("--token", envvar=TOKEN_ENV, default="", show_default=False, help=TOKEN_HELP)
@click.pass_context
@one_line_errors
def dashboard(ctx: click.Context, bind: str, port: int, threads: int, token: str) -> None:
    """Serve rq-dashboard, rollq's rollout pages (/rollq/) and /metrics (needs rollq[dashboard]).

    Refuses to start when Redis does not answer, or on a non-loopback --bind without a token.
    """
    from rollq.ops.dashboard import serve

    token = token or context.settings(ctx).dashboard_token
    check_bind(bind, token, "the dashboard", DASHBOARD_EXPOSES)
    serve(context.redis_url(ctx), context.namespace(ctx), bind=bind, port=port, threads=threads, token=token)


@click.command()
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9182, show_default=True, type=click.IntRange(min=0, max=65535))
@click.option("--token", envvar=TOKEN_ENV, default="", show_default=False, help=TOKEN_HELP)
@click.pass_context
@one_line_errors
def metrics(ctx: click.Context, bind: str, port: int, token: str) -> None:
    """Serve the namespace's metrics on http://BIND:PORT/metrics for Prometheus to scrape, until Ctrl+C."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer

    from rollq.ops.metrics import metrics_app, scrape_connection
    from rollq.ops.status import snapshot
    from rollq.store.keys import Keys

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002  # the base class's name
            pass

    token = token or context.settings(ctx).dashboard_token
    check_bind(bind, token, "/metrics", "read how your runs go (counts, rewards, workers, queue depths)")
    url = context.redis_url(ctx)
    connection, keys = scrape_connection(url), Keys(context.namespace(ctx))
    app = require_token(metrics_app(lambda: snapshot(connection, keys)), token)
    try:
        server = make_server(bind, port, app, ThreadingWSGIServer, handler_class=QuietHandler)
    except OSError as exc:
        raise port_in_use(exc, bind, port) or exc from None
    click.echo(
        f"rollq metrics for {keys.namespace!r} in {describe(resolve_url(url))} "
        f"on http://{bind}:{port}/metrics" + (", token required" if token else ""),
        err=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
