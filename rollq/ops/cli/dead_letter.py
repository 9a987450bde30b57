"""``rollq dead-letter``: list the tasks that failed for good, and queue them again."""

from __future__ import annotations

import json
import sys

import click

from . import context
from .errors import EXIT_FAILED, one_line_errors


@click.group("dead-letter")
def dead_letter() -> None:
    """Tasks that failed for good."""


@dead_letter.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@one_line_errors
def dead_letter_list(ctx: click.Context, as_json: bool) -> None:
    """Print the dead-lettered tasks, oldest first: rollout id, attempts, error type and message."""
    from rollq.ops.lookup import failures

    for failure in failures(context.producer(ctx)):
        if as_json:
            click.echo(json.dumps(failure.to_dict()))
        else:
            click.echo(
                f"{failure.rollout_id}\t{failure.attempts_used} attempt(s)\t{failure.error_type}: {failure.message}"
            )


@dead_letter.command("requeue")
@click.argument("rollout_ids", nargs=-1)
@click.option("--all", "requeue_all", is_flag=True, help="Requeue every dead-lettered task.")
@click.pass_context
@one_line_errors
def dead_letter_requeue(ctx: click.Context, rollout_ids: tuple[str, ...], requeue_all: bool) -> None:
    """Queue dead-lettered tasks again with a fresh attempt budget."""
    if not rollout_ids and not requeue_all:
        raise click.UsageError("name rollout ids or pass --all")
    if rollout_ids and requeue_all:
        raise click.UsageError("name rollout ids or pass --all, not both")
    producer = context.producer(ctx)
    ids = producer.dead_letter() if requeue_all else list(rollout_ids)
    done = producer.requeue_dead(ids)
    click.echo(f"requeued {len(done)} task(s)")
    left = set(ids) - set(done)
    if not left:
        return
    dead = set(producer.dead_letter())
    missing, invalid = sorted(left - dead), sorted(left & dead)
    if invalid:
        click.echo(f"still dead-lettered, not requeued (see the errors above): {', '.join(invalid)}", err=True)
    if missing:
        click.echo(f"not in the dead-letter list: {', '.join(missing)}", err=True)
    sys.exit(EXIT_FAILED)
