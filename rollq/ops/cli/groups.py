"""``rollq groups``: the results stream's consumer groups: list them, delete one, set the idle bound."""

from __future__ import annotations

import json

import click

from rollq.models.click_types import Seconds
from rollq.store.consumer_groups import delete_group, idle_after, list_groups, set_idle_after

from . import context
from .errors import one_line_errors


@click.group()
def groups() -> None:
    """Consumer groups of the results stream (readers of `rollq rollouts tail --group`, Producer.rollouts)."""


@groups.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@one_line_errors
def groups_list(ctx: click.Context, as_json: bool) -> None:
    """List the groups: consumers, lag, pending, idle time; idle ones no longer hold back trimming."""
    producer = context.producer(ctx)
    found = list_groups(producer.connection, producer.keys)
    bound = idle_after(producer.connection, producer.keys)
    if as_json:
        click.echo(json.dumps({"idle_after_seconds": bound, "groups": [g.to_dict() for g in found]}))
        return
    if not found:
        click.echo(f"no consumer groups in namespace {producer.namespace!r}")
        return
    for g in found:
        idle = "-" if g.idle_seconds is None else f"{g.idle_seconds:.0f}s"
        state = "IDLE (holds nothing back)" if g.idle else "active"
        lost = f", lost {g.lost} from {g.lost_from}" if g.lost else ""
        click.echo(f"{g.name}: {state}, {g.consumers} consumer(s), lag {g.lag}, pending {g.pending}, idle {idle}{lost}")
    click.echo(f"(a group idle for over {bound:.0f}s no longer holds back trimming)")


@groups.command("delete")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
@one_line_errors
def groups_delete(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Delete consumer groups (their readers, if any come back, start over from new entries)."""
    producer = context.producer(ctx)
    missing = [n for n in names if not delete_group(producer.connection, producer.keys, n)]
    for name in names:
        if name not in missing:
            click.echo(f"deleted {name}")
    if missing:
        raise click.ClickException(f"no consumer group {', '.join(map(repr, missing))} in {producer.namespace!r}")


@groups.command("idle-after")
@click.argument("seconds", type=Seconds(), required=False)
@click.option("--default", "use_default", is_flag=True, help="Go back to the default bound.")
@click.pass_context
@one_line_errors
def groups_idle_after(ctx: click.Context, seconds: float | None, use_default: bool) -> None:
    """Show or set how long a group may be idle before it stops holding back trimming."""
    producer = context.producer(ctx)
    if use_default or seconds is not None:
        set_idle_after(producer.connection, producer.keys, None if use_default else seconds)
    click.echo(f"{idle_after(producer.connection, producer.keys):g}")
