"""The command-line options both gateways (``rollq serve-al``, ``rollq serve-agl``) share: how many unfinished
attempts one client may hold, how often an attempt whose lease ended is handed back free, how large a body may be."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])


def client_limits(*, unfinished: str, past_the_limit: str, what: str) -> Callable[[F], F]:
    """``--max-held``, ``--max-releases`` and ``--max-body-bytes``, worded for the gateway: ``unfinished`` names
    an attempt a client holds ("Unposted"), ``past_the_limit`` what its next request gets ("its polls get no
    task"), ``what`` what a lease hands back ("task")."""

    def apply(command: F) -> F:
        options = [
            click.option(
                "--max-held",
                "max_held_per_client",
                default=256,
                show_default=True,
                type=click.IntRange(min=1),
                help=f"{unfinished} attempts one client address may hold; past that {past_the_limit}.",
            ),
            click.option(
                "--max-releases",
                default=3,
                show_default=True,
                type=click.IntRange(min=0),
                help=f"Times a {what} whose lease ended is handed back without charging its attempt.",
            ),
            click.option(
                "--max-body-bytes",
                default=None,
                type=click.IntRange(min=1024),
                help="Largest request body accepted (413 past it) [default: ROLLQ_MAX_RESULT_BYTES + 64 KiB].",
            ),
        ]
        for option in reversed(options):
            command = option(command)
        return command

    return apply
