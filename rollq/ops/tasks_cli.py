"""``rollq tasks``: list tasks by state and mode, cancel tasks (``rollq task ID`` shows one, ``rollq rollouts get``
prints its rollout)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import click

from rollq.producer import Producer


def _run(ctx: click.Context, action: Callable[[Producer], None]) -> None:
    # The CLI's helpers, looked up when a command runs: cli.py imports this module at its end.
    from rollq.ops import cli

    cli._one_line_errors(lambda: action(cli._producer(ctx)))()


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


@click.group()
def tasks() -> None:
    """List tasks by state and mode; cancel unfinished tasks."""


@tasks.command("list")
@click.option("--state", type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled"]))
@click.option("--mode", type=click.Choice(["train", "val", "test"]))
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--cursor", default=None, help="The cursor a previous page printed last.")
@click.pass_context
def tasks_list(ctx: click.Context, state: str | None, mode: str | None, limit: int, cursor: str | None) -> None:
    """Tasks by state and mode, one JSON line each (SCAN paging: a full walk costs O(keys in the database))."""

    def action(producer: Producer) -> None:
        page = producer.query_tasks(state=state, mode=mode, limit=limit, cursor=cursor)
        for info in page.tasks:
            click.echo(json.dumps(_plain(info)))
        if page.cursor is not None:
            click.echo(f"more: rollq tasks list --cursor {page.cursor}", err=True)

    _run(ctx, action)


@tasks.command("cancel")
@click.argument("rollout_ids", nargs=-1, required=True)
@click.pass_context
def tasks_cancel(ctx: click.Context, rollout_ids: tuple[str, ...]) -> None:
    """Cancel unfinished tasks; prints what happened to each (cancelled, finished, unknown)."""

    def action(producer: Producer) -> None:
        for result in producer.cancel(list(rollout_ids)):
            was = f" (was {result.state})" if result.state else ""
            click.echo(f"{result.rollout_id}: {result.outcome}{was}")

    _run(ctx, action)
