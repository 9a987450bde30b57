"""``rollq resources``: publish a resources version, print one, list the kept ones."""

from __future__ import annotations

import json
from typing import IO

import click

from . import context
from .errors import one_line_errors


@click.group()
def resources() -> None:
    """Publish and inspect resources versions."""


@resources.command("set")
@click.argument("source", type=click.File("r"), default="-")
@click.pass_context
@one_line_errors
def resources_set(ctx: click.Context, source: IO[str]) -> None:
    """Publish a new version from JSON: {"name": {"resource_type": "llm", ...}, ...} (or what `resources get`
    printed). Prints its id."""
    try:
        named = json.load(source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"resources are not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    if isinstance(named, dict) and set(named) == {"resources_id", "resources"}:
        named = named["resources"]  # what `rollq resources get` printed: its resources become a new version
    if not isinstance(named, dict):
        raise ValueError(
            "resources must be a JSON object of name -> resource, "
            f'e.g. {{"main_llm": {{"resource_type": "llm", ...}}}}; got a JSON {type(named).__name__}'
        )
    click.echo(context.producer(ctx).update_resources(named))


@resources.command("get")
@click.argument("resources_id", required=False)
@click.pass_context
@one_line_errors
def resources_get(ctx: click.Context, resources_id: str | None) -> None:
    """Print a version as JSON (the latest without an id)."""
    click.echo(context.producer(ctx).get_resources(resources_id).model_dump_json(indent=2))


@resources.command("list")
@click.pass_context
@one_line_errors
def resources_list(ctx: click.Context) -> None:
    """List the kept versions, oldest first; the latest is marked with *."""
    store = context.producer(ctx).resources
    latest = store.latest_id()
    for version in store.versions():
        click.echo(f"{version}{' *' if version == latest else ''}")
