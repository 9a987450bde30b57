"""``rollq rollouts``: print a finished task's rollout, or follow the results stream."""

from __future__ import annotations

from typing import Any

import click

from rollq.store.keys import StreamField
from rollq.store.payloads import load_payloads, missing_payload

from . import context
from .errors import one_line_errors


@click.group()
def rollouts() -> None:
    """Read finished rollouts."""


@rollouts.command("get")
@click.argument("rollout_id")
@click.pass_context
@one_line_errors
def rollouts_get(ctx: click.Context, rollout_id: str) -> None:
    """Print the final rollout of a finished task as JSON."""
    from rollq.ops.lookup import final_rollout

    click.echo(final_rollout(context.producer(ctx), rollout_id).model_dump_json(indent=2))


@rollouts.command("tail")
@click.option(
    "--group",
    default=None,
    help="Read as a member of this consumer group (acknowledged, shared); default: just follow the stream.",
)
@click.option("--from-start", is_flag=True, help="Start at the oldest entry instead of new ones.")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after this many rollouts.")
@click.pass_context
@one_line_errors
def rollouts_tail(ctx: click.Context, group: str | None, from_start: bool, count: int | None) -> None:
    """Print finished rollouts as JSON lines as they arrive, until Ctrl+C."""
    producer = context.producer(ctx)
    try:
        if group:
            # With --count the reader takes no more entries than it prints: the rest stay with the group.
            for rollout in producer.rollouts(group, start="0" if from_start else "$", limit=count or None):
                click.echo(rollout.model_dump_json())
            return
        cursor = "0-0" if from_start else "$"
        seen = 0
        while True:
            reply: Any = producer.connection.xread({producer.keys.results: cursor}, count=100, block=1000)
            for _, entries in reply or []:
                load_payloads(producer.connection, [fields for _, fields in entries])
                for entry_id, fields in entries:
                    cursor = entry_id
                    if missing_payload(fields) is not None:
                        continue  # trimmed before it was read
                    try:
                        rollout = fields[StreamField.ROLLOUT.encode()].decode()
                    except (KeyError, UnicodeDecodeError):
                        continue  # an entry rollq did not write (found by an outside audit to stop the tail)
                    click.echo(rollout)
                    seen += 1
                    if count and seen >= count:
                        return
    except KeyboardInterrupt:
        return
