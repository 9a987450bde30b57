"""``rollq task ID`` shows one task; ``rollq tasks`` lists tasks by state and mode and cancels them."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import click

from rollq.models.policy import TaskState
from rollq.store.control import CancelOutcome

from . import context
from .errors import EXIT_FAILED, one_line_errors


@click.command()
@click.argument("rollout_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@one_line_errors
def task(ctx: click.Context, rollout_id: str, as_json: bool) -> None:
    """Show one task: state, attempts, worker, times, policy, and the error if it failed."""
    from rollq.ops.lookup import task_view

    view = task_view(context.producer(ctx), rollout_id)
    click.echo(json.dumps(view.to_dict(), indent=2) if as_json else view.render())


@click.group()
def tasks() -> None:
    """List tasks by state and mode; cancel unfinished tasks."""


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


@tasks.command("list")
@click.option("--state", type=click.Choice([state.value for state in TaskState]))
@click.option("--mode", type=click.Choice(["train", "val", "test"]))
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--cursor", default=None, help="The cursor a previous page printed last.")
@click.pass_context
@one_line_errors
def tasks_list(ctx: click.Context, state: str | None, mode: str | None, limit: int, cursor: str | None) -> None:
    """Tasks by state and mode, one JSON line each (SCAN paging: a full walk costs O(keys in the database)); a record
    that is not what rollq wrote is listed with state "invalid" and why."""
    page = context.producer(ctx).query_tasks(state=state, mode=mode, limit=limit, cursor=cursor)
    for info in page.tasks:
        click.echo(json.dumps(_plain(info)))
    for rollout_id, why in page.invalid.items():
        click.echo(json.dumps({"rollout_id": rollout_id, "state": "invalid", "error": why}))
    if page.cursor is not None:
        click.echo(f"more: rollq tasks list --cursor {page.cursor}", err=True)


@tasks.command("cancel")
@click.argument("rollout_ids", nargs=-1, required=True)
@click.pass_context
@one_line_errors
def tasks_cancel(ctx: click.Context, rollout_ids: tuple[str, ...]) -> None:
    """Cancel unfinished tasks; prints what happened to each (cancelled, finished, unknown). Exit 1 if any id
    is unknown (the others are cancelled all the same)."""
    unknown = []
    for result in context.producer(ctx).cancel(list(rollout_ids)):
        was = f" (was {result.state})" if result.state else ""
        click.echo(f"{result.rollout_id}: {result.outcome}{was}")
        if result.outcome == CancelOutcome.UNKNOWN:
            unknown.append(result.rollout_id)
    if unknown:
        named = ", ".join(repr(rid) for rid in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        click.echo(f"rollq: no task {named} ({len(unknown)} of {len(rollout_ids)} id(s) unknown)", err=True)
        sys.exit(EXIT_FAILED)
