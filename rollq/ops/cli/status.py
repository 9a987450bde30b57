"""``rollq status``: the namespace at a glance, as text, JSON or Prometheus text, once or every few seconds."""

from __future__ import annotations

import json
import time

import click

from rollq.models.click_types import Seconds
from rollq.models.outcomes import describe
from rollq.store.keys import Keys
from rollq.store.namespaces import namespace_hint

from . import context
from .errors import one_line_errors


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--prometheus", is_flag=True, help="Prometheus text exposition format.")
@click.option(
    "--watch",
    type=Seconds(0, 86400, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Refresh every SECONDS until Ctrl+C; while Redis does not answer, say so and keep trying.",
)
@click.pass_context
@one_line_errors
def status(ctx: click.Context, as_json: bool, prometheus: bool, watch: float | None) -> None:
    """Queued, in flight by worker, finished, failed, dead-letter, stale attempts, stream lag, resources."""
    from rollq.ops.metrics import REDIS_UNAVAILABLE, render_prometheus, scrape_connection
    from rollq.ops.status import render_text, snapshot

    if as_json and prometheus:
        raise click.UsageError("--json and --prometheus are two output formats: pick one")
    if watch:
        # Each refresh's replies within a few seconds and no retries, as /metrics: a Redis that stalls mid-run (its
        # process stopped, reads never answered) held the watch for the 30 s socket timeout, twice, saying nothing.
        connection, keys = scrape_connection(context.redis_url(ctx)), Keys(context.namespace(ctx))
    else:
        producer = context.producer(ctx)
        connection, keys = producer.connection, producer.keys
    hint = namespace_hint(connection, keys)
    if hint:
        click.echo(f"rollq: {hint}", err=True)
    silent_since: str | None = None  # when the refresh that Redis did not answer began (local time)
    try:
        while True:
            began = time.strftime("%H:%M:%S")
            try:
                s = snapshot(connection, keys, retained=not prometheus)
            except REDIS_UNAVAILABLE as exc:
                if not watch:
                    raise
                silent_since = silent_since or began
                click.clear()
                click.echo(
                    f"rollq: Redis not answering since {silent_since} ({describe(exc)}); trying again every {watch:g}s",
                    err=True,
                )
            else:
                silent_since = None
                text = (
                    json.dumps(s.to_dict(), indent=2)
                    if as_json
                    else render_prometheus(s)
                    if prometheus
                    else render_text(s)
                )
                if watch:
                    click.clear()
                click.echo(text.rstrip("\n"))
                if not watch:
                    return
            time.sleep(watch)
    except KeyboardInterrupt:  # Ctrl+C ends a watch, during a refresh as between two
        return
