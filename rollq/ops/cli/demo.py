"""``rollq demo``: the sample agent end to end, on an embedded Redis unless a URL is given."""

from __future__ import annotations

import click

from rollq.models.click_types import Seconds
from rollq.models.policy import MAX_POLICY_SECONDS
from rollq.store.connection import check_reachable

from . import context
from .errors import one_line_errors


@click.command()
@click.option(
    "--redis-url", default=None, metavar="URL", hidden=True, help="Same as the global --url (older spelling)."
)
@click.option("--tasks", default=300, show_default=True, type=click.IntRange(min=1), help="Tasks to queue.")
@click.option(
    "--workers", default=3, show_default=True, type=click.IntRange(min=1, max=64), help="Worker processes to start."
)
@click.option(
    "--concurrency", default=16, show_default=True, type=click.IntRange(min=1), help="Rollouts in flight per worker."
)
@click.option(
    "--timeout",
    default=300.0,
    show_default=True,
    type=Seconds(0, MAX_POLICY_SECONDS, min_open=True),
    help="Seconds to wait for every rollout.",
)
@click.pass_context
@one_line_errors
def demo(ctx: click.Context, redis_url: str | None, tasks: int, workers: int, concurrency: int, timeout: float) -> None:
    """Run the sample agent end to end and print a summary.

    With no URL at all (or --url memory://) it starts an embedded fake Redis
    and says so; with --url (or ROLLQ_REDIS_URL) it runs on that Redis, in the
    namespace rollq-demo, or the one -n names on the command line (ROLLQ_NAMESPACE
    is not taken: the demo stays out of a namespace you work in unless you say so).
    """
    from rollq.ops.demo import run_demo

    url = redis_url or ctx.find_root().params["url"]
    if url and not url.startswith("memory:"):
        url = context.redis_url(ctx) if not redis_url else check_reachable(redis_url)
    else:
        url = None
    root = ctx.find_root()
    given = root.get_parameter_source("namespace") is click.core.ParameterSource.COMMANDLINE
    summary = run_demo(
        url,
        tasks=tasks,
        workers=workers,
        concurrency=concurrency,
        timeout=timeout,
        echo=click.echo,
        **({"namespace": root.params["namespace"]} if given else {}),
    )
    click.echo(summary.render())
