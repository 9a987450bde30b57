"""``rollq worker``: start a RolloutWorker on the namespace's queue, as ``rq worker`` would."""

from __future__ import annotations

import sys
from typing import Any

import click

from rollq.models.click_types import Seconds
from rollq.store.connection import connect, describe, wait_until_reachable
from rollq.worker import logs

from . import context
from .errors import one_line_errors


@click.command()
@click.option("--agent", envvar="ROLLQ_AGENT", metavar="MODULE:CLASS", help="The LitAgent to run [env: ROLLQ_AGENT].")
@click.option(
    "--hook",
    "hooks",
    multiple=True,
    metavar="MODULE:CLASS",
    help="A Hook to run around each rollout; repeatable [env: ROLLQ_HOOKS, comma-separated].",
)
@click.option(
    "--concurrency",
    "-c",
    type=int,
    default=None,
    help="Rollouts in flight at once [env: ROLLQ_CONCURRENCY; default 1].",
)
@click.option(
    "--grace-seconds",
    type=Seconds(),
    default=None,
    help="On SIGTERM, how long running rollouts may finish [default 30].",
)
@click.option(
    "--heartbeat-seconds", type=Seconds(min_open=True), default=None, help="Heartbeat and reaper interval [default 5]."
)
@click.option(
    "--results-maxlen", type=int, default=None, help="Approximate bound of the results stream [default 100000]."
)
@click.option(
    "--results-max-bytes", type=int, default=None, help="Hard byte limit of the results stream [default 1 GiB]."
)
@click.option("--max-result-bytes", type=int, default=None, help="Largest rollout JSON published [default 8 MiB].")
@click.option(
    "--rollout-trace",
    type=click.Choice(["all", "failed", "none"]),
    default=None,
    help="Which published rollouts keep their trace [env: ROLLQ_ROLLOUT_TRACE; default all].",
)
@click.option("--burst", is_flag=True, help="Quit once the queue is empty.")
@click.option("--name", default=None, help="Worker name (default: RQ's random one).")
@click.option("--worker-ttl", type=int, default=None, help="RQ worker TTL in seconds.")
@click.option("--logging-level", default="INFO", show_default=True)
@click.option(
    "--path",
    "paths",
    multiple=True,
    metavar="DIR",
    help="Also import from DIR (repeatable); the current directory always is, as with rq worker.",
)
@click.pass_context
@one_line_errors
def worker(
    ctx: click.Context,
    agent: str | None,
    hooks: tuple[str, ...],
    concurrency: int | None,
    grace_seconds: float | None,
    heartbeat_seconds: float | None,
    results_maxlen: int | None,
    results_max_bytes: int | None,
    max_result_bytes: int | None,
    rollout_trace: str | None,
    burst: bool,
    name: str | None,
    worker_ttl: int | None,
    logging_level: str,
    paths: tuple[str, ...],
) -> None:
    """Start a worker: the same as `rq worker -w rollq.worker.RolloutWorker --url URL NAMESPACE`."""
    from rollq.worker import RolloutWorker, WorkerSettings

    # `rq worker` imports jobs from the current directory; so does this, for --agent and --hook.
    for directory in reversed(("", *paths)):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    settings = WorkerSettings.from_env(
        log_format=ctx.find_root().params["log_format"],
        agent=agent,
        hooks=hooks or None,
        concurrency=concurrency,
        grace_seconds=grace_seconds,
        heartbeat_seconds=heartbeat_seconds,
        results_maxlen=results_maxlen,
        results_max_bytes=results_max_bytes,
        max_result_bytes=max_result_bytes,
        rollout_trace=rollout_trace,
    )
    logs.configure(logging_level, settings.log_format)
    # A worker started before its Redis (or during a failover) waits for it, bounded and logged.
    url = wait_until_reachable(ctx.find_root().params["url"], seconds=settings.redis_wait_seconds, what="worker")
    context.log.info("Redis at %s", describe(url))
    context.refuse_or_warn_memory(ctx, url)
    kwargs: dict[str, Any] = {"name": name} if name else {}
    if worker_ttl:
        kwargs["worker_ttl"] = worker_ttl
    try:
        # --url (or its env) already decided the Redis; RolloutWorker's ROLLQ_REDIS_URL check is for stock rq worker.
        w = RolloutWorker(
            [context.namespace(ctx)], connection=connect(url), settings=settings, honour_rollq_url=False, **kwargs
        )
    except TypeError as exc:  # --agent names something that is not a LitAgent
        raise ValueError(str(exc)) from exc
    w.work(burst=burst, logging_level=logging_level)
