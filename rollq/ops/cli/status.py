"""``rollq status``: the namespace at a glance, as text, JSON or Prometheus text, once or every few seconds."""

from __future__ import annotations

import json
import time

import click

from rollq.models.click_types import Seconds
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
    help="Refresh every SECONDS until Ctrl+C.",
)
@click.pass_context
@one_line_errors
def status(ctx: click.Context, as_json: bool, prometheus: bool, watch: float | None) -> None:
    """Queued, in flight by worker, finished, failed, dead-letter, stale attempts, stream lag, resources."""
    from rollq.ops.metrics import render_prometheus
    from rollq.ops.status import render_text, snapshot

    if as_json and prometheus:
        raise click.UsageError("--json and --prometheus are two output formats: pick one")
    producer = context.producer(ctx)
    hint = namespace_hint(producer.connection, producer.keys)
    if hint:
        click.echo(f"rollq: {hint}", err=True)
    while True:
        s = snapshot(producer.connection, producer.keys, retained=not prometheus)
        text = json.dumps(s.to_dict(), indent=2) if as_json else render_prometheus(s) if prometheus else render_text(s)
        if watch:
            click.clear()
        click.echo(text.rstrip("\n"))
        if not watch:
            return
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return
